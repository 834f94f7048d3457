"""``pip install .`` (non-editable) gives working command lines: a wheel built from a copy of the
repository, installed without dependencies into a fresh virtual environment (which sees the project's installed
dependencies through a .pth file, so nothing is downloaded), runs — from an empty folder, offline —
``adaponder-prepare --bundled``, a 2-step ``adaponder-pretrain`` from a shipped preset, and the local lm-eval tasks
through ``adaponder-eval``.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import REPO, SHARED_DATA

pytestmark = pytest.mark.slow

_TOP_SKIP = {".venv", ".git", "runs", "data", "build", "dist", ".pytest_cache", "wandb", "outputs"}


def _copy_repo(dest: Path) -> Path:
    def ignore(folder, names):
        top = Path(folder) == REPO
        return [n for n in names if (top and n in _TOP_SKIP) or n == "__pycache__" or n.endswith((".egg-info", ".pyc"))]

    shutil.copytree(REPO, dest, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("wheel")
    src = _copy_repo(root / "src")
    wheels = root / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(wheels), str(src)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    wheel = next(wheels.glob("adaponder-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # The project's dependencies (torch, deepspeed, lm-eval, ...) without copying or downloading them.
    Path(purelib, "_adaponder_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    inst = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    work = root / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", DS_ACCELERATOR="cpu",
               OMP_NUM_THREADS="1")
    return {"venv": venv, "py": py, "work": work, "env": env, "wheel": wheel}


def _run(installed, *argv, timeout=600, **extra_env):
    exe = installed["venv"] / "bin" / argv[0]
    proc = subprocess.run([str(exe), *argv[1:]], cwd=str(installed["work"]), env={**installed["env"], **extra_env},
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def test_wheel_ships_resources_and_is_what_runs(installed):
    import zipfile

    names = zipfile.ZipFile(installed["wheel"]).namelist()
    for needed in ("adaponder/data/indexed.py", "adaponder/train/trainer.py", "adaponder/cli/pretrain.py",
                   "adaponder/_resources/eval_tasks/adaponder_suite.yaml", "adaponder/_resources/eval_tasks/utils.py",
                   "adaponder/_resources/configs/tiny.yaml", "adaponder/_resources/configs/pythia2.8b-continue.yaml",
                   "adaponder/_resources/launch/finetune_glue.py", "adaponder/assets/corpus/11-0.txt.gz",
                   "adaponder/assets/tokenizer/gpt-neox-20b/tokenizer.json.gz"):
        assert needed in names, needed
    code, out = _run(installed, "python", "-c", "import adaponder, adaponder.resources as r; "
                     "print(adaponder.__file__); print(r.repo_root()); print(r.task_dir())")
    file, root, tasks = out.strip().splitlines()[-3:]
    assert code == 0 and file.startswith(str(installed["venv"])) and root == "None"
    assert tasks.endswith("adaponder/_resources/eval_tasks")
    for script in ("adaponder-pretrain", "adaponder-export", "adaponder-finetune-glue", "adaponder-report"):
        assert (installed["venv"] / "bin" / script).is_file(), script


def test_prepare_pretrain_and_eval_from_the_installed_console_scripts(installed):
    code, out = _run(installed, "adaponder-prepare", "--bundled", "-o", "data/bundled", "-j", "1", "--no-progress")
    assert code == 0, out[-3000:]
    assert (installed["work"] / "data" / "bundled" / "meta.json").is_file()

    sets = ["train.steps=2", "train.micro_batch=2", "train.global_batch=2", "train.threads=1", "data.seq_len=64",
            "data.prepare=null", "train.out_dir=runs/wheel", "eval.max_batches=1", "eval.micro_batch=2",
            "eval.report=false", "logging.progress_bar=false", "logging.every=1"]
    argv = ["adaponder-pretrain", "--config", "configs/tiny.yaml"]  # the preset shipped in the wheel
    for s in sets:
        argv += ["--set", s]
    code, out = _run(installed, *argv)
    assert code == 0, out[-4000:]
    run = installed["work"] / "runs" / "wheel"
    assert (run / "hf" / "config.json").is_file() and "MFU peak:" in out

    if not (SHARED_DATA / "eval" / "piqa").is_dir():
        pytest.skip(f"no eval data at {SHARED_DATA / 'eval'}")
    code, out = _run(installed, "adaponder-eval", str(run / "hf"), "--tasks", "adaponder_piqa,adaponder_arc_easy",
                     "--limit", "2", "--batch_size", "2", ADAPONDER_EVAL_DATA=str(SHARED_DATA / "eval"))
    assert code == 0, out[-4000:]
    assert "adaponder_piqa" in out and "adaponder_arc_easy" in out and "[adaponder] realised compute" in out
