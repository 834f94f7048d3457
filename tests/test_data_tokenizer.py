"""Tokenizer interface: bundled Pythia tokenizer, sentencepiece, fingerprint stability."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from adaponder.data.errors import DataError, InputNotFoundError
from adaponder.data.tokenizer import Tokenizer, bundled_tokenizer_path, load_tokenizer

SHARED_TOKENIZER = Path(__file__).resolve().parents[1].parent / "shared/data/tokenizers/gpt-neox-20b/tokenizer.json"
TEXT = "Hello, World!\r\nTwo  spaces,\ttabs\n\n    indented café — “quotes” 你好 😀 <|endoftext|> end"


def test_bundled_pythia_tokenizer_basics() -> None:
    tok = load_tokenizer()
    assert isinstance(tok, Tokenizer)
    assert tok.kind == "hf" and tok.name == "gpt-neox-20b"
    assert tok.vocab_size == 50277 == len(tok)
    assert tok.eod_id == 0 and tok.id_to_token(0) == "<|endoftext|>"
    assert tok.pad_id == 1 and tok.id_to_token(1) == "<|padding|>"
    assert len(tok.fingerprint) == 64 and int(tok.fingerprint, 16) >= 0
    assert load_tokenizer() is tok  # cached


def test_encode_decode_roundtrip_and_batch() -> None:
    tok = load_tokenizer()
    ids = tok.encode(TEXT)
    assert all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == TEXT  # lossless: special tokens kept, whitespace and CRLF kept
    assert tok.encode("<|endoftext|>") == [tok.eod_id]
    assert tok.decode(torch.tensor(ids)) == TEXT and tok.decode(np.array(ids)) == TEXT
    assert tok.encode_batch([TEXT, "a b", ""]) == [ids, tok.encode("a b"), []]
    assert "<|endoftext|>" not in tok.decode(ids, skip_special_tokens=True)


@pytest.mark.skipif(not SHARED_TOKENIZER.is_file(), reason="offline data pack not available")
def test_fingerprint_ignores_path_compression_and_serialization(tmp_path: Path) -> None:
    bundled = load_tokenizer()
    plain = load_tokenizer(SHARED_TOKENIZER)
    assert plain.fingerprint == bundled.fingerprint
    # same content in another folder, loaded by folder path
    (tmp_path / "copy").mkdir()
    shutil.copy(SHARED_TOKENIZER, tmp_path / "copy" / "tokenizer.json")
    assert load_tokenizer(tmp_path / "copy").fingerprint == bundled.fingerprint
    # re-serialized by the installed `tokenizers` (merges as pairs, extra default fields): same behaviour
    from tokenizers import Tokenizer as HF

    (tmp_path / "resaved.json").write_text(HF.from_file(str(SHARED_TOKENIZER)).to_str(pretty=True))
    assert load_tokenizer(tmp_path / "resaved.json").fingerprint == bundled.fingerprint


def _modified_tokenizer(tmp_path: Path, name: str, edit) -> Path:
    spec = json.loads(gzip.decompress(bundled_tokenizer_path().read_bytes()))
    edit(spec)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def test_fingerprint_changes_with_content(tmp_path: Path) -> None:
    base = load_tokenizer().fingerprint

    def nfkc(spec: dict) -> None:
        spec["normalizer"] = {"type": "NFKC"}

    def drop_merge(spec: dict) -> None:
        spec["model"]["merges"] = spec["model"]["merges"][:-1]

    fps = {load_tokenizer(_modified_tokenizer(tmp_path, n, f)).fingerprint for n, f in [("a", nfkc), ("b", drop_merge)]}
    assert base not in fps and len(fps) == 2


def test_pickle_roundtrip() -> None:
    tok = load_tokenizer()
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.encode(TEXT) == tok.encode(TEXT)
    assert (clone.fingerprint, clone.eod_id, clone.vocab_size) == (tok.fingerprint, tok.eod_id, tok.vocab_size)


def _train_sentencepiece(tmp_path: Path) -> Path:
    import sentencepiece as spm

    corpus = tmp_path / "sp.txt"
    words = "the quick brown fox jumps over the lazy dog while a cat naps in warm sun".split()
    rng = np.random.default_rng(0)
    corpus.write_text("\n".join(" ".join(rng.choice(words, 12)) for _ in range(300)))
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=60, model_type="bpe",
        pad_id=3, minloglevel=2,
    )
    return tmp_path / "sp.model"


def test_sentencepiece_tokenizer(tmp_path: Path) -> None:
    model = _train_sentencepiece(tmp_path)
    tok = load_tokenizer(model)
    assert tok.kind == "sentencepiece" and tok.name == "sp"
    assert tok.vocab_size == 60
    assert tok.eod_id == 2 and tok.pad_id == 3  # sentencepiece's </s> and the pad we asked for
    text = "the lazy cat jumps over the brown dog"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode_batch([text, "a cat"]) == [ids, tok.encode("a cat")]
    assert load_tokenizer(tmp_path).fingerprint == tok.fingerprint  # folder with a single .model
    assert tok.fingerprint != load_tokenizer().fingerprint
    assert pickle.loads(pickle.dumps(tok)).encode(text) == ids


def test_bad_tokenizer_paths_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError, match="nope.json"):
        load_tokenizer(tmp_path / "nope.json")
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="broken.json"):
        load_tokenizer(bad)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(InputNotFoundError, match="empty_dir"):
        load_tokenizer(tmp_path / "empty_dir")


def test_a_transformers_tokenizer_becomes_the_one_tokenizer_class_with_the_same_ids():
    """Evaluation holds transformers' ``AutoTokenizer`` objects; ``as_tokenizer`` gives the project's
    :class:`Tokenizer` over the same backend: the same ids, lossless decoding, EOD and padding from it."""
    from tokenizers import Tokenizer as Backend
    from transformers import PreTrainedTokenizerFast

    from adaponder.data.tokenizer import as_tokenizer

    bundled = load_tokenizer()
    copy = Backend.from_str(bundled._backend.to_str())  # transformers may set truncation/padding on its backend
    hf = PreTrainedTokenizerFast(tokenizer_object=copy, eos_token="<|endoftext|>")
    tok = as_tokenizer(hf)
    assert isinstance(tok, Tokenizer) and as_tokenizer(hf) is tok and as_tokenizer(tok) is tok
    text = "Hello  world<|endoftext|> — ünïcode\n\ttabs"
    assert tok.encode(text) == hf(text, add_special_tokens=False)["input_ids"] == bundled.encode(text)
    assert tok.decode(tok.encode(text)) == text
    assert tok.eod_id == tok.pad_id == hf.eos_token_id == bundled.eod_id
    assert tok.fingerprint == bundled.fingerprint  # the same tokenizer, recognised as such
    assert tok.ids_of("<|endoftext|>") == [tok.eod_id] and tok.ids_of("") == [] and tok.ids_of("hi") == tok.encode("hi")
    no_eos = PreTrainedTokenizerFast(tokenizer_object=Backend.from_str(bundled._backend.to_str()))
    with pytest.raises(ValueError, match="no end-of-document"):
        as_tokenizer(no_eos)
