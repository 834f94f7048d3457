"""Warm-ups that keep every pass (``schedule.gate_warmup``: bypassed, floored) and the collapse alarm: the schedule
of each regime, the forward it asks for, the gates left untouched and no token halted before S0 with the ponder
loss starting at S0 as before, resume equals continue across S0, cached decoding equal to the training forward of
a model trained in each regime, and the alarm firing on a run built to collapse and silent on one that keeps its
passes."""

import math

import pytest
import torch

from adaponder.data.reasoning import MultiHopSpec, write_multihop
from adaponder.modeling import AdaPonderForCausalLM, GateWarmup
from adaponder.modeling.run_settings import RunSettings
from adaponder.train.schedule import gate_warmup
from conftest import run_with, tiny_config
from helpers_train import read_metrics, write_config

K = 3
STEPS = 8  # S0 = step 4, S1 = step 6


def test_each_regime_schedule():
    kw = dict(s0=4, s1=6, floor=0.0, tau=1e-4)
    assert all(gate_warmup(t, regime="live", **kw) is None for t in range(10))
    assert [gate_warmup(t, regime="bypassed", **kw) for t in (0, 3)] == [GateWarmup(bypass=True, halting=False)] * 2
    assert gate_warmup(4, regime="bypassed", **kw) is None
    assert gate_warmup(3, regime="floored", **kw) == GateWarmup(halting=False, logit_floor=0.0)
    end = math.log(1e-4 / (1 - 1e-4)) - 4
    assert gate_warmup(4, regime="floored", **kw) == GateWarmup(logit_floor=0.0)
    assert gate_warmup(5, regime="floored", **kw).logit_floor == pytest.approx(end / 2)
    assert gate_warmup(6, regime="floored", **kw) is None
    with pytest.raises(ValueError, match="unknown gate warm-up"):
        gate_warmup(0, regime="frozen", **kw)


def test_the_forward_each_warmup_asks_for():
    torch.manual_seed(0)
    model = AdaPonderForCausalLM(tiny_config("adaponder", passes=K, gate_init_bias=-3.0)).eval()  # s ≈ 0.05
    ids = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        live = model(ids, use_cache=False)  # τ = 1e-4: nothing halts, every update scaled by s ≈ 0.05
        tau = RunSettings(tau=0.1)  # most tokens would halt after pass 1
        halting = model(ids, use_cache=False, settings=tau)
        assert (halting.exit_pass < K).any()
        bypass = model(ids, use_cache=False, settings=tau, gate_warmup=GateWarmup(bypass=True, halting=False))
        no_halt = model(ids, use_cache=False, settings=tau, gate_warmup=GateWarmup(halting=False))
        floored = model(ids, use_cache=False, settings=tau, gate_warmup=GateWarmup(halting=False, logit_floor=0.0))
    assert bypass.gate_values is None and (bypass.exit_pass == K).all()
    assert (no_halt.exit_pass == K).all() and no_halt.gate_values.max() < 0.2
    assert floored.gate_values.min() >= 0.5 and (floored.exit_pass == K).all()
    # bypassed gates are the PonderLM update: E += e (s ≡ 1), the same as a ponderlm model with these weights
    ponder = AdaPonderForCausalLM(tiny_config("ponderlm", passes=K)).eval()
    ponder.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("gates.")}, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(ponder(ids, use_cache=False).logits, bypass.logits, rtol=0, atol=1e-5)
    assert not torch.equal(live.logits, bypass.logits)


@pytest.fixture(scope="module")
def runs(data, launcher, tmp_path_factory):
    """Per regime: a straight run of 8 steps, and one stopped after step 3 (before S0) then resumed."""
    from helpers_train import tiny_train_config

    tmp = tmp_path_factory.mktemp("warmup")
    out = {}
    for regime in ("bypassed", "floored"):
        common = dict(model={"passes": K}, schedule={"s0": 0.5, "s1": 0.75, "gate_warmup": regime},
                      checkpoint={"every": 2, "keep": 10, "export_hf": True}, train={"steps": STEPS},
                      deepspeed={"zero_stage": 1, "precision": "fp32"})
        a = write_config(tmp / f"{regime}-a.yaml", tiny_train_config(data["data"], data["tokenizer"],
                                                                    tmp / f"{regime}-a", **common))
        b = write_config(tmp / f"{regime}-b.yaml", tiny_train_config(data["data"], data["tokenizer"],
                                                                    tmp / f"{regime}-b", **common))
        for argv in (["--config", a], ["--config", b, "--set", "train.stop_at=3"], ["--config", b, "--resume", "auto"]):
            code, log = launcher.run(*argv)
            assert code == 0, log[-3000:]
        out[regime] = (tmp / f"{regime}-a", tmp / f"{regime}-b")
    return out


def _weights(run, step):
    from adaponder.train.checkpoint import safe_torch_load

    sd = safe_torch_load(run / "checkpoints" / f"step{step:08d}" / "mp_rank_00_model_states.pt")["module"]
    return ({k: v for k, v in sd.items() if k.startswith("gates.")},
            {k: v for k, v in sd.items() if not k.startswith("gates.")})


@pytest.mark.integration
@pytest.mark.parametrize("regime", ["bypassed", "floored"])
def test_no_halting_before_s0_and_the_ponder_loss_starts_at_s0(runs, regime):
    recs = read_metrics(runs[regime][0])
    # records name the step just taken: steps 1..4 are indices 0..3 (< S0); index 4 is S0, where k's ramp is at 0
    before, after = [r for r in recs if r["step"] <= 4], [r for r in recs if r["step"] > 5]
    assert all(r["mean_exit_pass"] == K and r["k"] == 0 and r["ponder_loss"] == 0 for r in before)
    assert all(r["k"] > 0 and r["ponder_loss"] > 0 for r in after) and after[-1]["k"] == pytest.approx(0.3)
    assert all(r.get("gate_warmup") for r in before) and not after[-1].get("gate_warmup")
    if regime == "floored":  # the gates run (and learn) but never below the floor's σ(0) = 0.5
        assert all(min(r["gate_median"]) >= 0.5 for r in before)


@pytest.mark.integration
def test_bypassed_gates_receive_no_update_before_s0(runs):
    run = runs["bypassed"][0]
    g2, b2 = _weights(run, 2)
    g4, b4 = _weights(run, 4)
    g6, _ = _weights(run, 6)
    assert all(torch.equal(g2[k], g4[k]) for k in g2)  # frozen: no gradient step, no weight decay
    assert any(not torch.equal(b2[k], b4[k]) for k in b2)  # while the backbone trains
    assert any(not torch.equal(g4[k], g6[k]) for k in g4)  # and from S0 they learn


@pytest.mark.integration
@pytest.mark.parametrize("regime", ["bypassed", "floored"])
def test_resume_equals_continue_across_s0(runs, regime):
    a, b = runs[regime]
    key = lambda r: (r["step"], r["loss"], r["lm_loss"], r["ponder_loss"], r["grad_norm"])  # noqa: E731
    assert [key(r) for r in read_metrics(b)] == [key(r) for r in read_metrics(a)]


@pytest.mark.integration
@pytest.mark.parametrize("regime", ["bypassed", "floored"])
def test_cached_decoding_equals_the_training_forward(runs, regime):
    model = AdaPonderForCausalLM.from_pretrained(runs[regime][0] / "hf").eval()
    run_with(model, tau=0.3)  # so that tokens halt at several passes
    ids = torch.randint(0, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids, use_cache=False)
        cache, logits, exits = None, [], []
        for t in range(ids.shape[1]):
            out = model(ids[:, t:t + 1], cache=cache, use_cache=True)
            cache = out.cache
            logits.append(out.logits)
            exits.append(out.exit_pass)
    torch.testing.assert_close(torch.cat(logits, 1), ref.logits, rtol=0, atol=1e-5)
    assert torch.equal(torch.cat(exits, 1), ref.exit_pass)


# -- the collapse alarm -------------------------------------------------------------------------------------
def _alarm_run(tmp, launcher, regime):
    """A task whose one-hop answers pass 1 fits at once; τ = 0.05 and a high learning rate make cross-entropy
    close the last gate within the warm-up under the paper's schedule."""
    data = tmp / "multihop"
    if not data.exists():
        write_multihop(data, MultiHopSpec(symbols=24, max_hops=3, filler_symbols=5, queries=6, doc_tokens=32,
                                          train_docs=400, val_docs=12, seed=3))
    cfg = {"model": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
                     "vocab_size": 64, "max_position_embeddings": 64, "mode": "adaponder", "passes": K,
                     "halting_threshold": 0.05},
           "data": {"path": str(data), "seq_len": 32}, "optim": {"lr": 1e-2},
           "schedule": {"s0": 0.5, "s1": 0.75, "gate_warmup": regime},
           "deepspeed": {"zero_stage": 0, "precision": "fp32"}, "checkpoint": {"every": 100, "keep": 1},
           "eval": {"every": 0, "max_batches": 2, "micro_batch": 8},
           "logging": {"every": 4, "progress_bar": False},
           "train": {"out_dir": str(tmp / regime), "steps": 80, "micro_batch": 16, "global_batch": 16, "threads": 1}}
    code, log = launcher.run("--config", write_config(tmp / f"{regime}.yaml", cfg))
    assert code == 0, log[-3000:]
    return tmp / regime, log


@pytest.mark.integration
def test_the_alarm_fires_on_a_collapsing_run_and_stays_silent_on_one_that_keeps_its_passes(launcher, tmp_path):
    run, log = _alarm_run(tmp_path, launcher, "live")
    alarms = [r for r in read_metrics(run, "event") if r.get("event") == "gate_collapse"]
    assert len(alarms) == 1 and alarms[0]["gate"] == 2 and alarms[0]["step"] <= 40  # once, before S0
    assert "WARNING: gate 2 (after pass 2) closed at step" in log and "schedule.gate_warmup=bypassed" in log
    report = (run / "report.md").read_text()
    assert "**alarm**" in report and "gates.png" in report and (run / "gates.png").stat().st_size > 10_000
    kept, log = _alarm_run(tmp_path, launcher, "bypassed")
    assert not [r for r in read_metrics(kept, "event") if r.get("event") in ("gate_collapse", "dead_pass")]
    assert "WARNING: gate" not in log and "No collapse alarm" in (kept / "report.md").read_text()
