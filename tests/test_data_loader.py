"""PackedLoader: packing, determinism, rank split, exact resume, evaluation pass, decoding back to text."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from adaponder.data import bundled_corpus_files
from adaponder.data.errors import StateError
from adaponder.data.loader import PackedLoader, iter_eval_batches
from adaponder.data.prepare import prepare
from adaponder.data.tokenizer import load_tokenizer

SEQ = 32
WORDS = "the a ponder loop halts when the cumulative probability crosses one minus epsilon and then".split()


def synthetic_docs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        sentences = [" ".join(rng.choice(WORDS, rng.integers(4, 12))).capitalize() + "." for _ in range(rng.integers(2, 9))]
        docs.append(f"Doc {i}. " + " ".join(sentences) + ("\n" if i % 3 else "\r\n\n"))
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """~5,000 tokens in 60 documents, train split spread over several small shards."""
    root = tmp_path_factory.mktemp("loader")
    docs = synthetic_docs(60)
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    prepare([str(root / "docs.jsonl")], root / "data", val_fraction=0.1, shard_tokens=1000, progress=False)
    return root / "data", docs


def loader(data: Path, **kw) -> PackedLoader:
    kw.setdefault("seq_len", SEQ)
    kw.setdefault("micro_batch_size", 4)
    return PackedLoader(data, **kw)


def take(it, n: int) -> list[torch.Tensor]:
    return [next(it) for _ in range(n)]


def split_stream(data: Path, split: str) -> np.ndarray:
    meta = json.loads((data / "meta.json").read_text())
    return np.concatenate([np.fromfile(data / s["file"], dtype=meta["dtype"]) for s in meta["splits"][split]["shards"]])


def test_batches_are_packed_windows(corpus) -> None:
    data, _ = corpus
    ld = loader(data)
    stream = split_stream(data, "train")
    assert len(ld._shards) > 1  # windows cross shard boundaries below
    assert ld.num_samples == (len(stream) - 1) // SEQ and ld.samples_per_epoch == ld.num_samples
    batch = next(iter(ld))
    assert batch.dtype == torch.int64 and batch.shape == (4, SEQ + 1)
    for i in range(ld.num_samples):  # window i = stream[i*SEQ : (i+1)*SEQ + 1]; neighbours share a token
        assert np.array_equal(ld.sample(i).numpy(), stream[i * SEQ : (i + 1) * SEQ + 1])
    order = ld.epoch_indices(0)
    assert torch.equal(batch, torch.stack([ld.sample(int(i)) for i in order[:4]]))


def test_same_seed_same_batches_other_seed_other_order(corpus) -> None:
    data, _ = corpus
    a, b, c = (take(iter(loader(data, seed=s)), 12) for s in (5, 5, 6))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_epochs_are_reshuffled_and_never_end(corpus) -> None:
    data, _ = corpus
    ld = loader(data, micro_batch_size=7)
    e0, e1 = ld.epoch_indices(0), ld.epoch_indices(1)
    assert sorted(e0) == sorted(e1) == list(range(ld.num_samples)) and not np.array_equal(e0, e1)
    n = 3 * ld.batches_per_epoch
    batches = take(iter(ld), n)  # runs past the end of epoch 0 without stopping
    assert ld.epoch >= 2 and all(b.shape == (7, SEQ + 1) for b in batches)
    # the sample stream is epoch 0's order, then epoch 1's, ... (batches may straddle epochs)
    flat = torch.cat(batches)
    expected = np.concatenate([ld.epoch_indices(e) for e in range(4)])[: len(flat)]
    assert torch.equal(flat, torch.stack([ld.sample(int(i)) for i in expected]))


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_deal_out_micro_batches_of_one_global_stream(corpus, world_size: int) -> None:
    data, _ = corpus
    m = 5
    loaders = [loader(data, rank=r, world_size=world_size, seed=11, micro_batch_size=m) for r in range(world_size)]
    single = loader(data, seed=11, micro_batch_size=m)  # 1 rank reads the same stream, micro-batch after micro-batch
    rounds = 2 * loaders[0].num_samples // (m * world_size) + 1  # > 2 epochs: batches straddle epoch ends
    its = [iter(ld) for ld in loaders]
    one = iter(single)
    seen = []
    for _ in range(rounds):  # round k: rank r reads global micro-batch k·world + r
        for it in its:
            batch = next(it)
            assert torch.equal(batch, next(one))
            seen.append(batch)
    assert len({ld.state_dict()["position"] for ld in [*loaders, single]}) == 1  # one state for all
    # within one epoch the ranks' samples are disjoint and together cover every window (nothing dropped)
    n = loaders[0].num_samples
    order = np.random.default_rng([11, 0]).permutation(n)  # documented rule
    assert np.array_equal(loaders[0].epoch_indices(0), order)
    first_epoch = torch.cat(seen)[:n]
    assert torch.equal(first_epoch, torch.stack([loaders[0].sample(int(i)) for i in order]))


def test_resume_on_another_world_size_continues_the_global_stream(corpus) -> None:
    data, _ = corpus
    ref = take(iter(loader(data, seed=4)), 30)  # 1 rank: global micro-batches 0..29
    two = [loader(data, seed=4, rank=r, world_size=2) for r in (0, 1)]
    its = [iter(ld) for ld in two]
    for k in range(5):  # 2 ranks read global micro-batches 0..9
        assert all(torch.equal(next(it), ref[2 * k + r]) for r, it in enumerate(its))
    one = loader(data, seed=4)
    one.load_state_dict(two[1].state_dict())  # 2 ranks -> 1 rank
    assert all(torch.equal(x, y) for x, y in zip(take(iter(one), 10), ref[10:20]))
    again = [loader(data, seed=4, rank=r, world_size=2) for r in (0, 1)]  # 1 rank -> 2 ranks
    for ld in again:
        ld.load_state_dict(one.state_dict())
    its = [iter(ld) for ld in again]
    for k in range(5):
        assert all(torch.equal(next(it), ref[20 + 2 * k + r]) for r, it in enumerate(its))


def test_a_v1_state_continues_after_the_samples_it_had_read(corpus) -> None:
    data, _ = corpus
    ref = torch.cat(take(iter(loader(data, seed=2)), 6))  # 1 rank: v1 and the global stream read alike
    ld = loader(data, seed=2)
    ld.load_state_dict({**ld.state_dict(), "format": "adaponder.PackedLoader/v1", "position": 3})  # 3 samples read
    assert torch.equal(next(iter(ld)), ref[3:7])
    two = loader(data, seed=2, rank=1, world_size=2)
    v1 = {**two.state_dict(), "format": "adaponder.PackedLoader/v1", "position": two.num_samples // 2}
    two.load_state_dict(v1)  # v1's epoch end (its ranks dropped the odd sample): the next epoch
    assert (two.epoch, two.position) == (1, 0)
    with pytest.raises(StateError, match="world_size"):  # v1 positions are per rank: same world size only
        loader(data, seed=2).load_state_dict(v1)
    end = ld.num_samples  # v2 positions count all ranks' samples
    with pytest.raises(StateError, match=rf"position {end + 1} of epoch 0 is out of range \(0\.\.{end}\)"):
        ld.load_state_dict({**ld.state_dict(), "epoch": 0, "position": end + 1})
    with pytest.raises(TypeError, match="an infinite PackedLoader has no length"):
        len(ld)


def test_resume_is_exact(corpus, tmp_path: Path) -> None:
    data, _ = corpus
    ref = take(iter(loader(data, seed=3, micro_batch_size=6)), 40)  # > 1 epoch: crosses an epoch boundary
    for n_before in (0, 1, 17, 23):
        first = loader(data, seed=3, micro_batch_size=6)
        it = iter(first)
        take(it, n_before)
        state = first.state_dict()
        torch.save(state, tmp_path / "state.pt")
        json.dumps(state)  # plain values
        fresh = loader(data, seed=3, micro_batch_size=6)
        fresh.load_state_dict(torch.load(tmp_path / "state.pt"))
        assert fresh.epoch == first.epoch
        resumed = take(iter(fresh), 12)
        assert all(torch.equal(x, y) for x, y in zip(resumed, ref[n_before : n_before + 12]))
        assert all(torch.equal(x, y) for x, y in zip(take(it, 12), resumed))  # the original keeps going too


def test_resume_with_another_micro_batch_size_continues_the_sample_stream(corpus) -> None:
    data, _ = corpus
    ref = torch.cat(take(iter(loader(data, micro_batch_size=4)), 10))
    a = loader(data, micro_batch_size=4)
    take(iter(a), 3)
    b = loader(data, micro_batch_size=2)
    b.load_state_dict(a.state_dict())
    assert torch.equal(torch.cat(take(iter(b), 14)), ref[12:40])


def test_eval_pass_is_finite_ordered_and_repeatable(corpus) -> None:
    data, _ = corpus
    ld = loader(data, split="val", shuffle=False, infinite=False, micro_batch_size=3)
    first = list(ld)
    assert len(first) == len(ld) == -(-ld.num_samples // 3) and first[-1].shape[0] == (ld.num_samples - 1) % 3 + 1
    assert torch.equal(torch.cat(first), torch.stack([ld.sample(i) for i in range(ld.num_samples)]))
    assert all(torch.equal(x, y) for x, y in zip(first, list(ld)))  # next pass: same order
    ev = list(iter_eval_batches(data, seq_len=SEQ, micro_batch_size=3))
    assert all(torch.equal(x, y) for x, y in zip(first, ev)) and len(ev) == len(first)
    assert len(list(iter_eval_batches(data, SEQ, 3, max_batches=2))) == 2
    r0, r1 = (list(iter_eval_batches(data, SEQ, 2, rank=r, world_size=2)) for r in (0, 1))
    dealt = [b for pair in zip(r0, r1) for b in pair] + r0[len(r1):]  # rank 0 may read one more batch
    assert len(r0) - len(r1) in (0, 1) and torch.equal(torch.cat(dealt), torch.cat(first))  # alternate batches
    with pytest.raises(TypeError):
        len(loader(data))


def _reassemble(windows: list[torch.Tensor]) -> list[int]:
    """Undo the packing: windows share their boundary token."""
    ids = windows[0].tolist()
    for w in windows[1:]:
        ids += w[1:].tolist()
    return ids


def test_decoding_prepared_samples_reproduces_the_source_text(corpus, tmp_path: Path) -> None:
    tok = load_tokenizer()
    # synthetic documents: the packed stream decodes back to the documents of the split, EOD-separated
    data, docs = corpus
    for split in ("train", "val"):
        ld = loader(data, split=split, shuffle=False, infinite=False, micro_batch_size=8)
        ids = _reassemble([row for b in ld for row in b])
        stream = split_stream(data, split)
        assert ids == stream[: len(ids)].tolist() and len(stream) - len(ids) < SEQ  # all but the short tail
        pieces = tok.decode(ids).split("<|endoftext|>")
        assert all(p in docs for p in pieces[:-1]) and any(d.startswith(pieces[-1]) for d in docs)
    # a real book: Alice's Adventures in Wonderland from the bundled corpus (CRLF line endings, BOM dropped)
    alice = next(f for f in bundled_corpus_files() if f.name == "11-0.txt.gz")
    source = gzip.decompress(alice.read_bytes()).decode("utf-8").removeprefix("\ufeff")
    prepare([str(alice)], tmp_path / "alice", val_fraction=0, progress=False)
    ld = PackedLoader(tmp_path / "alice", seq_len=512, micro_batch_size=4, seed=1)
    assert tok.decode(split_stream(tmp_path / "alice", "train")) == source + "<|endoftext|>"
    for batch in [next(iter(ld)) for _ in range(3)]:
        for row in batch:
            piece = tok.decode(row).removesuffix("<|endoftext|>").strip("\ufffd")  # window edges may cut a char
            assert len(piece) > 1000 and piece in source
