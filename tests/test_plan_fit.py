"""Presets that fit the hardware they are sized for, the planner's advice when a run does not fit, and the
trainer's start-up warning (``adaponder/train/plan.py``)."""

import re
import shlex

import pytest
import torch

from conftest import REPO

from adaponder.cli.plan import main
from adaponder.modeling import AdaPonderConfig
from adaponder.train import plan as P
from adaponder.train.config import config_from_dict, load_config

PRESETS = sorted((REPO / "configs").glob("pythia*.yaml"))
SIZED_FOR = re.compile(r"^# Sized for: (\d+) x (\S+?),", re.MULTILINE)


def _sized_for(path):
    header = "".join(line for line in path.read_text(encoding="utf-8").splitlines(keepends=True)
                     if line.startswith("#"))
    match = SIZED_FOR.search(header)
    assert match, f"{path.name}: no '# Sized for: N x GPU, ...' line in its header comment"
    gpu = match.group(2).lower()
    assert gpu in P.DEVICES, f"{path.name}: sized for {match.group(2)}, not a device of the planner's table"
    return int(match.group(1)), P.DEVICES[gpu]


def _advice(text):
    """The KEY=VALUE pairs of the planner's 'to fit: --set ...' line."""
    line = next(line for line in text.splitlines() if line.startswith("to fit: --set"))
    words = shlex.split(line.split("(")[0].removeprefix("to fit:"))
    assert words[::2] == ["--set"] * (len(words) // 2)
    return words[1::2]


def test_there_are_pythia_presets():
    assert len(PRESETS) >= 9 and any("continue" in p.name for p in PRESETS)


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_every_pythia_preset_fits_its_hardware_with_headroom(path):
    gpus, device = _sized_for(path)
    p = P.make_plan(load_config(path), gpus, device)
    peak = p.memory[p.config_variant].peak
    assert p.headroom >= P.HEADROOM, (f"{path.name}: peak {peak / P.GiB:.1f} GiB of {p.usable_bytes / P.GiB:.1f} GiB "
                                      f"usable on {gpus} x {device.label}: {p.headroom:.0%} headroom")
    assert p.global_batch == 1024 and p.micro_batch * p.grad_accum * gpus == 1024  # Pythia's global batch
    assert p.advice == [] and P.format_plan(p).count("fits: yes") == 1


def test_advice_for_a_config_that_does_not_fit_makes_it_fit(capsys):
    config = str(REPO / "configs" / "pythia410m.yaml")
    assert main(["--config", config, "--gpus", "8", "--gpu", "h100-80gb", "--set", "train.micro_batch=16"]) == 0
    out = capsys.readouterr().out
    assert "fits: no (peak 106.47 GiB of 76.65 GiB usable)" in out
    sets = _advice(out)
    assert sets == ["train.micro_batch=8"]  # the largest dividing 1024 / 8 that leaves the headroom (11 fits bare)
    assert main(["--config", config, "--gpus", "8", "--gpu", "h100-80gb", "--json", "--set", *sets]) == 0
    import json

    plan = json.loads(capsys.readouterr().out)
    assert plan["headroom"] >= P.HEADROOM and plan["global_batch"] == 1024 and plan["grad_accum"] == 16
    assert plan["advice"] == []


def _small_run(**train):
    return config_from_dict({
        "model": {"size": "410m"}, "data": {"path": "unused", "seq_len": 2048},
        "deepspeed": {"zero_stage": 1, "precision": "bf16"},
        "train": {"steps": 10, "micro_batch": 16, **train}})


def test_advice_names_accumulation_when_the_config_gives_it_and_checkpointing_when_needed():
    cfg = _small_run(grad_accum=4)  # 16 × 4 × 2 ranks = 128
    p = P.make_plan(cfg, 2, P.DEVICES["h100-80gb"])
    assert p.headroom < 0
    b = int(p.advice[0].split("=")[1])
    assert p.advice == [f"train.micro_batch={b}", f"train.grad_accum={64 // b}"] and 64 % b == 0
    fixed = P.make_plan(_small_run(micro_batch=b, grad_accum=64 // b), 2, P.DEVICES["h100-80gb"])
    assert fixed.headroom >= P.HEADROOM and fixed.global_batch == 128
    bigger = next(x for x in range(b + 1, 65) if 64 % x == 0)
    assert P.make_plan(_small_run(micro_batch=bigger, grad_accum=64 // bigger), 2,
                       P.DEVICES["h100-80gb"]).headroom < P.HEADROOM  # the largest that fits

    # 13 GiB: not even one sequence of 2048 tokens × 4 passes without checkpointing, one with it (a GPU's
    # pondering blocks of 2**27 entries take 1.2 GiB of it; at 12 GiB not even that fits)
    small = P.make_plan(cfg, 2, P.DEVICES["h100-80gb"], memory_gib=13)
    assert small.advice[-1] == "deepspeed.activation_checkpointing=true"
    text = P.format_plan(small)
    assert "to fit: --set train.micro_batch=" in text and "--set deepspeed.activation_checkpointing=true" in text
    sets = {k: v for k, v in (s.split("=") for s in small.advice)}
    cfg2 = _small_run(micro_batch=int(sets["train.micro_batch"]), grad_accum=int(sets["train.grad_accum"]))
    cfg2.deepspeed.activation_checkpointing = True
    assert P.make_plan(cfg2, 2, P.DEVICES["h100-80gb"], memory_gib=13).headroom >= P.HEADROOM
    # nothing fits: the line says what else to change
    hopeless = P.format_plan(P.make_plan(cfg, 2, P.DEVICES["h100-80gb"], memory_gib=4))
    assert "fits: no" in hopeless and "to fit: not even micro-batch 1" in hopeless


def test_startup_warning_on_a_gpu_too_small_and_silence_elsewhere():
    cfg = _small_run(global_batch=128)
    model_cfg = cfg.model_config()
    before = model_cfg.to_dict()
    gpu = torch.device("cuda", 0)  # never touched: memory and name are given
    line = P.startup_memory_warning(cfg, gpu, 8, model_cfg, total_memory=80 * 2**30, name="Fake GPU 80GB")
    assert line is not None and line.startswith("warning: this run will not fit Fake GPU 80GB (80.0 GiB")
    assert "to fit: --set train.micro_batch=8" in line and line.count("\n") == 0
    assert model_cfg.to_dict() == before  # the trained model's configuration is read, never written
    assert P.startup_memory_warning(cfg, gpu, 8, model_cfg, total_memory=141 * 2**30, name="Fake GPU") is None
    assert P.startup_memory_warning(cfg, torch.device("cpu"), 8, model_cfg, total_memory=1, name="x") is None
    assert isinstance(model_cfg, AdaPonderConfig)
