"""Every bad input gets a DataError subclass whose message names the culprit (and line / byte offset)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

from adaponder.data.errors import (
    CorpusTooSmallError,
    DataError,
    DecodingError,
    EmptyInputError,
    InputNotFoundError,
    RecordError,
    ShardError,
    StateError,
    TokenizerMismatchError,
    VocabRangeError,
)
from adaponder.data.loader import PackedLoader
from adaponder.data.prepare import prepare
from adaponder.data.tokenizer import load_tokenizer


def run(inputs, out: Path, **kw):
    return prepare([str(i) for i in inputs], out, progress=False, **kw)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small prepared corpus: 20 documents, ~1,000 tokens, several train shards."""
    root = tmp_path_factory.mktemp("prepared")
    src = root / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": f"Document {i}: " + "some words here. " * 10}) + "\n" for i in range(20)))
    run([src], root / "data", val_fraction=0.1, shard_tokens=300)
    return root / "data"


def test_all_errors_are_value_errors() -> None:
    for cls in (InputNotFoundError, EmptyInputError, DecodingError, RecordError, CorpusTooSmallError,
                TokenizerMismatchError, VocabRangeError, ShardError, StateError):
        assert issubclass(cls, DataError) and issubclass(cls, ValueError)


def test_empty_file(tmp_path: Path) -> None:
    for name, content in [("empty.txt", b""), ("blank.txt", b" \n\t\n"), ("empty.jsonl", b""),
                          ("empty.txt.gz", gzip.compress(b""))]:
        (tmp_path / name).write_bytes(content)
        with pytest.raises(EmptyInputError, match=re.escape(str(tmp_path / name))):
            run([tmp_path / name], tmp_path / "out")
    (tmp_path / "noempty.jsonl").write_text('{"text": ""}\n\n{"text": null}\n')
    with pytest.raises(EmptyInputError, match="noempty.jsonl: no non-empty documents"):
        run([tmp_path / "noempty.jsonl"], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_path_and_folder_or_glob_matching_nothing(tmp_path: Path) -> None:
    with pytest.raises(InputNotFoundError, match=re.escape(str(tmp_path / "nope.txt")) + ".*does not exist"):
        run([tmp_path / "nope.txt"], tmp_path / "out")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "README.md").write_text("not an input file")
    with pytest.raises(InputNotFoundError, match=re.escape(str(folder)) + ".*no input files"):
        run([folder], tmp_path / "out")
    pattern = str(tmp_path / "*.jsonl")
    with pytest.raises(InputNotFoundError, match=re.escape(repr(pattern)) + " matched no input files"):
        run([pattern], tmp_path / "out")


def test_invalid_utf8_strict_names_file_and_byte_offset(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes("héllo ".encode() + b"\xff\xfe world")
    with pytest.raises(DecodingError, match=re.escape(str(bad)) + ": byte offset 7: invalid UTF-8.*errors='replace'"):
        run([bad], tmp_path / "out")
    gz = tmp_path / "bad.txt.gz"
    gz.write_bytes(gzip.compress(b"ok \x80"))
    with pytest.raises(DecodingError, match=re.escape(str(gz)) + r" \(decompressed\): byte offset 3"):
        run([gz], tmp_path / "out")
    jl = tmp_path / "bad.jsonl"
    jl.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')  # latin-1 e-acute on line 2, at byte 17 + 13
    with pytest.raises(DecodingError, match=re.escape(str(jl)) + ": line 2: byte offset 30"):
        run([jl], tmp_path / "out")


def test_invalid_utf8_replace_counts_replacements(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"abc \xff\xfe def \x80")
    meta = run([bad], tmp_path / "out", errors="replace", val_fraction=0)
    assert meta["replacements"] == 3 and meta["sources"][0]["replacements"] == 3
    stream = np.fromfile(tmp_path / "out" / "train-00000.bin", dtype=np.uint16)
    assert load_tokenizer().decode(stream) == "abc \ufffd\ufffd def \ufffd<|endoftext|>"


def test_jsonl_line_not_json_or_without_text_field(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b"}\n{"text": "c", oops}\n')
    with pytest.raises(RecordError, match=re.escape(str(path)) + ": line 3: not valid JSON"):
        run([path], tmp_path / "out")
    path.write_text('{"text": "a"}\n\n{"body": "b", "id": 7}\n')
    with pytest.raises(RecordError, match=re.escape(str(path)) + r": line 3: record has no 'text' field \(keys: 'body', 'id'\)"):
        run([path], tmp_path / "out")
    with pytest.raises(RecordError, match="line 1: record has no 'body' field"):
        run([path], tmp_path / "out", text_field="body")
    path.write_text('["a list"]\n')
    with pytest.raises(RecordError, match="line 1: expected a JSON object"):
        run([path], tmp_path / "out")
    path.write_text('{"text": 42}\n')
    with pytest.raises(RecordError, match="line 1: field 'text' is int, expected a string"):
        run([path], tmp_path / "out")


def test_parquet_without_text_column(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": ["x"]}), path)
    with pytest.raises(RecordError, match=re.escape(str(path)) + r": no column 'text' \(columns: body\)"):
        run([path], tmp_path / "out")


def test_corrupt_compressed_file(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"text": "hello"}\n' * 1000)[:60])
    with pytest.raises(DataError, match=re.escape(str(path)) + ": cannot read jsonl.gz"):
        run([path], tmp_path / "out")


def test_corpus_shorter_than_one_sample(prepared: Path) -> None:
    n = json.loads((prepared / "meta.json").read_text())["splits"]["val"]["tokens"]
    with pytest.raises(CorpusTooSmallError, match=re.escape(str(prepared)) + f" split 'val' holds no samples.*it has {n} tokens.*seq_len"):
        PackedLoader(prepared, split="val", seq_len=n, micro_batch_size=1)
    PackedLoader(prepared, split="val", seq_len=n - 1, micro_batch_size=1)  # exactly one sample is fine
    with pytest.raises(CorpusTooSmallError, match="each of 2 ranks"):
        PackedLoader(prepared, split="val", seq_len=n - 1, micro_batch_size=1, rank=1, world_size=2)


def test_tokenizer_fingerprint_mismatch(prepared: Path) -> None:
    recorded = load_tokenizer().fingerprint
    with pytest.raises(TokenizerMismatchError) as info:
        PackedLoader(prepared, seq_len=8, micro_batch_size=2, tokenizer_fingerprint="f" * 64)
    msg = str(info.value)
    assert str(prepared) in msg and recorded in msg and "f" * 64 in msg and "gpt-neox-20b" in msg
    PackedLoader(prepared, seq_len=8, micro_batch_size=2, tokenizer_fingerprint=load_tokenizer())  # accepted


def test_token_ids_beyond_model_vocab(prepared: Path) -> None:
    max_id = json.loads((prepared / "meta.json").read_text())["max_token_id"]
    with pytest.raises(VocabRangeError, match=re.escape(str(prepared)) + f": token ids go up to {max_id}.*{max_id} ids"):
        PackedLoader(prepared, seq_len=8, micro_batch_size=2, vocab_size=max_id)
    PackedLoader(prepared, seq_len=8, micro_batch_size=2, vocab_size=max_id + 1)


def _copy(prepared: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(prepared, dst)
    return dst


def test_truncated_missing_shard_and_missing_meta(prepared: Path, tmp_path: Path) -> None:
    data = _copy(prepared, tmp_path / "d1")
    shard = data / "train-00001.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(ShardError, match=re.escape(str(shard)) + " is truncated: 598 bytes, expected 600"):
        PackedLoader(data, seq_len=8, micro_batch_size=2)
    shard.unlink()
    with pytest.raises(ShardError, match=re.escape(str(shard)) + " is missing"):
        PackedLoader(data, seq_len=8, micro_batch_size=2)
    (data / "meta.json").unlink()
    with pytest.raises(ShardError, match=re.escape(str(data / "meta.json")) + " is missing"):
        PackedLoader(data, seq_len=8, micro_batch_size=2)
    with pytest.raises(ShardError, match="does not exist"):
        PackedLoader(tmp_path / "never-prepared", seq_len=8)


def test_corrupted_shard_caught_by_checksum(prepared: Path, tmp_path: Path) -> None:
    data = _copy(prepared, tmp_path / "d2")
    shard = data / "train-00000.bin"
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 1
    shard.write_bytes(bytes(raw))
    PackedLoader(data, seq_len=8, micro_batch_size=2)  # sizes are fine: only a checksum can tell
    with pytest.raises(ShardError, match=re.escape(str(shard)) + ": sha256"):
        PackedLoader(data, seq_len=8, micro_batch_size=2, verify_checksums=True)


def test_state_from_another_setup(prepared: Path) -> None:
    a = PackedLoader(prepared, seq_len=8, micro_batch_size=2, seed=1)
    b = PackedLoader(prepared, seq_len=8, micro_batch_size=2, seed=2)
    with pytest.raises(StateError, match="seed is 1 in the state but 2 here"):
        b.load_state_dict(a.state_dict())
    c = PackedLoader(prepared, seq_len=16, micro_batch_size=2, seed=1)
    with pytest.raises(StateError, match="seq_len"):
        c.load_state_dict(a.state_dict())
