"""Perplexity and bits per byte of held-out documents with a sliding window, token by token.

Each document is scored as ``[EOD] + tokens``: the end-of-document token is the context of the first
token, so every token of the document is predicted exactly once (as lm-eval's rolling loglikelihood does
with its prefix token). Long documents are cut into windows of ``window`` inputs that start every
``stride`` tokens; a window scores only the predictions the previous window did not (the last
``end − previous end`` of them), so each scored token sees at least ``window − stride`` tokens of context
(except in the first window) and no token is scored twice.

* perplexity = exp(total NLL / tokens) (natural log),
* bits per byte = total NLL / ln 2 / UTF-8 bytes of the scored text.

Inputs: text files (``.gz`` too) or folders of them (one file = one document), or a folder written by
``adaponder-prepare`` (its ``val`` split, one document per recorded document, the trailing EOD not scored), which
must have been prepared with the model's tokenizer (checked here, for every command that reads one).

``--packing stream`` scores a prepared split the way training-time validation does instead
(:mod:`adaponder.data.loader`): the split is one token stream, documents packed back to back, cut into samples
of ``window + 1`` tokens that start every ``window`` tokens (no overlap, context crosses document boundaries).
With ``--window`` = the run's ``data.seq_len`` and ``--max-tokens`` = the tokens its validation scored, the
perplexity equals the trainer's ``val_ppl`` (tests/test_train_run.py checks it).

Command line: ``adaponder-perplexity`` (:mod:`adaponder.cli.perplexity`).
"""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from adaponder.data.errors import EmptyInputError, VocabRangeError
from adaponder.data.fingerprint import check_corpus_tokenizer
from adaponder.data.layout import split_documents, split_stream
from adaponder.data.tokenizer import Tokenizer, as_tokenizer
from adaponder.errors import UsageError
from adaponder.modeling.exits import exit_histogram
from adaponder.modeling.input_checks import context_note, context_tokens
from adaponder.modeling.run_settings import RunSettings

from .accounting import flops_summary

TEXT_SUFFIXES = (".txt", ".tokens", ".raw", ".text", ".md", ".gz")
LN2 = math.log(2.0)


# -- documents ------------------------------------------------------------------------------------------
@dataclass
class Document:
    """One held-out document: its token ids (without the EOD prefix) and the UTF-8 bytes they spell."""

    name: str
    ids: np.ndarray
    n_bytes: int
    source: str = ""
    #: The token before ``ids[0]`` (its context). None: the document starts here and EOD is its context.
    lead: int | None = None
    #: Packed-stream scoring: non-overlapping windows of this length, whatever the caller's window/stride.
    packed_window: int | None = None

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    return raw.decode("utf-8", errors="replace")


def _text_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = [p for p in sorted(path.rglob("*")) if p.is_file() and not p.name.startswith(".")
             and p.suffix.lower() in TEXT_SUFFIXES and p.name.lower() not in ("readme.md",)]
    if not files:
        raise FileNotFoundError(f"{path}: no text files ({', '.join(TEXT_SUFFIXES)}) found")
    return files


def _encode_prefix(codec: Tokenizer, text: str, cap: int | None) -> tuple[list[int], bool]:
    """Token ids of ``text``, at most ``cap`` of them; encodes only a prefix of a long text when that suffices.
    Returns ``(ids, truncated)``."""
    if cap is not None and len(text) > 16 * cap + 1024:
        ids = codec.encode(text[: 16 * cap + 1024])  # ≥ 1 token per 16 characters in any real text
        if len(ids) > cap + 64:  # tokens far from the cut are the ones the whole text would give
            return ids[:cap], True
    ids = codec.encode(text)
    if cap is not None and len(ids) > cap:
        return ids[:cap], True
    return ids, False


PACKINGS = ("documents", "stream")


def load_stream(path: str | os.PathLike, tokenizer, window: int, max_tokens: int | None = None,
                split: str = "val") -> Document:
    """A prepared split as training-time validation reads it (see the module doc): sample ``i`` is
    ``stream[i*window : (i+1)*window + 1]`` for ``i < (len(stream) - 1) // window`` (the loader's count), capped
    at ``max_tokens // window`` samples. Returned as one :class:`Document` whose first token is context only."""
    path = Path(path)
    if not (path.is_dir() and (path / "meta.json").is_file()):
        raise UsageError(f"{path}: --packing stream needs a folder written by adaponder-prepare (with meta.json)")
    if window < 1:
        raise UsageError(f"--packing stream needs a window >= 1, got {window}")
    check_corpus_tokenizer(path, tokenizer)
    stream = split_stream(path, split)
    samples = (len(stream) - 1) // window if len(stream) > window else 0
    if max_tokens is not None:
        samples = min(samples, max_tokens // window)
    if samples < 1:
        raise EmptyInputError(f"{path} split {split!r}: fewer than one sample of window + 1 = {window + 1} tokens "
                         f"(stream of {len(stream)} tokens, max_tokens {max_tokens})")
    ids = stream[1:samples * window + 1].astype(np.int64)
    n_bytes = len(as_tokenizer(tokenizer).decode(ids).encode("utf-8"))
    return Document(name=f"{path.name}/{split} (stream)", ids=ids, n_bytes=n_bytes, source=str(path),
                    lead=int(stream[0]), packed_window=window)


def load_documents(sources: str | os.PathLike | Sequence[str | os.PathLike], tokenizer,
                   max_tokens: int | None = None, max_tokens_per_doc: int | None = None,
                   split: str = "val", packing: str = "documents", window: int | None = None) -> list[Document]:
    """Tokenize held-out documents from text files/folders or prepared data folders.

    ``max_tokens`` caps the total over all sources (documents are taken in order, the last one cut);
    ``max_tokens_per_doc`` caps each document. Bytes are those of the (possibly cut) token sequence.
    ``packing="stream"`` reads each (prepared) source with :func:`load_stream` and ``window`` instead.
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if packing not in PACKINGS:
        raise UsageError(f"packing must be one of {PACKINGS}, got {packing!r}")
    if packing == "stream":
        if window is None:
            raise UsageError("--packing stream needs --window (the training run's data.seq_len)")
        return [load_stream(src, tokenizer, window, max_tokens, split) for src in sources]
    codec = as_tokenizer(tokenizer)
    docs: list[Document] = []
    left = max_tokens
    for src in sources:
        path = Path(src)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        if path.is_dir() and (path / "meta.json").is_file():
            check_corpus_tokenizer(path, codec)
            items = ((f"{path.name}/{split}#{i}", ids, None) for i, ids in enumerate(split_documents(path, split)))
        else:
            items = ((str(f), None, f) for f in _text_files(path))
        for name, ids, file in items:
            if left is not None and left <= 0:
                break
            caps = [c for c in (left, max_tokens_per_doc) if c is not None]
            cap = min(caps) if caps else None
            if file is not None:
                text = _read_text(file)
                tok, cut = _encode_prefix(codec, text, cap)
                ids = np.asarray(tok, dtype=np.int64)
                n_bytes = len(codec.decode(ids).encode("utf-8")) if cut else len(text.encode("utf-8"))
            else:
                if cap is not None:
                    ids = ids[:cap]
                n_bytes = len(codec.decode(ids).encode("utf-8"))
            if len(ids) == 0:
                continue
            docs.append(Document(name=name, ids=ids, n_bytes=n_bytes, source=str(src)))
            if left is not None:
                left -= len(ids)
    if not docs:
        raise EmptyInputError(f"no tokens to score in {', '.join(map(str, sources))}")
    return docs


# -- windows and scoring ----------------------------------------------------------------------------------
def sliding_windows(n_targets: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """Windows over ``s = [EOD] + tokens`` (``n_targets`` = number of tokens to predict).

    Each window ``(begin, end, n_scored)`` feeds ``s[begin:end]`` and predicts ``s[begin+1:end+1]``; its last
    ``n_scored`` predictions are scored. Together the windows score every target exactly once, in order.
    """
    if window < 1 or not 1 <= stride <= window:
        raise ValueError(f"need window >= 1 and 1 <= stride <= window; got window={window}, stride={stride}")
    out: list[tuple[int, int, int]] = []
    prev_end, begin = 0, 0
    while prev_end < n_targets:
        end = min(begin + window, n_targets)
        out.append((begin, end, end - prev_end))
        prev_end = end
        begin += stride
    return out


@dataclass
class TokenScores:
    """Per scored token: document index, position in the document, token id, NLL (nats), exit pass,
    the length of the window it was scored in (its context for the FLOPs count), and whether the model's
    greedy (argmax) prediction was this token."""

    doc: np.ndarray
    position: np.ndarray
    token: np.ndarray
    nll: np.ndarray
    exit_pass: np.ndarray
    context: np.ndarray
    passes: int = 1
    meta: dict = field(default_factory=dict)
    correct: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.nll.shape[0])

    def select(self, mask: np.ndarray) -> "TokenScores":
        return TokenScores(self.doc[mask], self.position[mask], self.token[mask], self.nll[mask],
                           self.exit_pass[mask], self.context[mask], self.passes, dict(self.meta),
                           None if self.correct is None else self.correct[mask])


def default_window(model) -> int:
    return int(min(context_tokens(model.config), 1024))


@torch.no_grad()
def score_documents(model, docs: Sequence[Document], window: int | None = None, stride: int | None = None,
                    batch_size: int | None = None, eod_id: int = 0, pad_id: int | None = None, progress: bool = False,
                    settings: RunSettings | None = None) -> TokenScores:
    """Score every token of ``docs`` with sliding windows (see module doc); returns :class:`TokenScores` in
    document/position order. ``settings``: the :class:`RunSettings` of every scoring call (τ, the exit rule — e.g.
    fixed pruning, whose draws follow a fixed batch order, so a seeded rule gives reproducible results)."""
    window = int(window or default_window(model))
    if window > context_tokens(model.config):  # in pause mode a token takes 1 + num_pauses positions
        raise ValueError(f"window {window} exceeds the model's context of {context_tokens(model.config)} tokens "
                         f"({context_note(model.config)})")
    stride = int(stride or max(1, window // 2))
    batch_size = int(batch_size or max(1, 2048 // window))
    pad_id = eod_id if pad_id is None else pad_id
    device = model.device
    jobs = []  # (doc index, begin, end, n_scored)
    for d, doc in enumerate(docs):
        w, s = (doc.packed_window, doc.packed_window) if doc.packed_window else (window, stride)
        jobs += [(d, b, e, k) for b, e, k in sliding_windows(len(doc), w, s)]
    # Longest first: batches of similar length waste little on padding.
    order = sorted(range(len(jobs)), key=lambda j: -(jobs[j][2] - jobs[j][1]))
    seqs = [np.concatenate([[eod_id if doc.lead is None else doc.lead], doc.ids]).astype(np.int64) for doc in docs]
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("doc", "position", "token", "nll", "exit_pass", "context",
                                                          "correct")}
    iterator = range(0, len(order), batch_size)
    if progress:
        iterator = tqdm(iterator, desc="scoring windows", unit="batch")
    for start in iterator:
        batch = [jobs[j] for j in order[start:start + batch_size]]
        width = max(e - b for _, b, e, _ in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, (d, b, e, _) in enumerate(batch):
            ids[r, :e - b] = torch.from_numpy(seqs[d][b:e])
            mask[r, :e - b] = 1
        attn = None if bool(mask.all()) else mask.to(device)
        out = model(input_ids=ids.to(device), attention_mask=attn, use_cache=False, settings=settings)
        logits, exits = out.logits, out.exit_pass
        for r, (d, b, e, k) in enumerate(batch):
            length = e - b
            sel = slice(length - k, length)
            targets = torch.from_numpy(seqs[d][b + length - k + 1:b + length + 1]).to(device)
            nll = F.cross_entropy(logits[r, sel].float(), targets, reduction="none")
            parts["doc"].append(np.full(k, d, dtype=np.int32))
            parts["position"].append(np.arange(b + length - k, b + length, dtype=np.int64))
            parts["token"].append(targets.cpu().numpy())
            parts["nll"].append(nll.double().cpu().numpy())
            parts["correct"].append((logits[r, sel].argmax(-1) == targets).cpu().numpy())
            parts["exit_pass"].append(exits[r, sel].cpu().numpy().astype(np.int16))
            parts["context"].append(np.full(k, length, dtype=np.int32))
        del out, logits
    arrays = {k: np.concatenate(v) if v else np.zeros(0) for k, v in parts.items()}
    idx = np.lexsort((arrays["position"], arrays["doc"]))
    arrays = {k: v[idx] for k, v in arrays.items()}
    return TokenScores(**arrays, passes=int(model.config.passes),
                       meta={"window": window, "stride": stride, "batch_size": batch_size,
                             "packing": "stream" if any(d.packed_window for d in docs) else "documents"})


# -- summaries -----------------------------------------------------------------------------------------
def bits_per_byte(total_nll_nats: float, n_bytes: int) -> float:
    """Bits per UTF-8 byte: total NLL (nats) / ln 2 / bytes."""
    if n_bytes <= 0:
        raise ValueError("bits per byte needs a positive byte count")
    return float(total_nll_nats) / LN2 / float(n_bytes)


def summarize(scores: TokenScores, docs: Sequence[Document], model=None) -> dict:
    """Perplexity, bits per byte, NLL, mean exit pass, exit histogram and (with ``model``) FLOPs per token."""
    n = len(scores)
    total = float(scores.nll.sum())
    doc_ids = np.unique(scores.doc) if n else np.zeros(0, dtype=np.int64)
    n_bytes = int(sum(docs[int(d)].n_bytes for d in doc_ids))
    out = {
        "tokens": n,
        "documents": int(len(doc_ids)),
        "bytes": n_bytes,
        "nll": total / max(n, 1),
        "ppl": math.exp(total / max(n, 1)),
        "bpb": bits_per_byte(total, n_bytes) if n_bytes else float("nan"),
        "mean_exit": float(scores.exit_pass.mean()) if n else float("nan"),
        "exit_histogram": exit_histogram(scores.exit_pass, scores.passes),
    }
    if model is not None:
        out["flops"] = flops_summary(model, scores.exit_pass, float(scores.context.mean()) if n else None)
    return out


def summarize_by_source(scores: TokenScores, docs: Sequence[Document], model=None) -> dict[str, dict]:
    """:func:`summarize` per input source (the ``--data`` entries), plus ``"all"``."""
    out = {}
    sources = list(dict.fromkeys(doc.source for doc in docs))
    for src in sources:
        members = np.array([i for i, doc in enumerate(docs) if doc.source == src])
        out[src] = summarize(scores.select(np.isin(scores.doc, members)), docs, model)
    if len(sources) > 1:
        out["all"] = summarize(scores, docs, model)
    return out


# -- several sources, tables, checks -------------------------------------------------------------------
def load_all(data: Sequence[str], tokenizer, max_tokens=None, max_tokens_per_doc=None, split="val",
             packing="documents", window=None):
    """Documents of every ``--data`` entry, ``max_tokens`` applying to each entry separately."""
    docs: list[Document] = []
    for src in data:
        docs += load_documents(src, tokenizer, max_tokens, max_tokens_per_doc, split, packing, window)
    return docs


def format_row(name: str, s: dict) -> str:
    f = s.get("flops", {})
    return (f"| {name} | {s['tokens']} | {s['ppl']:.3f} | {s['bpb']:.4f} | {s['mean_exit']:.3f} | "
            f"{f.get('total', float('nan')) / 1e6:.2f} | {f.get('x_one_pass', float('nan')):.3f} |")


TABLE_HEADER = ("| data | tokens | perplexity | bits/byte | mean exit pass | MFLOPs/token | × one pass |\n"
                "|---|---:|---:|---:|---:|---:|---:|")


def check_vocab(docs: Sequence[Document], vocab_size: int) -> None:
    """:class:`VocabRangeError` naming the document and id when the tokenizer yields ids the model cannot embed
    (a checkpoint whose tokenizer does not match its model, or damaged prepared data)."""
    for doc in docs:
        bad = np.flatnonzero((doc.ids < 0) | (doc.ids >= vocab_size))
        if bad.size:
            i = int(bad[0])
            raise VocabRangeError(f"{doc.name}: token {i} has id {int(doc.ids[i])}, outside the model's vocabulary "
                                  f"(size {vocab_size}); does the checkpoint's tokenizer match its model?")


if __name__ == "__main__":  # the command line lives in adaponder.cli; say so rather than exit silently
    raise SystemExit("this module has no command line: run `adaponder-perplexity` (or `python -m adaponder.cli.perplexity`)")
