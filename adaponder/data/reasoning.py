"""Synthetic reasoning corpora with a known difficulty per token: where a token needs several serial steps.

**Multi-hop over a function held in the weights** (``multihop``). A fixed random permutation ``f`` of ``N``
symbols is drawn from the seed. A *query* is three tokens::

    <hH> sX sY        with  Y = f^H(X)   (H hops, 1 <= H <= max_hops)

The answer is predicted at the position of ``sX`` itself, so one pass can apply ``f`` to the token there and
the next pass can apply it again to the prediction fed back (the pondering embedding, A3-A4).

Training documents ask ``H = 1`` of every symbol (so ``f`` itself is learnable) but ``H >= 2`` only of the
*train* symbols; validation documents ask every ``H`` of the held-out ones. With ``dev_fraction > 0`` the held-out
symbols are split in two disjoint sets: a *development* set (split ``dev``), on which settings may be chosen, and
a *test* set (split ``val``), scored once at the end. The training split does not depend on ``dev_fraction``.
The data seed (``seed``) draws the permutation, the held-out symbols and every document. A model can only answer a
held-out ``H >= 2`` query by composing ``f`` — it has never seen that composition — which is the serial
computation a looped model's passes can supply and a shallow model's cannot. The difficulty of an answer token
is ``H``, known by construction.

Every document mixes difficulties: its ``queries`` queries hold each ``H`` equally often (in a random order),
separated by runs of *filler* symbols drawn uniformly from their own alphabet — tokens no amount of computation
can predict. A document is exactly ``doc_tokens`` tokens, the last being the end-of-document token, so
training windows of ``seq_len = doc_tokens`` start at document starts and never cut a query.

The corpus is written as an ordinary prepared data folder (:mod:`adaponder.data.layout`: shards, ``meta.json``,
a word-level ``tokenizer.json``), so ``pretrain`` → evaluate → export apply unchanged, plus one side array per
split, ``{split}.labels.npy`` (int8, aligned with the split's token stream), read by :func:`read_token_labels`:

* ``H >= 1`` — an answer token needing ``H`` hops;
* ``0`` — structure (the end-of-document token): predictable from the format alone;
* ``-1`` — prompt (hop marker, query symbol): chosen at random, unpredictable;
* ``-2`` — filler: random, unpredictable.

Command line: ``adaponder-reasoning-data`` (:mod:`adaponder.cli.reasoning_data`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from .errors import DataError
from .fingerprint import labels_fingerprint
from .layout import FORMAT, META_FILE, docs_name, dtype_for_vocab, read_meta
from .prepare import TOKENIZER_FILE, _ShardWriter
from .tokenizer import load_tokenizer

TASKS = ("multihop",)
STRUCTURE, PROMPT, FILLER = 0, -1, -2
CLASS_NAMES = {STRUCTURE: "structure", PROMPT: "prompt", FILLER: "filler"}
QUERY_TOKENS = 3  # <hH> sX sY
LABELS_SUFFIX = ".labels.npy"
EOD, PAD = "<|endoftext|>", "<|padding|>"


@dataclass(frozen=True)
class MultiHopSpec:
    """Size of a multi-hop corpus. Defaults: the reasoning study's task."""

    symbols: int = 256
    max_hops: int = 4
    filler_symbols: int = 32
    queries: int = 16               # per document; a multiple of max_hops
    doc_tokens: int = 64            # per document, end-of-document token included
    train_docs: int = 20000
    val_docs: int = 500
    held_out_fraction: float = 0.5  # of the symbols: never asked with H >= 2 in training
    seed: int = 0                   # the data seed: permutation, held-out symbols, documents
    dev_fraction: float = 0.0       # of the held-out symbols: the development split's (the rest is the test split)

    def problems(self) -> list[str]:
        out = []
        if self.symbols < 4:
            out.append(f"symbols: {self.symbols}, expected at least 4")
        if self.max_hops < 1:
            out.append(f"max_hops: {self.max_hops}, expected at least 1")
        if self.filler_symbols < 1:
            out.append(f"filler_symbols: {self.filler_symbols}, expected at least 1")
        if self.queries < 1 or (self.max_hops >= 1 and self.queries % self.max_hops):
            out.append(f"queries: {self.queries}, expected a positive multiple of max_hops ({self.max_hops})")
        one_hop = self.train_docs * (self.queries // self.max_hops) if self.max_hops >= 1 else 0
        if self.symbols >= 4 and self.train_docs >= 1 and 1 <= one_hop < self.symbols:
            # f is learnable only from the one-hop queries of training: with more symbols than such queries most
            # of f is never shown, and every query on those symbols is a guess
            out.append(f"symbols: {self.symbols}, more than the training split's {one_hop} one-hop queries "
                       f"(train_docs {self.train_docs} × queries / max_hops {self.queries // self.max_hops}): most "
                       f"of f would never be shown; expected at most {one_hop} symbols, or more train_docs")
        if self.doc_tokens < QUERY_TOKENS * self.queries + 1:
            out.append(f"doc_tokens: {self.doc_tokens}, expected at least {QUERY_TOKENS * self.queries + 1} "
                       f"({self.queries} queries of {QUERY_TOKENS} tokens + end of document)")
        if self.train_docs < 1 or self.val_docs < 1:
            out.append(f"train_docs / val_docs: {self.train_docs} / {self.val_docs}, expected at least 1 each")
        if not 0 < self.held_out_fraction < 1:
            out.append(f"held_out_fraction: {self.held_out_fraction}, expected strictly between 0 and 1")
        if not 0 <= self.dev_fraction < 1:
            out.append(f"dev_fraction: {self.dev_fraction}, expected 0 (no development split) or strictly between 0 and 1")
        elif self.dev_fraction and 0 < self.held_out_fraction < 1 and self.symbols >= 4:
            held = int(round(self.held_out_fraction * self.symbols))
            dev = int(round(self.dev_fraction * held))
            if dev < 1 or dev >= held:
                out.append(f"dev_fraction: {self.dev_fraction} of {held} held-out symbols leaves {dev} for development "
                           f"and {held - dev} for test; expected at least 1 in each")
        return out

    @property
    def splits(self) -> tuple[str, ...]:
        return ("train", "val", "dev") if self.dev_fraction else ("train", "val")


class Vocabulary:
    """Token ids of the task: specials 0 and 1 (Pythia's), hop markers, symbols, filler."""

    def __init__(self, spec: MultiHopSpec) -> None:
        self.tokens = [EOD, PAD]
        self.tokens += [f"<h{h}>" for h in range(1, spec.max_hops + 1)]
        self.tokens += [f"s{i:03d}" for i in range(spec.symbols)]
        self.tokens += [f"f{i:02d}" for i in range(spec.filler_symbols)]
        self.eod = 0
        self.hop0 = 2                       # id of <h1>
        self.symbol0 = self.hop0 + spec.max_hops
        self.filler0 = self.symbol0 + spec.symbols
        self.size = len(self.tokens)

    def hop(self, h: int) -> int:
        return self.hop0 + h - 1

    def save_tokenizer(self, path: Path) -> None:
        """A Hugging Face word-level ``tokenizer.json``: one token per whitespace-separated word."""
        tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(self.tokens)}, unk_token=PAD))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
        tok.add_special_tokens([EOD, PAD])
        tok.save(str(path))


def permutation(spec: MultiHopSpec) -> np.ndarray:
    """``f`` as an array: ``f[x]`` is the symbol index ``x`` maps to (a random permutation of the seed)."""
    return np.random.default_rng([spec.seed, 0]).permutation(spec.symbols)


def held_out_symbols(spec: MultiHopSpec) -> np.ndarray:
    """Boolean mask of the symbols whose ``H >= 2`` queries never appear in training (development and test)."""
    n = int(round(spec.held_out_fraction * spec.symbols))
    mask = np.zeros(spec.symbols, dtype=bool)
    mask[np.random.default_rng([spec.seed, 1]).choice(spec.symbols, size=n, replace=False)] = True
    return mask


def dev_symbols(spec: MultiHopSpec) -> np.ndarray:
    """Boolean mask of the development symbols: ``dev_fraction`` of the held-out ones (none when it is 0). Drawn
    from its own stream, so the held-out set, and with it the training split, is the same with or without it."""
    held = np.flatnonzero(held_out_symbols(spec))
    mask = np.zeros(spec.symbols, dtype=bool)
    n = int(round(spec.dev_fraction * len(held)))
    if n:
        mask[np.random.default_rng([spec.seed, 4]).choice(held, size=n, replace=False)] = True
    return mask


def symbol_sets(spec: MultiHopSpec) -> dict[str, np.ndarray]:
    """Symbol indices asked with ``H >= 2`` by each split: ``train``, ``dev`` (maybe empty) and ``test``
    (asked by the ``val`` split); pairwise disjoint."""
    held, dev = held_out_symbols(spec), dev_symbols(spec)
    return {"train": np.flatnonzero(~held), "dev": np.flatnonzero(dev), "test": np.flatnonzero(held & ~dev)}


def _compose(f: np.ndarray, x: np.ndarray, hops: np.ndarray) -> np.ndarray:
    y = x.copy()
    for step in range(int(hops.max())):
        y = np.where(hops > step, f[y], y)
    return y


def generate_split(spec: MultiHopSpec, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, labels) of one split: ``n_docs × doc_tokens`` each, documents back to back."""
    if split not in spec.splits:
        raise ValueError(f"split {split!r}: expected one of {', '.join(spec.splits)}")
    vocab = Vocabulary(spec)
    f, sets = permutation(spec), symbol_sets(spec)
    n_docs = spec.train_docs if split == "train" else spec.val_docs
    rng = np.random.default_rng([spec.seed, {"train": 2, "val": 3, "dev": 5}[split]])
    q, L = spec.queries, spec.doc_tokens
    # Each document holds every hop count equally often, in a random order.
    hops = np.tile(np.arange(1, spec.max_hops + 1), (n_docs, q // spec.max_hops))
    hops = rng.permuted(hops, axis=1)
    # Query symbols: training asks any symbol at H = 1 and only train symbols at H >= 2; validation (test) and
    # development ask only their own held-out symbols.
    if split == "train":
        train_set = sets["train"]
        x = np.where(hops == 1, rng.integers(0, spec.symbols, hops.shape),
                     train_set[rng.integers(0, len(train_set), hops.shape)])
    else:
        own = sets["test" if split == "val" else "dev"]
        x = own[rng.integers(0, len(own), hops.shape)]
    y = _compose(f, x, hops)
    # Filler: the doc's spare tokens split into q + 1 runs (before, between and after the queries).
    spare = L - 1 - QUERY_TOKENS * q
    cuts = np.sort(rng.integers(0, spare + 1, (n_docs, q)), axis=1)
    runs = np.diff(np.concatenate([np.zeros((n_docs, 1), int), cuts, np.full((n_docs, 1), spare)], axis=1), axis=1)
    filler = vocab.filler0 + rng.integers(0, spec.filler_symbols, (n_docs, spare))
    tokens = np.empty((n_docs, L), dtype=np.int64)
    labels = np.empty((n_docs, L), dtype=np.int8)
    for d in range(n_docs):
        pos, used = 0, 0
        for j in range(q + 1):
            r = int(runs[d, j])
            tokens[d, pos:pos + r] = filler[d, used:used + r]
            labels[d, pos:pos + r] = FILLER
            pos, used = pos + r, used + r
            if j == q:
                break
            tokens[d, pos:pos + QUERY_TOKENS] = (vocab.hop(int(hops[d, j])), vocab.symbol0 + x[d, j],
                                                 vocab.symbol0 + y[d, j])
            labels[d, pos:pos + QUERY_TOKENS] = (PROMPT, PROMPT, hops[d, j])
            pos += QUERY_TOKENS
        tokens[d, pos] = vocab.eod
        labels[d, pos] = STRUCTURE
    return tokens.reshape(-1), labels.reshape(-1)


def write_multihop(out_dir: str | os.PathLike[str], spec: MultiHopSpec = MultiHopSpec(), *,
                   overwrite: bool = False) -> dict[str, Any]:
    """Generate the corpus of ``spec`` into ``out_dir`` (a prepared data folder plus label arrays); returns
    its metadata. The folder appears complete or not at all (written beside it, then renamed)."""
    problems = spec.problems()
    if problems:
        raise DataError("multi-hop corpus: " + "; ".join(problems))
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise DataError(f"output folder {out} is not empty; pass overwrite=True (CLI: --overwrite) to replace it")
        read_meta(out)  # only ever replace a prepared data folder
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        vocab = Vocabulary(spec)
        vocab.save_tokenizer(tmp / TOKENIZER_FILE)
        tok = load_tokenizer(tmp / TOKENIZER_FILE)
        dtype = dtype_for_vocab(vocab.size)
        splits, max_id = {}, 0
        for split in spec.splits:
            tokens, labels = generate_split(spec, split)
            writer = _ShardWriter(tmp, split, dtype, shard_tokens=1 << 24)
            writer.write(tokens)
            n_docs = len(tokens) // spec.doc_tokens
            np.save(tmp / docs_name(split), np.arange(n_docs + 1, dtype=np.int64) * spec.doc_tokens)
            np.save(tmp / f"{split}{LABELS_SUFFIX}", labels)
            splits[split] = {"documents": n_docs, "tokens": int(len(tokens)), "shards": writer.close(),
                             "docs_index": docs_name(split), "labels": f"{split}{LABELS_SUFFIX}"}
            splits[split]["labels_fingerprint"] = labels_fingerprint(tmp / f"{split}{LABELS_SUFFIX}",
                                                                     splits[split]["shards"])
            max_id = max(max_id, int(tokens.max()))
        meta = {
            "format": FORMAT,
            "tokenizer": {"name": f"multihop word-level, {vocab.size} entries", "kind": tok.kind,
                          "fingerprint": tok.fingerprint, "vocab_size": vocab.size, "eod_id": vocab.eod,
                          "pad_id": tok.pad_id, "file": TOKENIZER_FILE, "trained_on": None},
            "tokenizer_fingerprint": tok.fingerprint,
            "vocab_size": vocab.size,
            "eod_id": vocab.eod,
            "eod_placement": "after every document",
            "dtype": dtype.name,
            "max_token_id": max_id,
            "documents": sum(s["documents"] for s in splits.values()),
            "tokens": sum(s["tokens"] for s in splits.values()),
            "splits": splits,
            "sources": [],
            "task": {"name": "multihop", **asdict(spec),
                     "token_labels": {"answer": "difficulty H >= 1 (hops)",
                                      **{str(k): v for k, v in CLASS_NAMES.items()}}},
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def has_token_labels(data_dir: str | os.PathLike[str], split: str = "val") -> bool:
    """Whether a prepared data folder carries per-token labels for ``split`` (a corpus written here)."""
    try:
        return "labels" in read_meta(data_dir)["splits"].get(split, {})
    except DataError:
        return False


def read_token_labels(data_dir: str | os.PathLike[str], split: str = "val") -> list[np.ndarray]:
    """The label array of each document of ``split`` (see the module doc), aligned with the document's tokens
    as :func:`adaponder.evaluation.perplexity.load_documents` reads them (its trailing end-of-document token,
    which is not scored, is dropped)."""
    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    info = meta["splits"].get(split, {})
    if "labels" not in info:
        raise DataError(f"{data_dir}: split {split!r} has no token labels (a corpus written by "
                        "adaponder.data.reasoning has {split}.labels.npy); difficulty evaluation needs them")
    labels = np.load(data_dir / info["labels"])
    offsets = np.load(data_dir / info["docs_index"])
    if int(offsets[-1]) != len(labels):
        raise DataError(f"{data_dir / info['labels']}: {len(labels)} labels, but split {split!r} has "
                        f"{int(offsets[-1])} tokens")
    return [labels[int(a):int(b) - 1] for a, b in zip(offsets[:-1], offsets[1:])]


__all__ = ["CLASS_NAMES", "FILLER", "MultiHopSpec", "PROMPT", "STRUCTURE", "TASKS", "Vocabulary",
           "dev_symbols", "generate_split", "has_token_labels", "held_out_symbols", "symbol_sets", "permutation", "read_token_labels", "write_multihop"]


if __name__ == "__main__":  # the command line lives in adaponder.cli; say so rather than exit silently
    raise SystemExit("this module has no command line: run `adaponder-reasoning-data` (or `python -m adaponder.cli.reasoning_data`)")
