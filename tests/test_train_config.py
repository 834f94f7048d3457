"""Training configuration: presets, validation (every problem at once), overrides, run plan, DeepSpeed config."""

from pathlib import Path

import pytest
import yaml

from adaponder.train.config import TrainConfigError, config_from_dict, load_config, plan_run
from adaponder.train.ds_config import BatchSizes, build_ds_config

REPO = Path(__file__).resolve().parents[1]
PYTHIA_LR = {"70m": 1e-3, "160m": 6e-4, "410m": 3e-4, "1b": 2.5e-4, "1.4b": 2e-4, "2.8b": 1.6e-4}


@pytest.mark.parametrize("size", sorted(PYTHIA_LR))
def test_pythia_presets_follow_the_recipe(size):
    cfg = load_config(REPO / "configs" / f"pythia{size}.yaml")
    assert cfg.optim.lr == PYTHIA_LR[size]
    assert cfg.optim.warmup == 0.01 and cfg.optim.decay == "cosine" and cfg.optim.min_lr_ratio == 0.1
    assert cfg.optim.betas == [0.9, 0.95] and cfg.optim.weight_decay == 0.01 and cfg.optim.grad_clip == 1.0
    assert cfg.data.seq_len == 2048
    assert cfg.deepspeed.precision == "bf16" and cfg.deepspeed.zero_stage == 1
    model = cfg.model_config()
    assert model.mode == "adaponder" and model.num_passes == 4
    for ranks in (8, 16):
        plan = plan_run(cfg, ranks)
        assert plan.global_batch == 1024 == plan.micro_batch * plan.grad_accum * ranks
        assert plan.warmup_steps == 1430 and plan.total_steps == 143_000
        assert (plan.s0, plan.s1) == (28_600, 57_200)
    ds = build_ds_config(cfg.deepspeed, BatchSizes.of(plan_run(cfg, 8)), cfg.optim.grad_clip, n_params=10**8)
    assert ds["bf16"]["enabled"] and ds["zero_optimization"]["stage"] == 1
    assert ds["train_batch_size"] == 1024 and ds["gradient_clipping"] == 1.0


def test_tiny_config_is_a_cpu_config():
    cfg = load_config(REPO / "configs" / "tiny.yaml")
    model = cfg.model_config()
    assert model.hidden_size == 128 and model.num_passes == 4 and model.mode == "adaponder"
    assert cfg.deepspeed.precision == "fp32" and cfg.data.prepare == ["bundled"]
    assert 128 <= cfg.data.seq_len <= 256


def test_every_problem_is_reported_at_once_with_file_and_key_paths(tmp_path):
    bad = {
        "model": {"size": "tiny", "hiden_size": 3, "mode": "adaponder"},
        "data": {"path": "x", "seq_len": "long"},
        "optim": {"lr": -1, "betas": [0.9], "wd": 0.1, "warmup": 1.5},
        "schedule": {"s0": 0.6, "s1": 0.3, "k_max": 2},
        "deepspeed": {"zero_stage": 5, "precision": "fp8"},
        "train": {"steps": 10, "micro_batch": 0},
        "extra_section": {},
    }
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(bad))
    with pytest.raises(TrainConfigError) as info:
        load_config(f)
    msg = str(info.value)
    assert msg.startswith(f"13 problem(s) in the training configuration in {f}:")
    for needle in ("model: unknown key 'hiden_size'", "data.seq_len: must be an integer, got 'long'",
                   "optim.lr: must be > 0, got -1", "optim.betas: must hold at least 2 item(s), got [0.9]",
                   "optim.wd: unknown key", "optim.warmup: a float is a fraction of training",
                   "schedule.s1 (0.3) must not come before schedule.s0 (0.6)", "schedule.k_max: must be <= 1, got 2",
                   "deepspeed.zero_stage: must be <= 3, got 5", "deepspeed.precision: must be 'fp32' | 'bf16' | 'fp16'",
                   "train.micro_batch: must be >= 1, got 0", "train.grad_accum / train.global_batch",
                   "extra_section: unknown section"):
        assert needle in msg, needle
    assert len(info.value.problems) == 13


def test_yaml_number_strings_integral_floats_and_steps_or_fractions(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("model: {size: tiny}\ndata: {path: d, seq_len: 16}\noptim: {lr: 1e-3, warmup: 10, eps: 1e-8}\n"
                 "schedule: {s0: 0.1, s1: 50}\ntrain: {tokens: 3.2e3, micro_batch: 2.0, grad_accum: 1}\n")
    assert yaml.safe_load(f.read_text())["train"]["tokens"] == "3.2e3"  # YAML 1.1: a string
    cfg = load_config(f)
    assert cfg.optim.lr == 1e-3 and cfg.optim.eps == 1e-8
    assert cfg.train.tokens == 3200 and type(cfg.train.tokens) is int
    assert cfg.train.micro_batch == 2 and type(cfg.train.micro_batch) is int
    assert type(cfg.optim.warmup) is int and type(cfg.schedule.s0) is float and type(cfg.schedule.s1) is int
    plan = plan_run(cfg, 1)
    assert (plan.total_steps, plan.warmup_steps, plan.s0, plan.s1) == (100, 10, 10, 50)
    assert cfg.train.allow_schedule_change is False
    for written in ("3e11", "3.0e+11", "300000000000"):
        tokens = load_config(f, [f"train.tokens={written}"]).train.tokens
        assert tokens == 300_000_000_000 and type(tokens) is int, written
    with pytest.raises(TrainConfigError, match=r"train.tokens: must be an integer or null, got 2\.5"):
        load_config(f, ["train.tokens=2.5"])


def test_fingerprint_is_stable():
    # Runs on disk and docs/study/*.json record fingerprints: an unchanged config must keep its value.
    cfg = load_config(REPO / "configs" / "tiny.yaml")
    assert cfg.fingerprint() == "15aa52233fcc4afa"
    assert load_config(REPO / "configs" / "tiny.yaml", ["train.allow_schedule_change=true"]).fingerprint() \
        == cfg.fingerprint()
    assert load_config(REPO / "configs" / "tiny.yaml", ["optim.lr=1e-3"]).fingerprint() != cfg.fingerprint()


def test_overrides_are_typed_and_validated():
    cfg = load_config(REPO / "configs" / "pythia410m.yaml",
                      ["optim.lr=3e-4", "train.steps=100", "schedule.s0=10", "model.mode=ponderlm"])
    assert cfg.optim.lr == 3e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.train.steps == 100 and cfg.schedule.s0 == 10 and isinstance(cfg.schedule.s0, int)
    assert cfg.model_config().mode == "ponderlm"
    with pytest.raises(TrainConfigError) as info:
        load_config(REPO / "configs" / "pythia410m.yaml", ["optim.lrr=1", "train.steps=abc"])
    assert "optim.lrr: unknown key (did you mean lr?)" in str(info.value)
    assert "train.steps: must be an integer or null, got 'abc'" in str(info.value)
    assert len(info.value.problems) == 2  # no follow-up "give steps or tokens" about the defaulted train.steps
    assert "--set" in str(info.value)


def test_plan_checks_the_batch_arithmetic():
    cfg = config_from_dict({"model": {"size": "tiny"}, "data": {"path": "d", "seq_len": 16},
                            "train": {"steps": 100, "micro_batch": 3, "global_batch": 16}})
    with pytest.raises(TrainConfigError, match="multiple of micro_batch"):
        plan_run(cfg, 2)
    cfg = config_from_dict({"model": {"size": "tiny"}, "data": {"path": "d", "seq_len": 16},
                            "train": {"tokens": "1e4", "micro_batch": 2, "grad_accum": 4}})
    plan = plan_run(cfg, 2)
    assert plan.global_batch == 16 and plan.total_steps == 40 and (plan.s0, plan.s1) == (8, 16)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_ds_config_per_stage(stage):
    cfg = config_from_dict({"model": {"size": "tiny"}, "data": {"path": "d", "seq_len": 16},
                            "deepspeed": {"zero_stage": stage, "precision": "fp32",
                                          "offload_optimizer": "cpu" if stage else "none",
                                          "overrides": {"zero_optimization": {"round_robin_gradients": True}}},
                            "train": {"steps": 10, "micro_batch": 2, "grad_accum": 3}})
    ds = build_ds_config(cfg.deepspeed, BatchSizes.of(plan_run(cfg, 2)), cfg.optim.grad_clip, n_params=1000)
    z = ds["zero_optimization"]
    assert z["stage"] == stage and ds["train_batch_size"] == 12 and ds["gradient_accumulation_steps"] == 3
    assert (z.get("offload_optimizer", {}).get("device") == "cpu") == (stage > 0)
    assert z["round_robin_gradients"] is True  # overrides merge in last
    # without ZeRO in fp32 the trainer clips itself (DeepSpeed would not report the norm)
    assert ds["gradient_clipping"] == (0.0 if stage == 0 else 1.0)
