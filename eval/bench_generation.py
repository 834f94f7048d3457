"""Every decoding strategy through the one entry, side by side: ``model.generate(ids, decoding=DecodingConfig(...))``.

For each model (a checkpoint, or a shape with random weights) and batch size it runs every combination the support
table (``adaponder.generation.support``) says the model takes for greedy, unpadded prompts — token by token eager
(transformers' ``generate``, the reference) and compiled, with a draft eager and compiled, depth-batched, pipelined —
and prints tokens/s, the ratio to eager and to compiled token-by-token decoding, the mean exit pass and whether the
tokens equal the reference's. The first call of each strategy (which compiles) is not timed; times are the median of
``--repeats``. A strategy added to the table is measured here without a change to this script.

    python eval/bench_generation.py --shapes study:ponderlm,study:adaponder --batches 1,8
    python eval/bench_generation.py --checkpoint runs/demo/final --new-tokens 64
    python eval/bench_generation.py --shapes tiny:ponderlm --context 16 --new-tokens 4 --repeats 1   # smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from adaponder.generation import DecodingConfig, SpeculativeConfig  # noqa: E402
from adaponder.generation.support import Combination, refusal  # noqa: E402
from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM, pythia_config  # noqa: E402
from eval.bench_compiled import STUDY_SHAPE  # noqa: E402
from eval.bench_inference import DTYPES, _sync  # noqa: E402

STRATEGIES = [("token", False, False), ("token", False, True), ("token", True, False), ("token", True, True),
              ("depth", False, False), ("pipelined", False, False)]


def build(spec: str, device: str, dtype: torch.dtype) -> tuple[str, AdaPonderForCausalLM]:
    """``SHAPE:MODE`` (shape: ``study`` or a Pythia preset) with random weights, or a checkpoint folder."""
    if Path(spec).is_dir():
        return spec, AdaPonderForCausalLM.from_pretrained(spec).eval().to(device=device, dtype=dtype)
    shape, _, mode = spec.partition(":")
    torch.manual_seed(0)
    cfg = AdaPonderConfig(mode=mode or "adaponder", **STUDY_SHAPE) if shape == "study" else \
        pythia_config(shape, mode or "adaponder")
    return spec, AdaPonderForCausalLM(cfg).eval().to(device=device, dtype=dtype)


def strategies(model, gamma: int):
    """(label, DecodingConfig) for every greedy, unpadded combination the model's mode takes."""
    for schedule, draft, compiled in STRATEGIES:
        if refusal(Combination(model.config.mode, schedule, draft, compiled)) is not None:
            continue
        if draft and model.config.num_passes < 2:
            continue
        label = schedule + (f"+draft γ={gamma}" if draft else "") + (" compiled" if compiled else "")
        yield label, DecodingConfig(schedule, SpeculativeConfig(1, gamma) if draft else None, compiled)


def measure(model, prompt, new: int, decoding: DecodingConfig, repeats: int, device: torch.device):
    run = lambda: model.generate(prompt, max_new_tokens=new, decoding=decoding, pad_token_id=0)  # noqa: E731
    out = run()  # the first call: compiles where it compiles, untimed
    times = []
    for _ in range(repeats):
        _sync(device)
        started = time.perf_counter()
        out = run()
        _sync(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times), out


def bench(spec: str, args, device: torch.device, dtype: torch.dtype) -> list[dict]:
    name, model = build(spec, str(device), dtype)
    rows = []
    for batch in args.batches:
        prompt = torch.randint(1, model.config.vocab_size, (batch, args.context),
                               generator=torch.Generator().manual_seed(1)).to(device)
        results = {label: measure(model, prompt, args.new_tokens, decoding, args.repeats, device)
                   for label, decoding in strategies(model, args.gamma)}
        eager, _ = results["token"]
        compiled = results.get("token compiled", (None, None))[0]
        reference = results["token"][1].sequences
        for label, (seconds, out) in results.items():
            made = out.new_tokens.sum().item()
            rows.append(dict(model=name, batch=batch, strategy=label, tok_s=made / seconds,
                             over_eager=eager / seconds, over_compiled=compiled / seconds if compiled else None,
                             mean_exit=float(out.exit_pass[out.exit_pass > 0].float().mean()),
                             same_tokens=bool(torch.equal(out.sequences, reference))))
            r = rows[-1]
            print(f"{name:<28} {batch:>5} {label:<28} {r['tok_s']:>9.1f} {r['over_eager']:>8.2f} "
                  f"{r['over_compiled'] if r['over_compiled'] is not None else float('nan'):>8.2f} "
                  f"{r['mean_exit']:>6.2f} {'yes' if r['same_tokens'] else 'NO':>5}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", nargs="*", default=[], help="checkpoint folders")
    ap.add_argument("--shapes", default="", help="SHAPE:MODE,... with random weights (SHAPE: study or a Pythia "
                                                 "preset; e.g. study:ponderlm,tiny:adaponder)")
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1])
    ap.add_argument("--context", type=int, default=64, help="prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=4, help="draft tokens per cycle of the draft rows")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    bad = [f"--{k.replace('_', '-')} must be >= 1, got {getattr(args, k)}" for k in ("context", "new_tokens",
                                                                                        "gamma", "repeats")
           if getattr(args, k) < 1] + [f"--batches must be >= 1, got {b}" for b in args.batches if b < 1]
    if bad:
        ap.error("; ".join(bad))
    specs = args.checkpoint + [s for s in args.shapes.split(",") if s]
    if not specs:
        ap.error("give --checkpoint and/or --shapes")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"decoding strategies through generate(decoding=...): {torch.get_num_threads()} threads, {args.device}, "
          f"{args.dtype}, context {args.context}, {args.new_tokens} new tokens, median of {args.repeats}")
    print(f"{'model':<28} {'batch':>5} {'strategy':<28} {'tok/s':>9} {'×eager':>8} {'×compl':>8} {'exit':>6} "
          f"{'same':>5}")
    rows = [r for spec in specs for r in bench(spec, args, device, DTYPES[args.dtype])]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["same_tokens"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
