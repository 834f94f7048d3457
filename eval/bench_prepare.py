"""Benchmark ``adaponder.data.prepare``: 1 vs 2 tokenization processes, plus an exactness check.

Prepares the 54 Project Gutenberg books of the offline data pack (``--inputs``, default
``$ADAPONDER_SHARED_DATA/corpus/gutenberg``) with the bundled Pythia tokenizer, once with ``num_workers=1`` and once
with ``num_workers=2``, prints tokens/s for each and the speed-up, and checks that

- both runs wrote byte-identical shards, and
- the token count equals tokenizing every document directly (``len(tok.encode(doc)) + 1`` EOD each).

Usage: ``python eval/bench_prepare.py [--inputs PATH ...] [--workers 1 2] [--no-check]``.
Exit status 1 if the exactness check fails. Not a timed test: timings depend on the machine, and on a
machine shared with other work they mean little (the script reports CPU seconds and effective cores too).
"""

from __future__ import annotations

import argparse
import filecmp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

# Process-level parallelism only: keep HF tokenizers from adding its own threads, for a fair comparison.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from adaponder.data.prepare import prepare  # noqa: E402
from adaponder.data.tokenizer import load_tokenizer  # noqa: E402

# No default outside the checkout: the data pack's location comes from the environment (or --inputs).
DEFAULT_INPUT = (Path(os.environ["ADAPONDER_SHARED_DATA"]) / "corpus" / "gutenberg"
                 if os.environ.get("ADAPONDER_SHARED_DATA") else None)


def direct_token_count(inputs: list[str]) -> tuple[int, int, float]:
    """(documents, tokens incl. one EOD per document, seconds), encoding each plain-text file on its own.

    Independent of the prepare code path: read the bytes, decode UTF-8, drop a leading BOM, encode.
    """
    tok = load_tokenizer()
    files = sorted(
        f for i in inputs for f in ([Path(i)] if Path(i).is_file() else Path(i).rglob("*.txt"))
    )
    docs = tokens = 0
    t0 = time.perf_counter()
    for f in files:
        text = f.read_bytes().decode("utf-8").removeprefix("\ufeff")
        tokens += len(tok.encode(text)) + 1
        docs += 1
    return docs, tokens, time.perf_counter() - t0


def cpu_seconds() -> float:
    """CPU time of this process plus its reaped children (fork-started pool workers are reaped on exit)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def machine_busy_fraction(seconds: float = 1.0) -> float:
    """Fraction of all CPUs busy right now (before we start): other people's work skews wall times."""
    def snap() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]

    (t0, i0), _ = snap(), time.sleep(seconds)
    t1, i1 = snap()
    return 1 - (i1 - i0) / max(1, t1 - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", nargs="+", default=[str(DEFAULT_INPUT)] if DEFAULT_INPUT else None,
                    required=DEFAULT_INPUT is None,
                    help="the corpus (default: $ADAPONDER_SHARED_DATA/corpus/gutenberg)")
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=2, help="runs per setting (alternating); best wall time counts")
    ap.add_argument("--no-check", action="store_true", help="skip the direct-tokenization exactness check")
    args = ap.parse_args()

    print(f"inputs: {', '.join(args.inputs)}  (cpus available: {len(os.sched_getaffinity(0))})")
    if os.path.exists("/proc/stat"):
        busy = machine_busy_fraction()
        print(f"CPUs already busy before starting: {busy:.0%}")
        if busy > 0.2:
            # With kernel autogroup scheduling every session gets an equal CPU share however many processes it
            # runs, so on a shared machine the 2-worker run cannot get more CPU than the 1-worker run.
            print("  WARNING: other load; the wall-clock speed-up only means something on idle CPUs. Compare the "
                  "'effective cores' (CPU s / wall s) of the runs: equal values mean both were capped by others.")
    load_tokenizer()  # warm the cache so both runs pay the same
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench_prepare_") as tmp:
        results: dict[int, tuple[dict, float, Path]] = {}
        for rep in range(args.repeats):  # alternate settings so a burst of other load hits both alike
            for w in args.workers:
                out = Path(tmp) / f"w{w}-r{rep}"
                t0, c0 = time.perf_counter(), cpu_seconds()
                meta = prepare(args.inputs, out, num_workers=w, progress=False)
                wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
                print(
                    f"num_workers={w} (run {rep + 1}): {meta['documents']} documents, {meta['tokens']:,} tokens, "
                    f"wall {wall:.2f} s -> {meta['tokens'] / wall:,.0f} tokens/s "
                    f"(tokenize phase {meta['timing']['tokens_per_second']:,.0f} tokens/s); "
                    f"CPU {cpu:.1f} s = {cpu / wall:.2f} effective cores, {meta['tokens'] / cpu:,.0f} tokens/CPU-s"
                )
                if w not in results or wall < results[w][1]:
                    results[w] = (meta, wall, out)
        for w in args.workers:
            meta, wall, _ = results[w]
            print(f"best num_workers={w}: {meta['tokens'] / wall:,.0f} tokens/s (wall {wall:.2f} s)")
        base = args.workers[0]
        for w in args.workers[1:]:
            ratio = results[base][1] / results[w][1]
            print(f"speed-up {w} vs {base} worker(s): {ratio:.2f}x")
            meta_a, meta_b = results[base][0], results[w][0]
            for split in ("train", "val"):
                for sa, sb in zip(meta_a["splits"][split]["shards"], meta_b["splits"][split]["shards"]):
                    same = filecmp.cmp(results[base][2] / sa["file"], results[w][2] / sb["file"], shallow=False)
                    ok &= same
                    if not same:
                        print(f"MISMATCH: {sa['file']} differs between {base} and {w} workers")
        if not args.no_check:
            docs, tokens, secs = direct_token_count(args.inputs)
            meta = results[base][0]
            match = docs == meta["documents"] and tokens == meta["tokens"]
            ok &= match
            print(
                f"direct tokenization: {docs} documents, {tokens:,} tokens (incl. {docs} EOD) in {secs:.2f} s "
                f"-> {'EXACT MATCH' if match else 'MISMATCH'} with prepared {meta['tokens']:,}"
            )
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
