"""Exit rules are objects every consumer of the pass driver honours, and run-time settings travel per call.

A toy rule defined here alone (tokens with even ids stop after pass 2) reaches the training forward, cached
decoding, depth-batched decoding, static (compilable) decoding, self-speculative decoding, lm-eval scoring and the
PALBERT classifier, with the same exit passes in each. A model's config is unchanged by any call, a saved
``config.json`` holds no run-time setting, and a checkpoint whose ``config.json`` still holds the run-time keys of
earlier versions loads and gives the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from adaponder.modeling import AdaPonderForCausalLM
from adaponder.generation.depth_batching import DepthBatchedDecoder
from adaponder.modeling.exit_rules import NoHalting, QExit
from adaponder.modeling.run_settings import LEGACY_CONFIG_KEYS, RunSettings
from adaponder.generation.speculative import SelfSpeculativeDecoder, SpeculativeConfig
from adaponder.palbert.classifier import AdaPonderForSequenceClassification, PalbertConfig
from conftest import tiny_config, tiny_model

K = 4


class EvenIdsStopAfterTwo:
    """Tokens (or, in the classifier, examples whose pooled token has an even id) stop after pass 2."""

    needs = frozenset({"token_ids"})
    carries = False

    def stops(self, view):
        return (view.token_ids % 2 == 0) & (torch.as_tensor(view.pass_idx, device=view.token_ids.device) >= 2)


RULE = RunSettings(exit_rule=EvenIdsStopAfterTwo())


def expected_exits(ids: torch.Tensor) -> torch.Tensor:
    return torch.where(ids % 2 == 0, torch.full_like(ids, 2), torch.full_like(ids, K))


@pytest.fixture(scope="module")
def model():
    return tiny_model("adaponder", passes=K)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 97, (3, 10), generator=torch.Generator().manual_seed(1))


def test_training_forward_and_inference_forward(model, ids):
    model.train()
    try:
        out = model(ids, labels=ids, settings=RULE)
    finally:
        model.eval()
    assert torch.equal(out.exit_pass, expected_exits(ids))
    with torch.no_grad():  # compacted passes (A16)
        assert torch.equal(model(ids, settings=RULE).exit_pass, expected_exits(ids))
        assert torch.equal(model(ids, settings=RULE.replace(compact=False)).exit_pass, expected_exits(ids))


def test_cached_decoding(model, ids):
    with torch.no_grad():
        full = model(ids, settings=RULE)
        out = model(ids[:, :4], use_cache=True, settings=RULE)
        exits, logits = [out.exit_pass], [out.logits]
        for t in range(4, ids.shape[1]):
            out = model(ids[:, t:t + 1], cache=out.cache, use_cache=True, settings=RULE)
            exits.append(out.exit_pass)
            logits.append(out.logits)
    assert torch.equal(torch.cat(exits, 1), expected_exits(ids))
    torch.testing.assert_close(torch.cat(logits, 1), full.logits, atol=1e-4, rtol=1e-4)


def test_depth_batched_decoding(model, ids):
    res = DepthBatchedDecoder(model, RULE).generate(ids[:, :6], 8)
    gen = res.sequences[:, 6:]
    inputs = torch.cat([ids[:, 5:6], gen[:, :-1]], 1)  # the token each generated one was predicted from
    assert torch.equal(res.exit_pass, expected_exits(inputs))
    with torch.no_grad():  # row by row, the cached forward with the same rule gives the same tokens
        ref = model.generate(ids[:, :6], max_new_tokens=8, do_sample=False, settings=RULE, pad_token_id=0)
    assert torch.equal(res.sequences, ref)


@pytest.mark.parametrize("per_pass", [True, False], ids=["pass-by-pass", "whole-step"])
def test_static_decoding(model, ids, per_pass):
    from adaponder.generation.static_decoding import StaticDecoder

    res = StaticDecoder(model, RULE, per_pass=per_pass).generate(ids[:, :6], max_new_tokens=8)
    gen = res.sequences[:, 6:]
    inputs = torch.cat([ids[:, 5:6], gen[:, :-1]], 1)
    assert torch.equal(res.exit_pass, expected_exits(inputs))
    with torch.no_grad():
        ref = model.generate(ids[:, :6], max_new_tokens=8, do_sample=False, settings=RULE, pad_token_id=0)
    assert torch.equal(res.sequences, ref)


def test_self_speculative_decoding(model, ids):
    prompt = ids[:, :5]
    ordinary = model.generate(prompt, max_new_tokens=10, do_sample=False, settings=RULE, pad_token_id=0)
    plain = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
    spec = SelfSpeculativeDecoder(model, SpeculativeConfig(1, 3), settings=RULE).generate(prompt, max_new_tokens=10)
    assert torch.equal(spec, ordinary)
    via_generate = model.generate(prompt, max_new_tokens=10, speculative=SpeculativeConfig(2, 2), settings=RULE)
    assert torch.equal(via_generate, ordinary)
    assert not torch.equal(ordinary, plain), "the rule should change what this model decodes"
    # the cache the verification leaves is the ordinary one: tokens that stopped at pass 2 carried their K/V on
    seen = []

    class Recording(EvenIdsStopAfterTwo):
        def stops(self, view):
            seen.append((view.token_ids.clone(), view.pass_idx))
            return super().stops(view)

    SelfSpeculativeDecoder(model, SpeculativeConfig(1, 3), settings=RunSettings(exit_rule=Recording())).generate(
        prompt, max_new_tokens=6)
    assert seen and all(isinstance(p, int) for _, p in seen)


def test_lm_eval_scoring(shared_data):
    from transformers import PreTrainedTokenizerFast

    from adaponder.evaluation.lm_eval_model import AdaPonderLM

    tok = PreTrainedTokenizerFast(tokenizer_file=str(shared_data / "tokenizers/gpt-neox-20b/tokenizer.json"),
                                  eos_token="<|endoftext|>", pad_token="<|padding|>")
    torch.manual_seed(0)
    big = AdaPonderForCausalLM(tiny_config("adaponder", passes=K, vocab_size=50304)).eval()
    lm = AdaPonderLM(pretrained=big, tokenizer=tok, exit_rule=EvenIdsStopAfterTwo(), batch_size=1, device="cpu")
    context, continuation = tok("The cat sat on").input_ids, tok(" the mat").input_ids
    lm._loglikelihood_tokens([(("The cat sat on", " the mat"), context, continuation)], disable_tqdm=True)
    inputs = torch.tensor((context + continuation)[:-1])
    assert torch.equal(lm._last_exit[0, :len(inputs)].cpu(), expected_exits(inputs))
    hist = lm.halting_summary()["scored"]["exit_histogram"]
    assert sum(hist) == len(continuation) and hist[0] == hist[2] == 0


def test_palbert_classifier(model, ids):
    cfg = PalbertConfig(**{k: v for k, v in model.config.to_dict().items()
                           if k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                    "vocab_size", "max_position_embeddings", "rotary_pct")},
                        mode="ponderlm", palbert_passes=K, num_labels=2)
    clf = AdaPonderForSequenceClassification(cfg).eval()
    pred = clf.predict(ids, rule=EvenIdsStopAfterTwo())
    assert torch.equal(pred.exit_pass, expected_exits(ids[:, -1]))
    with torch.no_grad():  # the LM's exit pass of each row's last token agrees
        assert torch.equal(pred.exit_pass, model(ids, settings=RULE).exit_pass[:, -1])
    # the Q-exit of B9 is the same rule object for the classifier (per example) as for the LM (per token)
    online = clf.predict(ids, rule="q", q=0.5)
    as_object = clf.predict(ids, rule=QExit(0.5))
    assert torch.equal(online.exit_pass, as_object.exit_pass)
    assert torch.equal(online.outputs, as_object.outputs)


def test_q_exit_per_token_with_a_head_of_its_own(model, ids):
    head = torch.nn.Linear(model.config.hidden_size, 1)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(0.0)  # λ = 0.5 every pass: Σ p = 0.5, 0.75, … exceeds 0.6 at pass 2
        out = model(ids, settings=RunSettings(exit_rule=QExit(0.6, head=head)))
    assert (out.exit_pass == 2).all()


def test_no_call_changes_the_config_and_saved_config_holds_no_run_time_setting(model, ids, tmp_path):
    before = model.config.to_dict()
    with torch.no_grad():
        model(ids, settings=RunSettings(tau=0.5, compact=False, chunk_size=3, passes=2))
        model(ids, settings=RunSettings(exit_rule=NoHalting()))
    model.generate(ids[:, :4], max_new_tokens=3, do_sample=False, settings=RunSettings(tau=0.3), pad_token_id=0)
    DepthBatchedDecoder(model, RunSettings(tau=0.4)).generate(ids[:, :4], 3)
    SelfSpeculativeDecoder(model, SpeculativeConfig(1, 2), settings=RunSettings(tau=0.2)).generate(
        ids[:, :4], max_new_tokens=4)
    assert model.config.to_dict() == before
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert not set(saved) & set(LEGACY_CONFIG_KEYS)
    assert not any(hasattr(model.config, k) for k in LEGACY_CONFIG_KEYS)


def test_checkpoint_with_the_earlier_run_time_keys_loads_with_the_same_logits(model, ids, tmp_path):
    model.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    # as configs were written while the run-time settings lived in the model config
    path.write_text(json.dumps({**json.loads(path.read_text()), "halting_threshold": 0.0001,
                                "compact_inference": True, "ponder_chunk_size": 0, "ponder_recompute": True}))
    loaded = AdaPonderForCausalLM.from_pretrained(tmp_path).eval()
    assert not any(hasattr(loaded.config, k) for k in LEGACY_CONFIG_KEYS)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="τ"):
        RunSettings(tau=1.5)
    with pytest.raises(ValueError, match="passes"):
        RunSettings(passes=0)
    with pytest.raises(TypeError, match="ExitRule"):
        RunSettings(exit_rule=lambda *a: None)


def test_a_checkpoint_saved_by_the_code_before_run_settings_loads_and_gives_its_logits():
    # tests/fixtures/landed_checkpoint was saved by the code before τ left the model config (its make_fixture.py),
    # with τ = 0.5 in config.json and that code's logits and exit passes on fixed inputs
    source = Path(__file__).parent / "fixtures" / "landed_checkpoint"
    expected = torch.load(source / "expected.pt")
    with pytest.warns(UserWarning, match=r"halting_threshold=0.5.*RunSettings\(tau=0.5\)"):
        model = AdaPonderForCausalLM.from_pretrained(source).eval()
    assert not any(hasattr(model.config, k) for k in LEGACY_CONFIG_KEYS)
    with torch.no_grad():
        out = model(expected["input_ids"], settings=RunSettings(tau=0.5))
    assert torch.equal(out.exit_pass, expected["exit_pass"])
    assert 1 < out.exit_pass.float().mean() < 4  # some tokens halt early, some run every pass
    torch.testing.assert_close(out.logits, expected["logits"], rtol=0, atol=1e-6)
