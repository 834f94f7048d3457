"""prepare(): input formats, exact token counts, metadata, split, sharding, atomic output, CLI."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import adaponder.data.prepare as prep_mod
from adaponder.cli.prepare import main
from adaponder.data import bundled_corpus_dir, bundled_corpus_files
from adaponder.data.errors import DataError
from adaponder.data.prepare import prepare
from adaponder.data.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
GUTENBERG = REPO.parent / "shared/data/corpus/gutenberg"
DOCS = [
    "The first document.\nIt has two lines.",
    "Second one — with “unicode” and a tab\there.",
    "Third:   spaces   galore\r\nand CRLF.",
    "Fourth document, short.",
]


def expected_tokens(texts: list[str]) -> int:
    tok = load_tokenizer()
    return sum(len(tok.encode(t)) + 1 for t in texts)


def read_split(out: Path, split: str) -> np.ndarray:
    meta = json.loads((out / "meta.json").read_text())
    arrays = [np.fromfile(out / s["file"], dtype=meta["dtype"]) for s in meta["splits"][split]["shards"]]
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=meta["dtype"])


def write_jsonl(path: Path, records: list[dict], opener=open) -> Path:
    with opener(path, "wt", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


def test_text_jsonl_parquet_and_datasets_inputs(tmp_path: Path) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    src = tmp_path / "src"
    (src / "nested").mkdir(parents=True)
    (src / "a.txt").write_text(DOCS[0], encoding="utf-8")
    (src / "nested" / "b.txt.gz").write_bytes(gzip.compress(DOCS[1].encode()))
    (src / "README.md").write_text("not data: folders only take data suffixes")
    write_jsonl(tmp_path / "c.jsonl", [{"text": DOCS[2], "meta": 1}, {"text": ""}, {"text": DOCS[3]}])
    write_jsonl(tmp_path / "d.jsonl.gz", [{"content": DOCS[0]}], opener=gzip.open)
    with open(tmp_path / "e.jsonl.zst", "wb") as f:
        f.write(zstandard.ZstdCompressor().compress((json.dumps({"text": DOCS[1]}) + "\n").encode()))
    pq.write_table(pa.table({"text": [DOCS[2], None, DOCS[3]]}), tmp_path / "f.parquet")
    datasets.Dataset.from_dict({"text": [DOCS[0], DOCS[1]]}).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"text": [DOCS[2]]}), "test": datasets.Dataset.from_dict({"text": [DOCS[3]]})}
    ).save_to_disk(str(tmp_path / "dsdict"))

    meta = prepare([str(src)], tmp_path / "o1", progress=False)
    assert meta["documents"] == 2 and meta["tokens"] == expected_tokens(DOCS[:2])
    assert [Path(s["path"]).name for s in meta["sources"]] == ["a.txt", "b.txt.gz"]

    meta = prepare([str(tmp_path / "[ce].jsonl*")], tmp_path / "o2", progress=False)
    assert meta["documents"] == 3 and meta["skipped_empty"] == 1
    assert meta["tokens"] == expected_tokens([DOCS[2], DOCS[3], DOCS[1]])
    with pytest.raises(DataError, match="d.jsonl.gz: line 1"):
        prepare([str(tmp_path / "d.jsonl.gz")], tmp_path / "o3", progress=False)
    meta = prepare([str(tmp_path / "d.jsonl.gz")], tmp_path / "o3", text_field="content", progress=False)
    assert meta["tokens"] == expected_tokens([DOCS[0]])

    meta = prepare([str(tmp_path / "f.parquet"), str(tmp_path / "ds"), str(tmp_path / "dsdict")],
                   tmp_path / "o4", progress=False)
    assert [s["format"] for s in meta["sources"]] == ["parquet", "hf_dataset", "hf_dataset"]
    assert meta["sources"][2]["splits"] == ["train", "test"]
    assert meta["documents"] == 6 and meta["skipped_empty"] == 1
    assert meta["tokens"] == expected_tokens([DOCS[2], DOCS[3], DOCS[0], DOCS[1], DOCS[2], DOCS[3]])


@pytest.mark.integration
@pytest.mark.skipif(not GUTENBERG.is_dir(), reason="offline data pack not available")
def test_real_books_token_count_is_exact_with_2_workers(tmp_path: Path) -> None:
    books = [GUTENBERG / n for n in ("41-0.txt", "pg844.txt", "43-0.txt")]  # the 3 smallest, 400 KB
    tok = load_tokenizer()
    direct = sum(len(tok.encode(b.read_bytes().decode("utf-8").removeprefix("\ufeff"))) + 1 for b in books)
    m2 = prepare([str(b) for b in books], tmp_path / "w2", num_workers=2, progress=False)
    m1 = prepare([str(b) for b in books], tmp_path / "w1", num_workers=1, progress=False)
    assert m2["tokens"] == m1["tokens"] == direct
    assert m2["timing"]["num_workers"] == 2 and m2["timing"]["tokens_per_second"] > 0
    for split in ("train", "val"):  # output does not depend on the number of workers
        assert np.array_equal(read_split(tmp_path / "w1", split), read_split(tmp_path / "w2", split))


def test_metadata_layout_and_hashes(tmp_path: Path) -> None:
    files = []
    for i, d in enumerate(DOCS):
        files.append(tmp_path / f"doc{i}.txt")
        files[-1].write_text(d, encoding="utf-8")
    out = tmp_path / "out"
    meta = prepare([str(f) for f in files], out, val_fraction=0.25, seed=3, progress=False)
    on_disk = json.loads((out / "meta.json").read_text())
    assert on_disk["tokens"] == meta["tokens"] == expected_tokens(DOCS)
    tok = load_tokenizer()
    assert on_disk["tokenizer_fingerprint"] == tok.fingerprint and on_disk["vocab_size"] == 50277
    assert on_disk["dtype"] == "uint16" and on_disk["eod_id"] == 0 and on_disk["documents"] == 4
    assert sorted(p.name for p in out.iterdir()) == [
        "meta.json", "train-00000.bin", "train.docs.npy", "val-00000.bin", "val.docs.npy"]
    for src, f in zip(on_disk["sources"], files):
        assert src["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest() and src["bytes"] == f.stat().st_size
    assert sum(s["tokens"] for s in on_disk["sources"]) == on_disk["tokens"]
    tr, va = on_disk["splits"]["train"], on_disk["splits"]["val"]
    assert (tr["documents"], va["documents"]) == (3, 1) and tr["tokens"] + va["tokens"] == on_disk["tokens"]
    for split, info in on_disk["splits"].items():
        stream = read_split(out, split)
        assert len(stream) == info["tokens"] and (stream == 0).sum() == info["documents"]  # one EOD per doc
        starts = np.load(out / info["docs_index"])
        assert starts[0] == 0 and starts[-1] == len(stream) and np.all(stream[starts[1:] - 1] == 0)
        for shard in info["shards"]:
            assert shard["sha256"] == hashlib.sha256((out / shard["file"]).read_bytes()).hexdigest()
    # decoding the split streams gives back the documents
    texts = [tok.decode(read_split(out, s)) for s in ("train", "val")]
    assert sorted("".join(texts).split("<|endoftext|>")[:-1]) == sorted(DOCS)


def test_val_split_is_document_level_and_seeded(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "docs.jsonl", [{"text": f"document number {i}"} for i in range(10)])

    def val_docs(seed: int, frac: float, name: str) -> list[int]:
        out = tmp_path / name
        prepare([str(path)], out, val_fraction=frac, seed=seed, progress=False)
        text = load_tokenizer().decode(read_split(out, "val"))
        return sorted(int(t.split()[-1]) for t in text.split("<|endoftext|>")[:-1])

    first = val_docs(0, 0.01, "a")
    assert len(first) == 1  # at least one validation document
    assert val_docs(0, 0.01, "b") == first  # same seed, same split
    assert len({tuple(val_docs(s, 0.3, f"s{s}")) for s in range(4)}) > 1  # the seed matters
    assert len(val_docs(0, 0.3, "c")) == 3
    assert val_docs(0, 0.0, "d") == []
    (tmp_path / "single.txt").write_text("just one document")
    one = prepare([str(tmp_path / "single.txt")], tmp_path / "one", progress=False)
    assert one["splits"]["val"]["documents"] == 0 and one["splits"]["val"]["shards"] == []


def test_large_vocab_uses_uint32(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as HF
    from tokenizers import models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(70_000)}}
    hf = HF(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "d.txt").write_text("w5 w69999 w65536 w3")
    meta = prepare([str(tmp_path / "d.txt")], tmp_path / "out", tokenizer=str(tmp_path), progress=False)
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 70_002 and meta["max_token_id"] == 70_001
    assert read_split(tmp_path / "out", "train").tolist() == [7, 70_001, 65_538, 5, 0]


def test_small_shards_concatenate_to_the_stream(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in DOCS * 5])
    meta = prepare([str(path)], tmp_path / "a", val_fraction=0, shard_tokens=17, progress=False)
    ref = prepare([str(path)], tmp_path / "b", val_fraction=0, progress=False)
    shards = meta["splits"]["train"]["shards"]
    assert len(shards) == -(-meta["tokens"] // 17) and all(s["tokens"] == 17 for s in shards[:-1])
    assert np.array_equal(read_split(tmp_path / "a", "train"), read_split(tmp_path / "b", "train"))
    assert ref["tokens"] == meta["tokens"] == expected_tokens(DOCS * 5)


def test_interrupted_run_leaves_nothing_that_looks_valid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in DOCS])
    real = prep_mod._write_splits

    def crash(*args, **kwargs):
        real(*args, **kwargs)  # shards are written ...
        raise KeyboardInterrupt  # ... then the run dies before meta.json / rename

    monkeypatch.setattr(prep_mod, "_write_splits", crash)
    with pytest.raises(KeyboardInterrupt):
        prepare([str(path)], tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl"]  # temporary folder removed too
    monkeypatch.undo()

    prepare([str(path)], tmp_path / "out", progress=False)
    with pytest.raises(DataError, match="not empty.*overwrite"):
        prepare([str(path)], tmp_path / "out", progress=False)
    meta = prepare([str(path)], tmp_path / "out", val_fraction=0, progress=False, overwrite=True)
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["val_fraction"] == meta["val_fraction"] == 0
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "thesis.tex").write_text("x")
    with pytest.raises(DataError, match="refusing"):
        prepare([str(path)], tmp_path / "precious", progress=False, overwrite=True)


def test_bundled_corpus_is_small_licensed_and_prepares(tmp_path: Path) -> None:
    files = bundled_corpus_files()
    assert len(files) >= 3 and sum(f.stat().st_size for f in files) <= 5 * 2**20
    readme = (bundled_corpus_dir() / "README.md").read_text()
    assert "public domain" in readme and all(f.name in readme for f in files)
    alice = next(f for f in files if f.name == "11-0.txt.gz")
    meta = prepare([str(alice)], tmp_path / "alice", progress=False)
    text = gzip.decompress(alice.read_bytes()).decode("utf-8").removeprefix("\ufeff")
    assert meta["tokens"] == expected_tokens([text])


def test_cli_prints_tokens_per_second(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.txt").write_text(DOCS[0])
    (tmp_path / "b.txt").write_text(DOCS[1])
    rc = main([str(tmp_path / "*.txt"), "-o", str(tmp_path / "out"), "-j", "1", "--no-progress", "--seed", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "tokens/s" in out and f"{expected_tokens(DOCS[:2]):,} tokens" in out
    rc = main([str(tmp_path / "missing.txt"), "-o", str(tmp_path / "out2"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "missing.txt" in err and "error" in err


@pytest.mark.integration
def test_module_entry_point_help() -> None:
    res = subprocess.run([sys.executable, "-m", "adaponder.cli.prepare", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "--text-field" in res.stdout and "--bundled" in res.stdout
