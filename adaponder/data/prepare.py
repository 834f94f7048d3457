"""Tokenize raw text once into memory-mappable token shards: ``prepare()``, run by ``adaponder-prepare``.

Pipeline:

1. resolve inputs (files, folders, globs, saved datasets; see :mod:`adaponder.data.sources`);
2. stream documents in input order, tokenize them in ``num_workers`` processes (order preserved, at most a
   few batches in flight so memory stays bounded), append the EOD token after every document, and write one
   temporary token stream plus per-document lengths;
3. choose the validation documents (document-level, by ``seed``), copy each split into
   ``{split}-NNNNN.bin`` shards, write ``meta.json`` last;
4. rename the finished temporary folder to ``output_dir``.

Everything is written under ``.<output_dir name>.tmp-*`` next to the output and only renamed into place when
complete, so an interrupted run never leaves a directory that looks prepared; the next run for the same output
removes the temporary folder a killed run left (its process gone). A second preparation into the same output
while one runs is refused (a lock file ``.<name>.lock`` beside it, :mod:`adaponder.run_lock`). Outputs depend
only on the inputs, tokenizer, ``val_fraction`` and ``seed`` — not on ``num_workers``.

Each document is tokenized whole, so the token count equals ``sum(len(tokenizer.encode(doc)))`` plus one
EOD per document.

Command line: ``adaponder-prepare`` (:mod:`adaponder.cli.prepare`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import multiprocessing as mp
import os
import re
import secrets
import shutil
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tqdm.auto import tqdm

from adaponder.run_lock import lock_beside, pid_alive
from adaponder.errors import os_reason

from .bpe import train_bpe
from .errors import DataError
from .in_use import refuse_if_read
from .layout import FORMAT, META_FILE, docs_name, dtype_for_vocab, read_meta, shard_name
from .sources import Source, SourceStats, iter_documents, resolve_inputs
from .tokenizer import Tokenizer, as_tokenizer, load_tokenizer

DEFAULT_SHARD_TOKENS = 1 << 30  # 2 GiB per uint16 shard
_BATCH_CHARS = 1 << 18  # documents per task: ~256K characters (a long book is one task of its own)
_BATCH_DOCS = 2048
_COPY_TOKENS = 1 << 24
TOKENIZER_FILE = "tokenizer.json"  # a trained tokenizer, saved next to the shards

# -- tokenization (runs in worker processes, or in-process for num_workers=1) -------------------------------
_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer: Tokenizer, dtype: str) -> None:
    # One thread per worker: the processes are the parallelism; rayon threads would oversubscribe the cores.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER["tokenizer"] = tokenizer
    _WORKER["dtype"] = np.dtype(dtype)


def _init_worker_inprocess(tokenizer: Tokenizer, dtype: np.dtype) -> None:
    # Same code path as the workers, but leaves the caller's TOKENIZERS_PARALLELISM alone.
    _WORKER["tokenizer"] = tokenizer
    _WORKER["dtype"] = dtype


def _tokenize_batch(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of ``texts`` with EOD after each document, and each document's length (EOD included)."""
    tok: Tokenizer = _WORKER["tokenizer"]
    ids = tok.encode_batch(texts)
    lengths = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
    out = np.empty(int(lengths.sum()), dtype=_WORKER["dtype"])
    pos = 0
    for x in ids:
        out[pos : pos + len(x)] = x
        pos += len(x)
        out[pos] = tok.eod_id
        pos += 1
    return out, lengths


def _batches(
    sources: Sequence[Source], text_field: str, errors: str, stats: list[SourceStats]
) -> Iterator[tuple[np.ndarray, list[str]]]:
    """(source index of each document, documents) in input order, ~_BATCH_CHARS of text per batch."""
    texts: list[str] = []
    owners: list[int] = []
    chars = 0
    for i, src in enumerate(sources):
        for text in iter_documents(src, text_field, errors, stats[i]):
            texts.append(text)
            owners.append(i)
            chars += len(text)
            if chars >= _BATCH_CHARS or len(texts) >= _BATCH_DOCS:
                yield np.asarray(owners, dtype=np.int64), texts
                texts, owners, chars = [], [], 0
    if texts:
        yield np.asarray(owners, dtype=np.int64), texts


def _make_pool(num_workers: int, tokenizer: Tokenizer, dtype: np.dtype) -> Any:
    # multiprocessing's default start method (fork on Linux up to Python 3.13, forkserver from 3.14, spawn on
    # macOS/Windows), so a caller's mp.set_start_method() is honoured; under spawn/forkserver, scripts need
    # the usual ``if __name__ == "__main__":`` guard. Created before any progress-bar thread exists.
    return mp.get_context().Pool(num_workers, initializer=_init_worker, initargs=(tokenizer, dtype.str))


def _tokenized(
    batches: Iterator[tuple[np.ndarray, list[str]]], tokenizer: Tokenizer, dtype: np.dtype, pool: Any, window: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(owners, tokens, lengths) per batch, in input order; in-process when ``pool`` is None."""
    if pool is None:
        _init_worker_inprocess(tokenizer, dtype)
        for owners, texts in batches:
            yield (owners, *_tokenize_batch(texts))
        return
    # Bounded read-ahead: memory stays O(window x batch) however large the corpus.
    pending: deque[tuple[np.ndarray, Any]] = deque()
    for owners, texts in batches:
        pending.append((owners, pool.apply_async(_tokenize_batch, (texts,))))
        if len(pending) >= window:
            owners0, res = pending.popleft()
            yield (owners0, *res.get())
    while pending:
        owners0, res = pending.popleft()
        yield (owners0, *res.get())


# -- writing --------------------------------------------------------------------------------------------
class _ShardWriter:
    """Appends tokens to ``{split}-NNNNN.bin`` files of at most ``shard_tokens`` tokens, hashing each."""

    def __init__(self, folder: Path, split: str, dtype: np.dtype, shard_tokens: int) -> None:
        self.folder, self.split, self.dtype, self.shard_tokens = folder, split, dtype, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self._f: BinaryIO | None = None
        self._sha = hashlib.sha256()
        self._n = 0

    def _roll(self) -> None:
        self._close_current()
        name = shard_name(self.split, len(self.shards))
        self._f = open(self.folder / name, "wb")
        self._sha = hashlib.sha256()
        self._n = 0
        self.shards.append({"file": name, "tokens": 0, "sha256": ""})

    def _close_current(self) -> None:
        if self._f is not None:
            self._f.close()
            self.shards[-1].update(tokens=self._n, sha256=self._sha.hexdigest())
            self._f = None

    def write(self, tokens: np.ndarray) -> None:
        pos = 0
        while pos < len(tokens):
            if self._f is None or self._n >= self.shard_tokens:
                self._roll()
            take = min(len(tokens) - pos, self.shard_tokens - self._n, _COPY_TOKENS)
            chunk = np.ascontiguousarray(tokens[pos : pos + take], dtype=self.dtype)
            buf = chunk.tobytes()
            self._f.write(buf)  # type: ignore[union-attr]
            self._sha.update(buf)
            self._n += take
            pos += take

    def close(self) -> list[dict[str, Any]]:
        self._close_current()
        return self.shards


def _choose_val_docs(n_docs: int, val_fraction: float, seed: int) -> np.ndarray:
    """Boolean mask of validation documents: round(val_fraction * n) of them, at least 1 when n >= 2 and
    val_fraction > 0, never all of them."""
    mask = np.zeros(n_docs, dtype=bool)
    if n_docs < 2 or val_fraction <= 0:
        return mask
    n_val = min(n_docs - 1, max(1, round(val_fraction * n_docs)))
    mask[np.random.default_rng(seed).choice(n_docs, size=n_val, replace=False)] = True
    return mask


def _write_splits(
    tmp: Path, stream_path: Path, lengths: np.ndarray, is_val: np.ndarray, dtype: np.dtype, shard_tokens: int
) -> dict[str, dict[str, Any]]:
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    stream = np.memmap(stream_path, dtype=dtype, mode="r") if starts[-1] else np.empty(0, dtype)
    splits: dict[str, dict[str, Any]] = {}
    for split, mask in (("train", ~is_val), ("val", is_val)):
        docs = np.flatnonzero(mask)
        writer = _ShardWriter(tmp, split, dtype, shard_tokens)
        if len(docs):
            # Copy runs of consecutive documents as single slices.
            for run in np.split(docs, np.flatnonzero(np.diff(docs) != 1) + 1):
                writer.write(stream[starts[run[0]] : starts[run[-1] + 1]])
        shards = writer.close()
        doc_starts = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(lengths[docs], out=doc_starts[1:])
        np.save(tmp / docs_name(split), doc_starts)
        splits[split] = {
            "documents": int(len(docs)),
            "tokens": int(doc_starts[-1]),
            "shards": shards,
            "docs_index": docs_name(split),
        }
    del stream
    return splits


def _check_output_dir(out: Path, overwrite: bool) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise DataError(f"output {out} exists and is not a folder")
    if not any(out.iterdir()):
        return
    if not overwrite:
        raise DataError(f"output folder {out} is not empty; pass overwrite=True (CLI: --overwrite) to replace it")
    if not (out / META_FILE).is_file():
        raise DataError(f"output folder {out} is not empty and holds no {META_FILE}; refusing to overwrite it")
    read_meta(out)  # only ever replace a folder this tool wrote
    refuse_if_read(out)  # nor one a live run is reading


def _remove_stale_temporaries(out: Path) -> None:
    """Remove what killed runs for ``out`` left beside it: ``.NAME.tmp-<pid>-<hex>`` folders whose process is gone
    (each as large as the token stream) and ``.NAME.old-<hex>`` folders (a replaced output not yet deleted). A
    temporary folder of a live process (a concurrent run on this machine) is left alone."""
    for path in out.parent.glob(f".{out.name}.*"):
        m = re.fullmatch(re.escape(f".{out.name}.") + r"(?:tmp-(\d+)-[0-9a-f]+|old-[0-9a-f]+)", path.name)
        if not m or not path.is_dir() or (m.group(1) and pid_alive(int(m.group(1)))):
            continue
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        shutil.rmtree(path, ignore_errors=True)
        print(f"removed {path} ({size:,} bytes), left by an interrupted adaponder-prepare", file=sys.stderr)


# errno values that say the output cannot be written (disk full, quota, file too large, read-only filesystem)
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _write_failure(err: BaseException, out: Path, tmp: Path) -> DataError | None:
    """One :class:`DataError` naming the output for an ``OSError`` of writing it (a full disk while the shards
    are written), after the temporary folder is gone; None for other errors (e.g. an unreadable input)."""
    if not isinstance(err, OSError):
        return None
    name = str(err.filename or "")
    if err.errno not in _WRITE_ERRNOS and not (name and name.startswith(str(tmp))):
        return None
    state = "untouched" if out.exists() else "not created"
    return DataError(f"could not write the prepared data {out} ({os_reason(err)}, while writing its temporary "
                     f"folder {tmp}); the temporary folder was removed and {out} is {state}")


def _move_into_place(tmp: Path, out: Path) -> None:
    if out.exists():
        trash = out.parent / f".{out.name}.old-{secrets.token_hex(4)}"
        out.rename(trash)
        tmp.rename(out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        tmp.rename(out)


def _train_tokenizer(sources: Sequence[Source], text_field: str, errors: str, val_fraction: float, seed: int,
                     vocab_size: int, folder: Path) -> Tokenizer:
    """Train BPE on the documents that will form the train split (the split depends only on the document
    count and ``seed``, so it is known before tokenization) and load it from ``folder/tokenizer.json``."""
    def documents() -> Iterator[str]:
        for src in sources:
            yield from iter_documents(src, text_field, errors, SourceStats())

    n_docs = sum(1 for _ in documents())
    is_val = _choose_val_docs(n_docs, val_fraction, seed)
    train_docs = (text for text, val in zip(documents(), is_val) if not val)
    path = train_bpe(train_docs, vocab_size, folder / TOKENIZER_FILE, num_texts=int((~is_val).sum()))
    tok = load_tokenizer(path)
    tok.name = f"byte-level BPE, {tok.vocab_size} entries, trained on the train split"
    return tok


# -- public entry point ---------------------------------------------------------------------------------
def prepare(
    inputs: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    tokenizer: Tokenizer | str | os.PathLike[str] | None = None,
    text_field: str = "text",
    val_fraction: float = 0.01,
    seed: int = 0,
    num_workers: int = 1,
    errors: str = "strict",
    progress: bool = True,
    *,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    overwrite: bool = False,
    train_tokenizer: int | None = None,
) -> dict[str, Any]:
    """Tokenize ``inputs`` into ``output_dir`` and return its metadata (also written to ``meta.json``).

    Args:
        inputs: files, folders, globs and saved HF datasets (see :mod:`adaponder.data.sources`).
        output_dir: created (or, with ``overwrite``, replaced) only once everything is written.
        tokenizer: a :class:`Tokenizer`, a tokenizer path, or None for the bundled Pythia tokenizer.
        text_field: JSONL key / parquet or dataset column holding the text.
        val_fraction: fraction of *documents* held out for ``val``; at least one when there are >= 2
            documents and ``val_fraction > 0``.
        seed: selects the validation documents.
        num_workers: tokenization processes; 1 tokenizes in-process, <= 0 uses every available CPU.
        errors: ``"strict"`` (invalid UTF-8 raises, naming file and byte offset) or ``"replace"`` (U+FFFD,
            counted per source and in total as ``replacements``).
        progress: show a tqdm progress bar (tokens, tokens/s) on stderr.
        shard_tokens: maximum tokens per shard file.
        overwrite: replace an existing prepared directory.
        train_tokenizer: train a byte-level BPE tokenizer with this many entries on the *training*
            documents only (the validation documents are chosen first, as below) and use it; it is saved as
            ``tokenizer.json`` in ``output_dir``, where the trainer and the export pick it up.

    Raises:
        DataError: with a message naming the offending input (see :mod:`adaponder.data.errors`).
    """
    _check_arguments(errors, val_fraction, shard_tokens, tokenizer, train_tokenizer)
    if num_workers <= 0:
        num_workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    t_start = time.perf_counter()
    sources = resolve_inputs(inputs if not isinstance(inputs, (str, os.PathLike)) else [inputs])
    out = Path(output_dir).expanduser().resolve()
    lock, tmp = _open_output(out, overwrite)
    try:
        if train_tokenizer is not None:
            tok = _train_tokenizer(sources, text_field, errors, val_fraction, seed, train_tokenizer, tmp)
        else:
            tok = as_tokenizer(tokenizer)
        dtype = dtype_for_vocab(tok.vocab_size)
        stream_path = tmp / "stream.tmp"
        tokenized = _tokenize_into(stream_path, sources, tok, dtype, num_workers, text_field, errors, progress)
        is_val = _choose_val_docs(len(tokenized.lengths), val_fraction, seed)
        splits = _write_splits(tmp, stream_path, tokenized.lengths, is_val, dtype, shard_tokens)
        stream_path.unlink()
        settings = {"text_field": text_field, "val_fraction": val_fraction, "seed": seed, "errors": errors,
                    "shard_tokens": shard_tokens}
        meta = _metadata(tok, dtype, tokenized, sources, splits, settings, trained=train_tokenizer is not None,
                         num_workers=num_workers, total_s=time.perf_counter() - t_start)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        refuse_if_read(out)  # (a run that began reading it while this preparation ran)
        _move_into_place(tmp, out)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        failure = _write_failure(err, out, tmp)
        if failure is not None:
            raise failure from None
        raise
    finally:
        lock.release()
    meta["output_dir"] = str(out)  # not stored: the folder may be moved
    return meta


def _check_arguments(errors: str, val_fraction: float, shard_tokens: int, tokenizer, train_tokenizer) -> None:
    if errors not in ("strict", "replace"):
        raise ValueError(f"errors must be 'strict' or 'replace', got {errors!r}")
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be positive, got {shard_tokens}")
    if train_tokenizer is not None and tokenizer is not None:
        raise ValueError("give either a tokenizer or train_tokenizer (a vocabulary size), not both")


def _open_output(out: Path, overwrite: bool):
    """``(lock, temporary folder)`` for writing ``out``. One preparation per output at a time (``.NAME.lock``
    beside it): the emptiness check here must still hold when the finished folder is renamed into place."""
    lock = lock_beside(out, "output folder")
    try:
        _check_output_dir(out, overwrite)
        out.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(out)
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
    except BaseException:
        lock.release()
        raise
    return lock, tmp


@dataclasses.dataclass
class _Tokenized:
    """What tokenizing every document into one stream gave: per-document lengths, per-source counts."""

    lengths: np.ndarray
    source_tokens: np.ndarray
    stats: list[SourceStats]
    max_id: int
    seconds: float


def _tokenize_into(stream_path: Path, sources: Sequence[Source], tok: Tokenizer, dtype: np.dtype, num_workers: int,
                   text_field: str, errors: str, progress: bool) -> _Tokenized:
    """Tokenize every document of ``sources`` (EOD after each) into ``stream_path``, in order."""
    stats = [SourceStats() for _ in sources]
    source_tokens = np.zeros(len(sources), dtype=np.int64)
    all_lengths: list[np.ndarray] = []
    max_id = -1
    t_tok = time.perf_counter()
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(_make_pool(num_workers, tok, dtype)) if num_workers > 1 else None
        stream = stack.enter_context(open(stream_path, "wb"))
        bar = stack.enter_context(tqdm(
            desc="tokenizing", unit="tok", unit_scale=True, disable=not progress, file=sys.stderr, smoothing=0.1
        ))
        batches = _batches(sources, text_field, errors, stats)
        for owners, tokens, lengths in _tokenized(batches, tok, dtype, pool, window=4 * num_workers):
            stream.write(tokens.tobytes())
            all_lengths.append(lengths)
            np.add.at(source_tokens, owners, lengths)
            max_id = max(max_id, int(tokens.max()))
            bar.update(len(tokens))
    lengths = np.concatenate(all_lengths) if all_lengths else np.zeros(0, np.int64)
    return _Tokenized(lengths, source_tokens, stats, max_id, time.perf_counter() - t_tok)


def _metadata(tok: Tokenizer, dtype: np.dtype, t: _Tokenized, sources: Sequence[Source], splits: dict[str, Any],
              settings: dict[str, Any], *, trained: bool, num_workers: int, total_s: float) -> dict[str, Any]:
    """``meta.json``: the tokenizer, the splits, every source with its hash and counts, and the timing."""
    n_tokens = int(t.lengths.sum())
    return {
        "format": FORMAT,
        "tokenizer": {
            "name": tok.name,
            "kind": tok.kind,
            "fingerprint": tok.fingerprint,
            "vocab_size": tok.vocab_size,
            "eod_id": tok.eod_id,
            "pad_id": tok.pad_id,
            "file": TOKENIZER_FILE if trained else None,
            "trained_on": "train split" if trained else None,
        },
        "tokenizer_fingerprint": tok.fingerprint,
        "vocab_size": tok.vocab_size,
        "eod_id": tok.eod_id,
        "eod_placement": "after every document",
        "dtype": dtype.name,
        "max_token_id": t.max_id,
        "documents": int(len(t.lengths)),
        "tokens": n_tokens,
        "skipped_empty": sum(s.skipped_empty for s in t.stats),
        "replacements": sum(s.replacements for s in t.stats),
        **settings,
        "splits": splits,
        "sources": [
            {
                "path": str(src.path),
                "format": src.format,
                "bytes": st.bytes,
                "sha256": st.sha256,
                "documents": st.documents,
                "tokens": int(t.source_tokens[i]),
                "skipped_empty": st.skipped_empty,
                "replacements": st.replacements,
                **st.extra,
            }
            for i, (src, st) in enumerate(zip(sources, t.stats))
        ],
        "timing": {
            "num_workers": num_workers,
            "tokenize_seconds": round(t.seconds, 3),
            "total_seconds": round(total_s, 3),
            "tokens_per_second": round(n_tokens / t.seconds, 1) if t.seconds > 0 else None,
        },
    }


# -- report -------------------------------------------------------------------------------------------------
def summary(meta: dict[str, Any]) -> str:
    """Human-readable report of a ``prepare`` result (what the CLI prints)."""
    tr, va, t = meta["splits"]["train"], meta["splits"]["val"], meta["timing"]
    lines = [
        f"prepared {meta['documents']:,} documents from {len(meta['sources']):,} sources: "
        f"{meta['tokens']:,} tokens ({meta['documents']:,} of them EOD), {meta['dtype']}",
        f"  train: {tr['documents']:,} documents, {tr['tokens']:,} tokens in {len(tr['shards'])} shard(s); "
        f"val: {va['documents']:,} documents, {va['tokens']:,} tokens",
        f"  tokenizer {meta['tokenizer']['name']} (fingerprint {meta['tokenizer_fingerprint'][:16]}), "
        f"vocab_size {meta['vocab_size']:,}",
    ]
    if meta["skipped_empty"] or meta["replacements"]:
        lines.append(f"  skipped {meta['skipped_empty']:,} empty records; {meta['replacements']:,} bytes replaced "
                     "(invalid UTF-8)")
    lines.append(
        f"tokenized in {t['tokenize_seconds']:.2f} s with {t['num_workers']} worker(s): "
        f"{t['tokens_per_second'] or 0:,.0f} tokens/s (total {t['total_seconds']:.2f} s)"
    )
    if "output_dir" in meta:
        lines.append(f"wrote {meta['output_dir']}")
    return "\n".join(lines)


if __name__ == "__main__":  # the command line lives in adaponder.cli; say so rather than exit silently
    raise SystemExit("this module has no command line: run `adaponder-prepare` (or `python -m adaponder.cli.prepare`)")
