"""HF integration: save/load with trust_remote_code in a process without
adaponder, loading GPT-NeoX checkpoints into each mode, config validation, accounting (A17)."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml

from adaponder.modeling.run_settings import RunSettings
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from adaponder.modeling import (PYTHIA_SHAPES, AdaPonderConfig, AdaPonderConfigError, AdaPonderForCausalLM,
                                pythia_config)
from conftest import tiny_config


@pytest.mark.integration
def test_save_load_in_process_without_adaponder(tmp_path):
    torch.manual_seed(0)
    # gates start at s ≈ 1e-4, the default τ: some tokens halt after each pass in both processes
    model = AdaPonderForCausalLM(tiny_config("adaponder", gate_init_bias=-9.21)).eval()
    model.save_pretrained(tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["auto_map"]["AutoModelForCausalLM"].endswith("AdaPonderForCausalLM")
    assert (tmp_path / "ckpt" / "model.safetensors").exists()
    ids = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids, use_cache=False).logits
        greedy = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    torch.save({"ids": ids, "logits": expected, "greedy": greedy}, tmp_path / "io.pt")
    script = textwrap.dedent(f"""
        import sys
        sys.modules["adaponder"] = None  # any import of adaponder now fails
        import torch
        from transformers import AutoModelForCausalLM
        io = torch.load({str(tmp_path / "io.pt")!r})
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path / "ckpt")!r}, trust_remote_code=True).eval()
        assert "adaponder" not in type(model).__module__.split(".")[0], type(model).__module__
        with torch.no_grad():
            out = model(io["ids"], use_cache=False)
        torch.testing.assert_close(out.logits, io["logits"], rtol=0, atol=0)
        with torch.no_grad():  # transformers' own generate, on the cached forward the checkpoint carries
            assert torch.equal(model.generate(io["ids"], max_new_tokens=6, do_sample=False, pad_token_id=0),
                               io["greedy"])
        try:
            model.generate(io["ids"], max_new_tokens=2, decoding=object())
        except ValueError as err:
            assert "need the adaponder package" in str(err), err
        else:
            raise AssertionError("decoding= without adaponder was not refused")
        print("OK", type(model).__module__, float(out.exit_pass.float().mean()))
    """)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin",
           "HF_MODULES_CACHE": str(tmp_path / "modules")}
    res = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith("OK transformers_modules")


def test_a_checkpoint_ships_the_model_alone(tmp_path):
    """The configuration, the forward and what it needs: at most 12 Python files and 3,000 lines, no decoder."""
    AdaPonderForCausalLM(tiny_config("adaponder")).save_pretrained(tmp_path)
    files = sorted(tmp_path.glob("*.py"))
    lines = sum(len(f.read_text().splitlines()) for f in files)
    assert len(files) <= 12 and lines <= 3000, (len(files), lines, [f.name for f in files])
    shipped = "\n".join(f.read_text() for f in files)
    for decoder in ("class StaticDecoder", "class DepthBatchedDecoder", "class SelfSpeculativeDecoder",
                    "class StaticSpeculativeDecoder", "class PipelinedSpeculativeDecoder", "class WayChooser"):
        assert decoder not in shipped
    dispatch = (tmp_path / "modeling_adaponder.py").read_text().split("    def generate(")[1].split("\n    def ")[0]
    assert len(dispatch.splitlines()) <= 30


def test_from_pretrained_round_trip_in_process(tmp_path):
    model = AdaPonderForCausalLM(tiny_config("ponderlm", passes=3)).eval()
    model.save_pretrained(tmp_path)
    loaded = AdaPonderForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.mode == "ponderlm" and loaded.config.passes == 3
    ids = torch.randint(0, 97, (2, 7))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


@pytest.mark.parametrize("mode", ["vanilla", "ponderlm", "loop", "adaponder"])
def test_load_gpt_neox_checkpoint_into_each_mode(tmp_path, mode):
    torch.manual_seed(0)
    neox = GPTNeoXForCausalLM(GPTNeoXConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                            intermediate_size=128, vocab_size=97, rotary_pct=0.25))
    neox.save_pretrained(tmp_path / "neox")
    model = AdaPonderForCausalLM.from_backbone(tmp_path / "neox", mode=mode, passes=1 if mode == "vanilla" else 3)
    neox_state = neox.state_dict()
    for name, tensor in model.state_dict().items():
        if name.startswith("gates."):
            continue
        assert torch.equal(tensor, neox_state[name]), name
    if mode == "adaponder":
        assert len(model.gates) == 2
        assert all(float(g.fc_out.bias.detach()) == model.config.gate_init_bias for g in model.gates)  # s ≈ 1
    if mode == "vanilla":
        ids = torch.randint(0, 97, (2, 9))
        with torch.no_grad():
            torch.testing.assert_close(model.eval()(ids).logits, neox.eval()(ids).logits)


def test_from_backbone_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        AdaPonderForCausalLM.from_backbone(tmp_path)


def test_config_reports_every_problem_at_once(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump({"hidden_size": 100, "num_attention_heads": 7, "passes": 0,
                                    "halting_threshold": 1.5, "mode": "pondernet", "gate_widht": 4}))
    with pytest.raises(AdaPonderConfigError) as err:
        AdaPonderConfig.from_mapping(yaml.safe_load(path.read_text()), source=str(path))
    msg = str(err.value)
    for needle in ("hidden_size' (100) must be divisible by 'num_attention_heads' (7)", "'passes' (K) must be >= 1",
                   "'halting_threshold' is a run-time setting", "'mode' must be one of", "unknown key 'gate_widht'",
                   str(path)):
        assert needle in msg, needle
    assert len(err.value.problems) == 5


def test_config_direct_construction_also_validates():
    with pytest.raises(ValueError, match="τ"):  # τ is a run-time setting, checked where it is given
        RunSettings(tau=0.0)
    with pytest.raises(Exception, match="vanilla"):
        AdaPonderConfig(hidden_size=64, num_attention_heads=4, mode="vanilla", passes=4)


def test_flops_match_hand_count_and_fall_when_tokens_halt():
    cfg = tiny_config("adaponder", passes=3)  # d=64, L=2, ff=128, V=97, gate 4d
    model = AdaPonderForCausalLM(cfg)
    d, L, V, ctx = 64, 2, 97, 10
    layer = 2 * (64 * 192 + 64 * 64 + 2 * 64 * 128) + 4 * ctx * d
    gate = 2 * (64 * 256 + 256)
    # one token exits at pass 1, one at pass 3: D = [1, 3]
    D = torch.tensor([1, 3])
    f = model.flops_per_token(D, context=ctx)
    assert f["backbone"] == pytest.approx(2.0 * L * layer)  # mean D = 2
    assert f["head"] == pytest.approx(2.0 * 2 * d * V)
    assert f["pondering"] == pytest.approx(1.0 * 2 * d * V)  # mean (D-1) = 1
    assert f["gates"] == pytest.approx(1.5 * gate)  # min(D, K-1) = [1, 2]
    assert f["total"] == pytest.approx(f["backbone"] + f["head"] + f["pondering"] + f["gates"])
    full = model.flops_per_token(None, context=ctx)
    assert full["mean_passes"] == 3 and f["total"] < full["total"]
    assert model.flops_per_token(D, context=ctx, training=True)["total"] == pytest.approx(3 * f["total"])


@pytest.mark.parametrize("size", list(PYTHIA_SHAPES))
def test_pythia_presets_match_published_parameter_counts(size):
    published = PYTHIA_SHAPES[size][-1]
    with torch.device("meta"):
        vanilla = AdaPonderForCausalLM(pythia_config(size, mode="vanilla"))
        gated = AdaPonderForCausalLM(pythia_config(size, mode="adaponder"))
    counts = vanilla.parameter_counts()
    assert abs(counts["total"] - published) / published < 0.01, (counts, published)
    assert counts["gates"] == 0
    g = gated.parameter_counts()
    d = gated.config.hidden_size
    assert g["gates"] == 3 * (d * 4 * d + 4 * d + 4 * d + 1)  # K-1 = 3 gate MLPs, reported separately
    assert g["total"] == counts["total"] + g["gates"]
