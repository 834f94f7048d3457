"""A run that cannot succeed stops before any heavy work, with one ``error:`` line: a mistyped data path (never
prepared into), an unknown key, a preset sized for GPUs on a CPU. "Before any heavy work" is checked by what the
process did, not by how long it took: when it exits, DeepSpeed was never imported, no process group was made and
the data preparation never loaded."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO

#: Runs the command as ``adaponder pretrain`` does, then records what the process had done by its exit.
_WATCHED = r"""
import atexit, json, sys
record, argv = sys.argv[1], sys.argv[2:]  # (a command may rewrite sys.argv)
def _record():
    dist = sys.modules.get("torch.distributed")
    done = {"deepspeed": sorted(m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed.")),
            "process_group": bool(dist and dist.is_available() and dist.is_initialized()),
            "preparation": "adaponder.data.prepare" in sys.modules}
    with open(record, "w") as f:
        json.dump(done, f)
atexit.register(_record)
from adaponder.cli.main import main
sys.exit(main(argv))
"""


def _pretrain(tmp_path, *argv):
    from adaponder.resources import package_env

    env = package_env()
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    record = tmp_path / "done.json"
    # a generous guard against a hang, not a speed bound
    p = subprocess.run([sys.executable, "-c", _WATCHED, str(record), "pretrain", *argv], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    return p, json.loads(record.read_text())


def _one_error(p, done, *needles):
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), p.stdout + p.stderr
    assert done == {"deepspeed": [], "process_group": False, "preparation": False}, done
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.integration
def test_the_watch_sees_heavy_work(tmp_path):
    # the record is not vacuous: a command that does import DeepSpeed and prepare data is seen doing so
    from adaponder.resources import package_env

    record = tmp_path / "done.json"
    p = subprocess.run([sys.executable, "-c", _WATCHED.replace(
        "from adaponder.cli.main import main", "import deepspeed, adaponder.data.prepare\nmain = lambda argv: 0"),
        str(record)], cwd=tmp_path, env=package_env(), capture_output=True, text=True, timeout=600)
    done = json.loads(record.read_text())
    assert p.returncode == 0 and "deepspeed" in done["deepspeed"] and done["preparation"], (p.stderr, done)


@pytest.mark.integration
def test_a_mistyped_data_path_is_an_error_not_a_preparation(tmp_path):
    p, done = _pretrain(tmp_path, "--config", "tiny", "--set", "data.path=data/bundle")
    _one_error(p, done, "data.path: data/bundle does not exist (given with --set)", "data.prepare ['bundled']")
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs").exists()  # nothing prepared, nothing written


@pytest.mark.integration
def test_an_unknown_key_fails_at_once(tmp_path):
    p, done = _pretrain(tmp_path, "--config", "tiny", "--set", "train.nope=1")
    _one_error(p, done, "train.nope: unknown key")


@pytest.mark.integration
@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_a_gpu_preset_on_a_cpu_says_so_at_once(tmp_path):
    p, done = _pretrain(tmp_path, "--config", "pythia410m")
    _one_error(p, done, "hardware.requires: gpu (sized for 8 x H100-80GB, bf16), and this machine has no CUDA GPU",
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
