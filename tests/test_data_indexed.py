"""Megatron / GPT-NeoX indexed datasets as a training source (adaponder.data.indexed).

Fixture files are written with megatron-core's ``IndexedDatasetBuilder`` and every sample the loader gives
is compared with what megatron-core's own reader (``IndexedDataset``) says it must be: ``sequences`` order
(global batch b = items b·G … b·G+G−1, Megatron's micro-batch grouping across ranks) and ``documents`` order
(documents + EOD, packed into windows, shuffled by (seed, epoch) like PackedLoader), on 1 and 2 ranks, across
an epoch boundary, and after a mid-epoch resume.
"""

import os
import warnings

import numpy as np
import pytest
import torch

from adaponder.data.errors import CorpusTooSmallError, DataError, InputNotFoundError, ShardError, StateError, \
    VocabRangeError
from adaponder.data.indexed import IndexedDataset, IndexedLoader, iter_indexed_eval_batches, write_indexed

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": irrelevant to the data code
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import IndexedDataset as MegatronDataset
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

SEQ = 16  # seq_len; items of the sequences fixture have SEQ + 1 tokens
EOD = 0
VOCAB = 500


def _build(prefix, documents, dtype=np.uint16):
    """documents: list of documents, each a list of items (1-D int arrays), written with megatron-core."""
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for items in documents:
        for item in items:
            builder.add_item(torch.as_tensor(np.asarray(item, dtype=np.int64)))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


@pytest.fixture(scope="module")
def seq_data(tmp_path_factory):
    """37 ready samples of SEQ + 1 tokens (Pythia's pre-shuffled layout: one document per item)."""
    rng = np.random.default_rng(1)
    prefix = tmp_path_factory.mktemp("seq") / "pile_like"
    docs = [[rng.integers(1, VOCAB, SEQ + 1)] for _ in range(37)]
    return _build(prefix, docs)


@pytest.fixture(scope="module")
def doc_data(tmp_path_factory):
    """Documents of 0–60 tokens, some made of several items, none ending with EOD."""
    rng = np.random.default_rng(2)
    prefix = tmp_path_factory.mktemp("docs") / "corpus_text_document"
    docs = []
    for k in range(40):
        n_items = 1 + (k % 3 == 0)
        docs.append([rng.integers(1, VOCAB, int(rng.integers(0 if k == 5 else 1, 30))) for _ in range(n_items)])
    return _build(prefix, docs)


def _megatron(prefix):
    return MegatronDataset(prefix)


# -- the reader ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["seq_data", "doc_data"])
def test_reader_equals_megatron_core_reader(which, request):
    prefix = request.getfixturevalue(which)
    ours, ref = IndexedDataset(prefix), _megatron(prefix)
    assert len(ours) == len(ref)
    assert np.array_equal(ours.document_indices, ref.document_indices)
    assert np.array_equal(ours.sequence_lengths, ref.sequence_lengths)
    for i in range(len(ref)):
        assert np.array_equal(ours[i], ref[i]), i
        assert ours[i].dtype == ref[i].dtype
    assert np.array_equal(ours.get(3, 2, 4), ref.get(3, 2, 4))


def test_numpy_writer_writes_the_bytes_of_megatron_core_builder(tmp_path):
    rng = np.random.default_rng(3)
    docs = [[rng.integers(0, 60000, int(rng.integers(1, 9))) for _ in range(1 + k % 2)] for k in range(9)]
    _build(tmp_path / "a", docs)
    write_indexed(tmp_path / "b", [[list(x) for x in d] for d in docs])
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"a{ext}").read_bytes() == (tmp_path / f"b{ext}").read_bytes()


# -- sequences order: Pythia's stream ---------------------------------------------------------------------
def _sequence_reference(ref, micro, world, epochs=3):
    """What rank r reads per micro-step, straight from megatron-core's reader: micro-step j of the stream gives
    rank r items j·m·W + r·m …; the incomplete last group of an epoch is split into W equal contiguous parts."""
    n = (len(ref) // world) * world
    per_rank = {r: [] for r in range(world)}
    for _ in range(epochs):
        full = n // (micro * world)
        for j in range(full):
            for r in range(world):
                per_rank[r] += [j * micro * world + r * micro + i for i in range(micro)]
        each = (n - full * micro * world) // world
        for r in range(world):
            per_rank[r] += [full * micro * world + r * each + i for i in range(each)]
    return per_rank


@pytest.mark.parametrize("world", [1, 2])
def test_sequences_order_sample_by_sample_against_megatron(seq_data, world):
    ref = _megatron(seq_data)
    micro, accum = 3, 2
    expected = _sequence_reference(ref, micro, world)
    loaders = [IndexedLoader(seq_data, "sequences", SEQ, micro, r, world, seed=5, vocab_size=VOCAB)
               for r in range(world)]
    iters = [iter(x) for x in loaders]
    steps = len(expected[0]) // micro  # three epochs: crosses the epoch boundaries
    got = {r: [] for r in range(world)}
    for _ in range(steps):
        for r in range(world):
            batch = next(iters[r])
            assert batch.dtype == torch.int64 and batch.shape == (micro, SEQ + 1)
            got[r].append(batch)
    for r in range(world):
        rows = torch.cat(got[r])
        idx = expected[r][: len(rows)]
        assert len(idx) == len(rows)
        want = torch.from_numpy(np.stack([ref[i] for i in idx]).astype(np.int64))
        assert torch.equal(rows, want)
    # Pythia's global batches: optimizer step b (accum micro-steps on every rank) holds items b·G … b·G+G−1.
    G = micro * accum * world
    for b in range(len(ref) // G):
        rows = torch.cat([got[r][b * accum + m] for m in range(accum) for r in range(world)])
        want = torch.from_numpy(np.stack([ref[i] for i in range(b * G, b * G + G)]).astype(np.int64))
        assert torch.equal(rows.sort(dim=0).values, want.sort(dim=0).values)
        assert {tuple(x) for x in rows.tolist()} == {tuple(x) for x in want.tolist()}


# -- documents order: packed and shuffled like the project's shards ----------------------------------------
def _document_reference(ref, seq_len, eod):
    stream = []
    docs = ref.document_indices
    for k in range(len(docs) - 1):
        tokens = [t for j in range(docs[k], docs[k + 1]) for t in ref[j].tolist()]
        if tokens:  # empty documents are skipped
            stream += tokens + [eod]
    stream = np.asarray(stream, dtype=np.int64)
    n = (len(stream) - 1) // seq_len
    return [stream[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)]


@pytest.mark.parametrize("world", [1, 2])
def test_documents_order_sample_by_sample_against_megatron(doc_data, world):
    windows = _document_reference(_megatron(doc_data), SEQ, EOD)
    n = len(windows)
    seed, micro = 11, 4
    loaders = [IndexedLoader(doc_data, "documents", SEQ, micro, r, world, seed=seed, vocab_size=VOCAB, eod_id=EOD)
               for r in range(world)]
    assert all(x.num_samples == n and x.append_eod for x in loaders)
    per_rank = n // world
    for r, loader in enumerate(loaders):
        it = iter(loader)
        rows = torch.cat([next(it) for _ in range(-(-2 * per_rank // micro))])  # two epochs and a bit
        expected = []
        for epoch in range(3):
            perm = np.arange(n)
            np.random.default_rng([seed, epoch]).shuffle(perm)
            expected += list(perm[: per_rank * world][r::world])
        want = torch.from_numpy(np.stack([windows[i] for i in expected[: len(rows)]]))
        assert torch.equal(rows, want)
    # the ranks' parts of an epoch are disjoint
    parts = [set(x.epoch_indices(0).tolist()) for x in loaders]
    assert sum(map(len, parts)) == len(set().union(*parts)) == per_rank * world


def test_documents_that_end_with_eod_are_not_given_a_second_one(tmp_path):
    rng = np.random.default_rng(4)
    docs = [[list(rng.integers(1, VOCAB, int(rng.integers(3, 20)))) + [EOD]] for _ in range(30)]
    prefix = _build(tmp_path / "eod", docs)
    auto = IndexedLoader(prefix, "documents", SEQ, 2, eod_id=EOD, shuffle=False, infinite=False)
    assert not auto.append_eod
    stream = np.concatenate([np.asarray(d[0]) for d in docs])
    assert torch.equal(auto.sample(1), torch.from_numpy(stream[SEQ: 2 * SEQ + 1].astype(np.int64)))
    forced = IndexedLoader(prefix, "documents", SEQ, 2, eod_id=EOD, append_eod=True)
    assert forced.append_eod and forced.stream_tokens == len(stream) + len(docs)


# -- exact resume -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["sequences", "documents"])
def test_resume_mid_epoch_continues_with_the_exact_next_batch(seq_data, doc_data, order):
    prefix = seq_data if order == "sequences" else doc_data
    world, micro = 2, 3
    for r in range(world):
        a = IndexedLoader(prefix, order, SEQ, micro, r, world, seed=9, vocab_size=VOCAB, eod_id=EOD)
        it = iter(a)
        for _ in range(5):
            next(it)
        state = a.state_dict()
        assert 0 < state["position"] < a.samples_per_rank  # mid-epoch
        rest = [next(it) for _ in range(12)]  # crosses into the next epoch
        b = IndexedLoader(prefix, order, SEQ, micro, r, world, seed=9, vocab_size=VOCAB, eod_id=EOD)
        b.load_state_dict(state)
        it_b = iter(b)
        assert all(torch.equal(x, next(it_b)) for x in rest)
        # a state of another setup is refused
        other = IndexedLoader(prefix, order, SEQ, micro, r, world, seed=10 if order == "documents" else 9,
                              vocab_size=VOCAB, eod_id=EOD, **({} if order == "documents" else {}))
        if order == "documents":
            with pytest.raises(StateError, match="seed"):
                other.load_state_dict(state)
        wrong_mb = IndexedLoader(prefix, order, SEQ, micro + 1, r, world, seed=9, vocab_size=VOCAB, eod_id=EOD)
        if order == "sequences":
            with pytest.raises(StateError, match="micro_batch_size"):
                wrong_mb.load_state_dict(state)
        with pytest.raises(StateError, match="format"):
            b.load_state_dict({**state, "format": "adaponder.PackedLoader/v1"})
        end = b.samples_per_rank  # positions count this rank's samples
        with pytest.raises(StateError, match=rf"position {end + 1} of epoch 0 is out of range \(0\.\.{end}\)"):
            b.load_state_dict({**state, "epoch": 0, "position": end + 1})
        b.load_state_dict({**state, "epoch": 0, "position": end})  # the end of an infinite loader's epoch: the next
        assert (b.epoch, b.position) == (1, 0)
        with pytest.raises(TypeError, match="an infinite IndexedLoader has no length"):
            len(b)


def test_eval_pass_reads_every_sample_once_in_order(seq_data):
    ref = _megatron(seq_data)
    rows = torch.cat(list(iter_indexed_eval_batches(seq_data, "sequences", SEQ, 4, 0, 1, vocab_size=VOCAB)))
    assert torch.equal(rows, torch.from_numpy(np.stack([ref[i] for i in range(len(ref))]).astype(np.int64)))
    assert len(list(iter_indexed_eval_batches(seq_data, "sequences", SEQ, 4, max_batches=2))) == 2


# -- errors -----------------------------------------------------------------------------------------------
def _copy(prefix, dest):
    for ext in (".bin", ".idx"):
        (dest.parent / f"{dest.name}{ext}").write_bytes(open(f"{prefix}{ext}", "rb").read())
    return str(dest)


def test_truncated_bin_is_a_clear_error(seq_data, tmp_path):
    prefix = _copy(seq_data, tmp_path / "cut")
    with open(f"{prefix}.bin", "r+b") as f:
        f.truncate(os.path.getsize(f"{prefix}.bin") - 6)
    with pytest.raises(ShardError, match=r"cut\.bin is truncated: .* bytes, but cut\.idx describes 37 sequences"):
        IndexedLoader(prefix, "sequences", SEQ, 2)


def test_idx_of_another_bin_is_a_clear_error(seq_data, doc_data, tmp_path):
    prefix = _copy(seq_data, tmp_path / "mixed")
    (tmp_path / "mixed.idx").write_bytes(open(f"{doc_data}.idx", "rb").read())
    with pytest.raises(ShardError, match=r"mixed\.bin (is truncated|is longer than its index describes)"):
        IndexedDataset(prefix)
    # an index cut short, and one whose offsets do not follow from its lengths
    idx = open(f"{seq_data}.idx", "rb").read()
    (tmp_path / "mixed.idx").write_bytes(idx[:-8])
    with pytest.raises(ShardError, match="index is truncated or damaged"):
        IndexedDataset(prefix)
    bad = bytearray(idx)
    ptr0 = 34 + 37 * 4 + 8  # second sequence pointer
    bad[ptr0:ptr0 + 8] = (123).to_bytes(8, "little")
    (tmp_path / "mixed.idx").write_bytes(bytes(bad))
    with pytest.raises(ShardError, match="sequence 1 starts at byte 123"):
        IndexedDataset(prefix)
    (tmp_path / "mixed.idx").write_bytes(b"NOTANIDX" + idx[8:])
    with pytest.raises(ShardError, match="not a Megatron index"):
        IndexedDataset(prefix)


def test_missing_files_wrong_lengths_vocab_and_size_errors(seq_data, doc_data, tmp_path):
    with pytest.raises(InputNotFoundError, match=r"nothing\.idx not found"):
        IndexedLoader(tmp_path / "nothing")
    with pytest.raises(DataError, match=r"item 0 has 17 tokens, but data.order 'sequences' .* data.seq_len \+ 1 = 9 tokens"):
        IndexedLoader(seq_data, "sequences", 8, 2)
    with pytest.raises(VocabRangeError, match=r"token ids go up to \d+, beyond the model's vocabulary of 100"):
        IndexedLoader(seq_data, "sequences", SEQ, 2, vocab_size=100)
    with pytest.raises(CorpusTooSmallError, match="too few to give each of 64 ranks one"):
        IndexedLoader(seq_data, "sequences", SEQ, 1, 0, 64)
    with pytest.raises(CorpusTooSmallError, match="holds no windows"):
        IndexedLoader(doc_data, "documents", 100000, 1)
    # an id beyond the vocabulary after the start-up scan is caught when its batch is read
    loader = IndexedLoader(seq_data, "sequences", SEQ, 2, vocab_size=VOCAB)
    loader.vocab_size = 5
    with pytest.raises(VocabRangeError, match="sample 0 .* holds token id"):
        next(iter(loader))
    # token ids of a signed dtype must not be negative
    prefix = _build(tmp_path / "neg", [[np.array([1, -3, 2])]], dtype=np.int32)
    with pytest.raises(VocabRangeError, match="negative token id -3"):
        IndexedLoader(prefix, "documents", 1, 1)
