"""The multi-hop reasoning corpus (adaponder.data.reasoning): deterministic for a seed, every label recomputed by
an independent solver that reads only the token strings, held-out compositions never seen in training, the
stated difficulty counts, and the folder read by the ordinary loader and evaluation readers."""

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from adaponder.data.reasoning import MultiHopSpec, read_token_labels, write_multihop

SPEC = MultiHopSpec(symbols=24, max_hops=3, filler_symbols=5, queries=6, doc_tokens=32, train_docs=120, val_docs=20,
                    seed=7)
QUERY = re.compile(r"^<h(\d+)>$")


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _split_words(folder: Path, split: str) -> tuple[list[list[str]], list[np.ndarray]]:
    """Each document of ``split`` as token strings (from the shards and tokenizer.json alone) and its labels."""
    from adaponder.data import load_tokenizer
    from adaponder.data.layout import open_shards, read_meta

    meta = read_meta(folder)
    tok = load_tokenizer(folder / "tokenizer.json")
    stream = np.concatenate([np.asarray(s) for s in open_shards(folder, meta, split)])
    offsets = np.load(folder / f"{split}.docs.npy")
    words = [[tok.id_to_token(int(i)) for i in stream[a:b]] for a, b in zip(offsets[:-1], offsets[1:])]
    labels = np.load(folder / f"{split}.labels.npy")
    return words, [labels[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def _solve(words: list[str], f: dict[str, str]) -> list[int]:
    """Labels recomputed from the words: H for an answer (checked to be f^H(x)), 0 end, -1 prompt, -2 filler."""
    out = []
    for i, w in enumerate(words):
        m = QUERY.match(w)
        if m:
            out.append(-1)
        elif w.startswith("s") and i >= 1 and QUERY.match(words[i - 1]):
            out.append(-1)
        elif w == "<|endoftext|>":
            out.append(0)
        elif w.startswith("s") and i >= 2 and QUERY.match(words[i - 2]):
            hops, y = int(QUERY.match(words[i - 2]).group(1)), words[i - 1]
            for _ in range(hops):
                y = f[y]
            assert y == w, f"answer {w} of {words[i - 2:i + 1]}: f^{hops} gives {y}"
            out.append(hops)
        else:
            assert re.match(r"^f\d\d$", w), w
            out.append(-2)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("multihop") / "data"
    write_multihop(folder, SPEC)
    return folder


def test_same_seed_same_bytes_other_seed_other_corpus(corpus, tmp_path):
    again = tmp_path / "again"
    write_multihop(again, SPEC)
    assert _digest(again) == _digest(corpus)
    other = tmp_path / "other"
    write_multihop(other, MultiHopSpec(**{**SPEC.__dict__, "seed": 8}))
    assert _digest(other)["train-00000.bin"] != _digest(corpus)["train-00000.bin"]


def test_an_independent_solver_recomputes_every_label(corpus):
    train, train_labels = _split_words(corpus, "train")
    # f is learnt from the training split's one-hop queries alone: every symbol is asked at H = 1 there.
    f = {}
    for words in train:
        for i in range(len(words) - 2):
            if words[i] == "<h1>":
                assert f.setdefault(words[i + 1], words[i + 2]) == words[i + 2]
    assert len(f) == SPEC.symbols and sorted(f.values()) == sorted(f)  # a permutation
    for split in ("train", "val"):
        words, labels = _split_words(corpus, split) if split == "val" else (train, train_labels)
        for w, lab in zip(words, labels):
            assert len(w) == SPEC.doc_tokens and w[-1] == "<|endoftext|>"
            assert _solve(w, f) == lab.tolist()


def test_difficulties_have_the_stated_counts_and_compositions_are_held_out(corpus):
    per_level = SPEC.queries // SPEC.max_hops
    composed_in_train = set()
    for split in ("train", "val"):
        words, labels = _split_words(corpus, split)
        for w, lab in zip(words, labels):
            assert [int((lab == h).sum()) for h in range(1, SPEC.max_hops + 1)] == [per_level] * SPEC.max_hops
            assert int((lab == -2).sum()) == SPEC.doc_tokens - 1 - 3 * SPEC.queries
            for i in np.flatnonzero(lab > 1):
                x = w[i - 1]
                if split == "train":
                    composed_in_train.add(x)
                else:
                    assert x not in composed_in_train, f"{x} is asked with H >= 2 in training and validation"
    assert 0 < len(composed_in_train) <= SPEC.symbols // 2


def test_labels_align_with_the_evaluation_documents(corpus):
    from adaponder.data import load_tokenizer
    from adaponder.evaluation.perplexity import load_documents

    tok = load_tokenizer(corpus / "tokenizer.json")
    docs = load_documents(corpus, tok, split="val")
    labels = read_token_labels(corpus, "val")
    assert len(docs) == len(labels) == SPEC.val_docs
    assert all(len(d) == len(lab) == SPEC.doc_tokens - 1 for d, lab in zip(docs, labels))


def test_bad_specs_and_unlabelled_folders_are_named(tmp_path, corpus):
    from adaponder.data.errors import DataError

    with pytest.raises(DataError) as err:
        write_multihop(tmp_path / "bad", MultiHopSpec(queries=5, max_hops=4, doc_tokens=8, held_out_fraction=1.0))
    msg = str(err.value)
    assert "queries: 5" in msg and "doc_tokens: 8" in msg and "held_out_fraction: 1.0" in msg
    with pytest.raises(DataError, match="not empty"):
        write_multihop(corpus, SPEC)
    (corpus / "val.labels.npy").rename(tmp_path / "keep.npy")
    try:
        np.save(corpus / "val.labels.npy", np.zeros(3, np.int8))
        with pytest.raises(DataError, match="3 labels"):
            read_token_labels(corpus, "val")
    finally:
        (tmp_path / "keep.npy").replace(corpus / "val.labels.npy")
