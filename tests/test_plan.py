"""The training planner (``adaponder/train/plan.py``, ``launch/plan.py``): its memory model against what a real
training step holds on the CPU, its FLOPs against the model's own accounting, its search and its CLI.

The peak test runs real DeepSpeed (ZeRO-1, one rank, gloo) training steps in a fresh process and reads the
kernel's resident-set high-water mark (VmHWM, reset through /proc/self/clear_refs before each shape). glibc is
told to serve every block above 64 KiB by mmap, so freed tensors leave the resident set at once and the
high-water mark follows the live tensors rather than the allocator's free lists.
"""

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import REPO, tiny_config

from adaponder.cli.plan import main
from adaponder.modeling import AdaPonderForCausalLM
from adaponder.train import plan as P
from adaponder.train.config import TrainConfigError, config_from_dict


def _train_cfg(d, layers, vocab, passes, seq, batch, precision="fp32", ckpt=False, mode="adaponder"):
    return {"model": {"hidden_size": d, "num_hidden_layers": layers, "num_attention_heads": 4,
                      "intermediate_size": 4 * d, "vocab_size": vocab, "max_position_embeddings": 512,
                      "mode": mode, "passes": passes},
            "data": {"path": "unused", "seq_len": seq},
            "deepspeed": {"zero_stage": 1, "precision": precision, "activation_checkpointing": ckpt},
            "train": {"steps": 2, "micro_batch": batch, "grad_accum": 1}}


# Three shapes whose peaks come from different terms: activations (K = 4 passes kept for backward), model states
# of DeepSpeed's BF16 optimizer (large vocabulary, short sequence), per-pass activation checkpointing.
SHAPES = {
    "activations": _train_cfg(256, 2, 2048, 4, 256, 4),
    "states-bf16": _train_cfg(512, 4, 8192, 4, 64, 1, precision="bf16"),
    "checkpointing": _train_cfg(256, 4, 2048, 4, 256, 4, ckpt=True),
}

_MEASURE = textwrap.dedent(r"""
    import gc, json, os, sys
    import torch
    torch.set_num_threads(1)
    from adaponder.modeling import AdaPonderForCausalLM, pondering
    from adaponder.train.config import config_from_dict, plan_run
    from adaponder.train.ds_config import BatchSizes, build_ds_config
    from adaponder.train.optim import GuardedAdamW, param_groups
    from adaponder.train.schedule import ponder_schedule
    from adaponder.train.distributed import create_engine, init_distributed
    from adaponder.train.trainer import training_loss

    def rss():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def hwm():
        with open("/proc/self/status") as fh:
            return next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmHWM"))

    def train(raw, steps):
        cfg = config_from_dict(raw)
        torch.manual_seed(0)
        model = AdaPonderForCausalLM(cfg.model_config())
        if cfg.deepspeed.activation_checkpointing:
            model.gradient_checkpointing_enable()
        n = sum(p.numel() for p in model.parameters())
        plan = plan_run(cfg, 1)
        engine = create_engine(model, GuardedAdamW(param_groups(model, 0.01), lr=1e-3), build_ds_config(cfg.deepspeed, BatchSizes.of(plan), cfg.optim.grad_clip, n))
        ps = ponder_schedule(1, s0=0, s1=1, k_max=0.1, weight=0.1)  # the ponder loss on, as after S0
        for _ in range(steps):
            x = torch.randint(0, model.config.vocab_size, (plan.micro_batch, plan.seq_len + 1))
            out = engine(input_ids=x[:, :-1], shift_labels=x[:, 1:], use_cache=False, return_logits=False)
            engine.backward(training_loss(out, ps)[0])
            del out
            engine.step()
        return n

    init_distributed()
    shapes = json.loads(sys.argv[1])
    # Warm-up on a toy model: library start-up costs (thread pools, DeepSpeed, BLAS) are not part of a plan.
    toy = json.loads(json.dumps(next(iter(shapes.values()))))
    toy["model"].update(hidden_size=32, intermediate_size=128, vocab_size=64)
    toy["data"]["seq_len"], toy["train"]["micro_batch"] = 16, 1
    train(toy, 1)
    result = {}
    for name, raw in shapes.items():
        getattr(pondering._local, "buffers", {}).clear()  # scratch blocks belong to the shape that needs them
        gc.collect()
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset VmHWM to the current resident set
        base = rss()
        n = train(raw, 2)
        result[name] = {"params": n, "peak": hwm() - base}
        gc.collect()
    print(json.dumps(result))
""")


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc (VmHWM)")
def test_memory_estimate_within_15_percent_of_measured_peak():
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(SHAPES)], env=env, cwd=str(REPO),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    report = {}
    for name, raw in SHAPES.items():
        cfg = config_from_dict(raw)
        est = P.memory(cfg.model_config(), measured[name]["params"], micro_batch=cfg.train.micro_batch,
                       seq_len=cfg.data.seq_len, zero_stage=1, precision=cfg.deepspeed.precision, world=1,
                       checkpointing=cfg.deepspeed.activation_checkpointing)
        report[name] = (est.peak / 2**20, measured[name]["peak"] / 2**20)
    for name, (est, got) in report.items():
        assert abs(est / got - 1) <= 0.15, f"{name}: estimate {est:.1f} MiB vs measured {got:.1f} MiB; all: {report}"


@pytest.mark.parametrize("mode,passes,extra", [("vanilla", 1, {}), ("ponderlm", 3, {}), ("loop", 3, {}),
                                               ("adaponder", 4, {}), ("adaponder", 2, {"use_parallel_residual": False}),
                                               ("pause", 1, {"pause_tokens": 2})])
def test_activation_model_counts_what_autograd_saves(mode, passes, extra):
    """Without checkpointing, the activation term is what autograd saves in the training forward (plus the
    loss's gradients, which the loss keeps itself)."""
    cfg = tiny_config(mode, passes=passes, hidden_size=64, intermediate_size=256, vocab_size=97, **extra)
    model = AdaPonderForCausalLM(cfg).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    batch, seq = 2, 32
    ids = torch.randint(0, 97, (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, shift_labels=ids, use_cache=False, return_logits=False)
    loss_grads = batch * seq * cfg.hidden_size * 4 + cfg.vocab_size * cfg.hidden_size * 4
    est = P.activation_bytes(cfg, batch, seq, "fp32", checkpointing=False) - loss_grads
    assert est == pytest.approx(sum(storages.values()), rel=0.03)


def test_plan_flops_are_the_models_accounting():
    raw = _train_cfg(128, 2, 512, 4, 64, 2, precision="bf16")  # A100 dense bf16: 312 TFLOP/s
    raw["train"] = {"tokens": 10**9, "micro_batch": 2, "global_batch": 16}
    cfg = config_from_dict(raw)
    p = P.make_plan(cfg, 8, P.DEVICES["a100-80gb"], mfu=0.5)
    model = AdaPonderForCausalLM(cfg.model_config())
    assert p.flops_per_token == model.flops_per_token(None, context=64, training=True)
    assert p.params == model.parameter_counts()
    assert p.budget_tokens == math.ceil(1e9 / (16 * 64)) * 16 * 64
    step = 16 * 64 * p.flops_per_token["total"] / (8 * 312e12 * 0.5)
    assert p.step_seconds["no checkpointing"] == pytest.approx(step)
    assert p.days("no checkpointing") == pytest.approx(step * p.total_steps / 86400)
    # checkpointing recomputes one backbone forward per step, and keeps less
    assert p.step_seconds["per-pass checkpointing"] > p.step_seconds["no checkpointing"]
    assert p.memory["per-pass checkpointing"].activations < p.memory["no checkpointing"].activations


def test_largest_micro_batch_is_the_boundary_of_what_fits():
    for limit in (1, 2, 3, 37, 64, 1000):
        assert P.largest_micro_batch(lambda b: b <= limit) == limit
    assert P.largest_micro_batch(lambda b: False) == 0
    cfg = config_from_dict(_train_cfg(256, 2, 2048, 4, 256, 4))
    mc, n = cfg.model_config(), 3_000_000
    kw = dict(seq_len=256, zero_stage=1, precision="fp32", world=1, checkpointing=False)
    budget = P.memory(mc, n, micro_batch=7, **kw).peak + 1
    best = P.largest_micro_batch(lambda b: P.memory(mc, n, micro_batch=b, **kw).peak <= budget)
    assert best == 7


def test_zero_stages_partition_the_states():
    n, world = 1e9, 8
    z = {s: P.state_bytes(n, s, "bf16", world) for s in (0, 1, 2, 3)}
    assert z[0]["optimizer"] == 12 * n and z[1]["optimizer"] == 12 * n / world  # fp32 master + m + v
    assert z[1]["grads"] == 6 * n  # BF16 optimizer: fp32 accumulation buffer + bf16 .grad
    assert z[2]["grads"] == 2 * n / world and z[3]["params"] == 2 * n / world
    off = P.state_bytes(n, 1, "bf16", world, offload=True)
    assert off["optimizer"] == 0 and off["host"] > 12 * n / world


def test_planner_cli_for_a_shipped_config(capsys):
    assert main(["--config", str(REPO / "configs" / "pythia410m.yaml"), "--gpus", "8", "--gpu", "h100-80gb"]) == 0
    out = capsys.readouterr().out
    for text in ("8 × NVIDIA H100 SXM 80GB", "ZeRO-1", "largest micro-batch that fits", "days to the token budget",
                 "per-pass checkpointing", "pondering"):
        assert text in out
    assert main(["--config", str(REPO / "configs" / "pythia410m-continue.yaml"), "--gpus", "8", "--json",
                   "--gpu-mem-gb", "94", "--gpu-tflops", "500", "--set", "train.micro_batch=4"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["micro_batch"] == 4 and plan["peak_flops"] == 500e12 and plan["params"]["gates"] > 0
    assert plan["usable_bytes"] == pytest.approx((94 - 3) * 2**30)


@pytest.mark.integration
def test_launch_plan_script_runs():
    proc = subprocess.run([sys.executable, str(REPO / "launch" / "plan.py"), "--config", "configs/pythia70m.yaml",
                           "--gpus", "8"], cwd=str(REPO), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "largest micro-batch that fits" in proc.stdout


def test_continued_pretraining_takes_the_backbones_shape():
    def cfg(backbone):
        raw = _train_cfg(64, 2, 97, 4, 32, 2)
        raw["model"] = {"mode": "adaponder", "passes": 4}
        return config_from_dict({**raw, "init": {"backbone": backbone}})

    assert P.model_config_of(cfg("EleutherAI/pythia-160m-deduped")).hidden_size == 768
    with pytest.raises(TrainConfigError, match="init.backbone"):
        P.model_config_of(cfg("someorg/not-a-pythia"))
