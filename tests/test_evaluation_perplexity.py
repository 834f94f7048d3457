"""Sliding-window perplexity: windows cover every token once, scores equal a direct forward, bits per byte."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from adaponder.evaluation.perplexity import (
    Document,
    TokenScores,
    bits_per_byte,
    load_documents,
    score_documents,
    sliding_windows,
    summarize,
)
from helpers_evaluation import tiny_model, tiny_tokenizer

TEXT = "The café served crème brûlée 🍮 to forty-two guests.\nThen it closed; nobody knew why.\n"


@pytest.mark.parametrize("n,window,stride", [(1, 8, 4), (7, 8, 4), (8, 8, 4), (9, 8, 4), (100, 16, 5),
                                               (100, 16, 16), (100, 16, 1), (33, 10, 7)])
def test_sliding_windows_score_every_target_exactly_once(n, window, stride):
    windows = sliding_windows(n, window, stride)
    scored = []
    for i, (b, e, k) in enumerate(windows):
        assert 0 <= b < e <= n and e - b <= window and 1 <= k <= e - b
        scored += list(range(e - k, e))  # targets s[t+1] predicted from input positions t in [e-k, e)
        if i > 0:
            assert e - k - b >= min(window - stride, e - k)  # context of the first scored token
    assert scored == list(range(n))


def test_sliding_windows_reject_bad_strides():
    with pytest.raises(ValueError):
        sliding_windows(10, 8, 9)
    with pytest.raises(ValueError):
        sliding_windows(10, 8, 0)
    assert sliding_windows(0, 8, 4) == []


@pytest.fixture(scope="module")
def model_and_tok():
    return tiny_model(max_position_embeddings=256), tiny_tokenizer()


def test_short_text_nll_equals_a_direct_forward(tmp_path, model_and_tok):
    model, tok = model_and_tok
    path = tmp_path / "doc.txt"
    path.write_text(TEXT, encoding="utf-8")
    (doc,) = load_documents(path, tok)
    assert doc.n_bytes == len(TEXT.encode("utf-8"))
    assert doc.ids.tolist() == tok(TEXT, add_special_tokens=False).input_ids
    scores = score_documents(model, [doc], window=64, stride=32, eod_id=tok.eos_token_id)
    ids = torch.tensor([[tok.eos_token_id, *doc.ids.tolist()]])
    with torch.no_grad():
        out = model(input_ids=ids[:, :-1])
    direct = F.cross_entropy(out.logits[0].float(), ids[0, 1:], reduction="none")
    assert len(scores) == len(doc)
    assert scores.position.tolist() == list(range(len(doc)))
    torch.testing.assert_close(torch.from_numpy(scores.nll), direct.double(), rtol=0, atol=1e-5)
    assert scores.exit_pass.tolist() == out.exit_pass[0].tolist()
    s = summarize(scores, [doc], model)
    assert math.isclose(s["ppl"], math.exp(float(direct.mean())), rel_tol=1e-5)


def test_windows_and_batching_do_not_change_scores(model_and_tok):
    model, tok = model_and_tok
    g = torch.Generator().manual_seed(0)
    docs = [Document(f"d{i}", torch.randint(2, 50000, (n,), generator=g).numpy(), n_bytes=4 * n)
            for i, n in enumerate([150, 40, 97])]
    one = score_documents(model, docs, window=64, stride=24, batch_size=1, eod_id=0)
    many = score_documents(model, docs, window=64, stride=24, batch_size=5, eod_id=0)
    assert len(one) == sum(len(d) for d in docs)
    np.testing.assert_allclose(one.nll, many.nll, rtol=0, atol=1e-5)
    assert np.array_equal(one.exit_pass, many.exit_pass) and np.array_equal(one.token, many.token)
    # a token of a later window: its NLL is that of a direct forward over that window's inputs
    d, t = 0, 120  # window covering target 120 with window=64, stride=24: begin=72, end=136
    seq = torch.tensor([0, *docs[d].ids.tolist()])
    with torch.no_grad():
        logits = model(input_ids=seq[None, 72:136]).logits[0]
    want = F.cross_entropy(logits[t - 72][None].float(), seq[t + 1][None]).item()
    got = one.nll[(one.doc == d) & (one.position == t)].item()
    assert abs(got - want) < 1e-5


def test_bits_per_byte_formula():
    nll = np.array([1.0, 2.0, 0.5, 3.0])
    scores = TokenScores(doc=np.zeros(4, dtype=np.int32), position=np.arange(4), token=np.arange(4), nll=nll,
                         exit_pass=np.array([1, 2, 2, 4]), context=np.full(4, 4), passes=4)
    doc = Document("d", np.arange(4), n_bytes=10)
    s = summarize(scores, [doc])
    assert math.isclose(s["bpb"], 6.5 / math.log(2) / 10)
    assert math.isclose(bits_per_byte(6.5, 10), 6.5 / math.log(2) / 10)
    assert math.isclose(s["ppl"], math.exp(6.5 / 4)) and s["mean_exit"] == 2.25
    assert s["exit_histogram"] == [1, 2, 0, 1]
    with pytest.raises(ValueError):
        bits_per_byte(1.0, 0)


def test_caps_and_prepared_data_folder(tmp_path):
    tok = tiny_tokenizer()
    (tmp_path / "a.txt").write_text(TEXT * 20, encoding="utf-8")
    (tmp_path / "b.txt").write_text(TEXT, encoding="utf-8")
    docs = load_documents(tmp_path, tok, max_tokens=50)
    assert sum(len(d) for d in docs) == 50 and docs[0].name.endswith("a.txt")
    assert docs[0].n_bytes == len(tok.decode(docs[0].ids.tolist()).encode("utf-8"))

    # a folder in adaponder-prepare's layout: documents each followed by EOD, offsets in val.docs.npy
    prep = tmp_path / "prepared"
    prep.mkdir()
    d1, d2 = tok(TEXT, add_special_tokens=False).input_ids, tok("Hello there.", add_special_tokens=False).input_ids
    stream = np.array(d1 + [0] + d2 + [0], dtype="<u2")
    stream.tofile(prep / "val-00000.bin")
    np.save(prep / "val.docs.npy", np.array([0, len(d1) + 1, len(stream)], dtype=np.int64))
    from adaponder.data.errors import TokenizerMismatchError
    from adaponder.data.tokenizer import as_tokenizer

    meta = {"format": "adaponder.packed/v1", "dtype": "<u2", "eod_id": 0, "tokenizer_fingerprint": "x",
            "splits": {"val": {"documents": 2, "shards": [{"file": "val-00000.bin", "tokens": len(stream)}]}}}
    (prep / "meta.json").write_text(json.dumps(meta))
    for packing in ("documents", "stream"):  # prepared with another tokenizer than the model's: refused
        with pytest.raises(TokenizerMismatchError, match="is not the corpus's"):
            load_documents(prep, tok, packing=packing, window=4)
    (prep / "meta.json").write_text(json.dumps({**meta, "tokenizer_fingerprint": as_tokenizer(tok).fingerprint}))
    docs = load_documents(prep, tok)
    assert [d.ids.tolist() for d in docs] == [d1, d2]
    assert [d.n_bytes for d in docs] == [len(TEXT.encode()), len(b"Hello there.")]

    # --packing stream: the split cut like training validation (samples of window + 1 tokens every window)
    (stream_doc,) = load_documents(prep, tok, packing="stream", window=4)
    samples = (len(stream) - 1) // 4
    assert stream_doc.lead == stream[0] and stream_doc.ids.tolist() == stream[1:samples * 4 + 1].tolist()
    assert [(b, e) for b, e, _ in sliding_windows(len(stream_doc), 4, 4)] == [(4 * i, 4 * i + 4) for i in range(samples)]
    (capped,) = load_documents(prep, tok, packing="stream", window=4, max_tokens=9)
    assert len(capped) == 8  # whole samples only
    with pytest.raises(ValueError, match="needs --window"):
        load_documents(prep, tok, packing="stream")
    with pytest.raises(ValueError, match="adaponder-prepare"):
        load_documents(tmp_path / "a.txt", tok, packing="stream", window=4)
