"""Settings are arguments of a call (:class:`RunSettings`), never written into ``model.config`` at run time:
τ per forward / generate / scoring call, ZeRO-3's full passes per evaluation call, the classifier's attention
implementation at construction, the attention of a compacted pass or a depth-batched tick chosen by the layer call's
own arguments."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from adaponder.modeling import AdaPonderForCausalLM
from adaponder.generation.depth_batching import DepthBatchedDecoder
from adaponder.modeling.run_settings import RunSettings
from conftest import run_with, settings_for
from helpers_decoding import gated_model

PACKAGE = Path(__file__).resolve().parents[1] / "adaponder"

# Where a model config is still assigned to after construction, and why that place is allowed to:
ALLOWED = {
    # a fresh config, before the classifier is built on it
    ("palbert/classifier.py", "from_backbone"),
}


def _config_assignments():
    """(file, function, line, target) of every assignment to ``<x>.config.<field>``, ``config.<field>`` or a
    field of a local alias of ``<x>.config``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("modeling/configuration_") or rel.endswith("palbert/config.py"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            # local aliases of a model config: ``cfg = model.config`` (or ``self.model.config``)
            aliases = {"config"} | {t.id for n in ast.walk(func) if isinstance(n, ast.Assign)
                                    and isinstance(n.value, ast.Attribute) and n.value.attr == "config"
                                    for t in n.targets if isinstance(t, ast.Name)}
            for node in ast.walk(func):
                targets = node.targets if isinstance(node, ast.Assign) else (
                    [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
                for t in targets:
                    if not isinstance(t, ast.Attribute):
                        continue
                    base = t.value
                    if (isinstance(base, ast.Attribute) and base.attr == "config") or (
                            isinstance(base, ast.Name) and base.id in aliases):
                        found.append((rel, func.name, node.lineno, ast.unparse(t)))
    return found


def test_nothing_writes_model_config_after_construction_outside_the_allowed_places():
    found = _config_assignments()
    stray = [f for f in found if (f[0], f[1]) not in ALLOWED]
    assert not stray, f"assignments to a model config at run time: {stray}"
    assert {(f[0], f[1]) for f in found} <= ALLOWED
    assert ("palbert/classifier.py", "from_backbone") in {(f[0], f[1]) for f in found}  # the scan sees them


@pytest.fixture(scope="module")
def gated():
    return gated_model(passes=3)  # gates that halt some tokens at τ = 0.5 and none at the default τ


def _with_tau(model, tau, **settings):
    """A copy of ``model`` whose every call runs at ``tau`` (bound once, as the lm-eval model binds it)."""
    other = AdaPonderForCausalLM(model.config.__class__(**model.config.to_dict()))
    other.load_state_dict(model.state_dict())
    return run_with(other.eval(), tau=tau, **settings)


@pytest.mark.parametrize("compact", [None, False])
def test_tau_per_call_equals_a_model_built_with_that_tau(gated, compact):
    ids = torch.randint(0, 97, (3, 12), generator=torch.Generator().manual_seed(1))
    before = gated.config.to_dict()
    extra = {} if compact is None else {"compact": compact}
    with torch.no_grad():
        per_call = gated(input_ids=ids, settings=RunSettings(tau=0.5, **extra))
        built = _with_tau(gated, 0.5, **extra)(input_ids=ids)
        default = gated(input_ids=ids)
    assert gated.config.to_dict() == before  # not written
    assert "halting_threshold" not in before  # τ is no field of the model config
    assert torch.equal(per_call.exit_pass, built.exit_pass)
    torch.testing.assert_close(per_call.logits, built.logits)
    assert not torch.equal(per_call.exit_pass, default.exit_pass)  # the call's τ changed something


def test_generate_and_the_depth_batched_decoder_take_tau_per_call(gated):
    ids = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    built = _with_tau(gated, 0.5)
    before = gated.config.to_dict()
    call = RunSettings(tau=0.5)
    seen = []
    hook = gated.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("settings")), with_kwargs=True)
    with torch.no_grad():
        per_call = gated.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, settings=call)
    hook.remove()
    assert seen and set(seen) == {call}  # every forward of generate got the call's τ
    with torch.no_grad():
        expected = built.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        dec = DepthBatchedDecoder(gated, settings=call).generate(ids, max_new_tokens=6)
        dec_built = DepthBatchedDecoder(built, settings=settings_for(built)).generate(ids, max_new_tokens=6)
    assert torch.equal(per_call, expected)
    assert torch.equal(dec.exit_pass, dec_built.exit_pass) and torch.equal(dec.sequences, dec_built.sequences)
    assert torch.equal(dec.sequences, expected)  # the decoder decodes as generate does
    assert gated.config.to_dict() == before


def test_compacted_passes_and_depth_batched_ticks_route_attention_without_touching_the_config(gated):
    """The packed (compacted pass) and per-row (depth-batched tick) attention are chosen by each layer call's own
    arguments; the layers hold the model's config itself, and ``model.config`` keeps the implementation the model was
    built with throughout."""
    from adaponder.modeling.attention import PACKED_ATTENTION, ROW_ATTENTION, attention_for

    attention = gated.gpt_neox.layers[0].attention
    seen = []
    hook = attention.register_forward_pre_hook(
        lambda m, a, kw: seen.append((gated.config._attn_implementation,
                                      attention_for(kw, m.config._attn_implementation))), with_kwargs=True)
    ids = torch.randint(0, 97, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        gated(input_ids=ids, settings=RunSettings(tau=0.5, compact=True))
        DepthBatchedDecoder(gated, settings=RunSettings(tau=0.5)).generate(ids[:, :5], max_new_tokens=3)
    hook.remove()
    built = gated.config._attn_implementation
    assert {config for config, _ in seen} == {built}
    assert {routed for _, routed in seen} == {built, PACKED_ATTENTION, ROW_ATTENTION}
    assert all(layer.attention.config is gated.config for layer in gated.gpt_neox.layers)  # no view, no copy


def test_the_layers_hold_the_models_config_after_copy_and_pickle(gated):
    import copy
    import pickle

    for twin in (copy.deepcopy(gated), pickle.loads(pickle.dumps(gated))):
        assert twin.gpt_neox.layers[1].attention.config is twin.config
        ids = torch.randint(0, 97, (2, 8), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            assert torch.equal(twin(input_ids=ids, settings=RunSettings(tau=0.5, compact=True)).logits,
                               gated(input_ids=ids, settings=RunSettings(tau=0.5, compact=True)).logits)


@pytest.mark.parametrize("bad", [0.0, 1.0, float("nan"), -0.2])
def test_a_bad_tau_per_call_names_it(gated, bad):
    with pytest.raises(ValueError, match=r"tau.*\(0, 1\)"):
        gated(input_ids=torch.zeros(1, 3, dtype=torch.long), settings=RunSettings(tau=bad))


def test_evaluation_builds_k_and_tau_in_and_runs_as_the_full_model_at_that_k(gated, tmp_path):
    """``load_for_eval(path, passes=2)`` builds the model with K = 2 (the third pass's gate is left unused, silently)
    and, called at τ, scores exactly as the trained model run for 2 passes at τ; τ is no part of the built config."""
    from adaponder.evaluation.settings import load_for_eval, settings_of

    gated.save_pretrained(tmp_path / "ckpt")
    model, _ = load_for_eval(tmp_path / "ckpt", passes=2)
    assert model.config.passes == 2 and "halting_threshold" not in model.config.to_dict() and len(model.gates) == 1
    _, info = AdaPonderForCausalLM.from_pretrained(tmp_path / "ckpt", passes=2, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"]  # no load report about the unused gate
    assert settings_of(model, str(tmp_path / "ckpt")).trained_passes == 3
    reference = AdaPonderForCausalLM(gated.config.__class__(**{**gated.config.to_dict(), "passes": 2})).eval()
    reference.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("gates.1.")})
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(ids, settings=RunSettings(tau=0.5)).logits,
                           reference(ids, settings=RunSettings(tau=0.5)).logits)
    with pytest.raises(ValueError, match="has gates for 3 passes; passes=4 exceeds it"):
        load_for_eval(tmp_path / "ckpt", passes=4)
