"""A run that cannot succeed stops in seconds, before DeepSpeed starts, with one ``error:`` line: a mistyped data
path (never prepared into), an unknown key, a preset sized for GPUs on a CPU."""

import subprocess
import time

import pytest
import torch

from conftest import REPO

#: Seconds from start to exit code. Reading the configuration imports torch and transformers (~5 s on a busy
#: 2-core VM); DeepSpeed's start-up alone took 46 s before these checks ran first.
BOUND_S = 10.0


def _pretrain(tmp_path, *argv):
    from adaponder.resources import module_command, package_env

    env = package_env()
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    p = subprocess.run(module_command("adaponder.cli.main", ["pretrain", *argv]), cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    return p, time.perf_counter() - t0


def _one_error(p, seconds, *needles):
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), p.stdout + p.stderr
    assert seconds < BOUND_S, f"took {seconds:.1f} s"
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_a_mistyped_data_path_is_an_error_not_a_preparation(tmp_path):
    p, seconds = _pretrain(tmp_path, "--config", "tiny", "--set", "data.path=data/bundle")
    _one_error(p, seconds, "data.path: data/bundle does not exist (given with --set)", "data.prepare ['bundled']")
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()  # nothing prepared, nothing written


def test_an_unknown_key_fails_at_once(tmp_path):
    p, seconds = _pretrain(tmp_path, "--config", "tiny", "--set", "train.nope=1")
    _one_error(p, seconds, "train.nope: unknown key")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_a_gpu_preset_on_a_cpu_says_so_at_once(tmp_path):
    p, seconds = _pretrain(tmp_path, "--config", "pythia410m")
    _one_error(p, seconds, "hardware.requires: gpu (sized for 8 x H100-80GB, bf16), and this machine has no CUDA GPU",
               "--set hardware.requires=any", "data.path: data/pile_deduped does not exist")


def test_preparation_happens_only_where_it_was_asked_for(tmp_path, monkeypatch):
    from adaponder.train.config import TrainConfigError, load_config
    from adaponder.train.preflight import preflight

    monkeypatch.chdir(tmp_path)
    tiny = REPO / "configs" / "tiny.yaml"
    preflight(load_config(tiny))  # the preset's own folder: its data.prepare prepares it on first use
    asked = ["data.path=elsewhere", "data.prepare=[bundled]"]
    preflight(load_config(tiny, asked), asked)  # a folder given on the command line, with its preparation
    unprepared = ["data.prepare=null"]  # the preset's folder, not there, and nothing to prepare it from
    with pytest.raises(TrainConfigError, match=r"data.path: data/bundled does not exist; prepare it first"):
        preflight(load_config(tiny, unprepared), unprepared)
    missing = ["data.path=elsewhere", "data.prepare=[no/such/books]"]
    with pytest.raises(TrainConfigError, match=r"data.prepare: no/such/books not found"):
        preflight(load_config(tiny, missing), missing)
    with pytest.raises(TrainConfigError, match=r"--resume nowhere: no such checkpoint folder"):
        preflight(load_config(tiny), resume="nowhere")


def test_every_gpu_preset_declares_its_hardware():
    from adaponder.strict_yaml import load_yaml
    from adaponder.train.config import load_config
    from adaponder.train.preflight import hardware_problems

    for path in sorted((REPO / "configs").glob("*.yaml")):
        declared = (load_yaml(path.read_text(encoding="utf-8")).get("hardware") or {}).get("requires", "any")
        assert declared == ("gpu" if path.stem.startswith("pythia") else "any"), path.name
    gpu, cpu = load_config(REPO / "configs" / "pythia70m.yaml"), load_config(REPO / "configs" / "tiny.yaml")
    assert hardware_problems(gpu, has_gpu=False) and not hardware_problems(gpu, has_gpu=True)
    assert not hardware_problems(cpu, has_gpu=False)
