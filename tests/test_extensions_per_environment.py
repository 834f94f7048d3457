"""DeepSpeed's CPU collectives across Python environments on one machine: a start killed during the build leaves
nothing that stops the next run, in this environment or another; each environment builds them at most once.

Two environments are made as a user's two checkouts would be (``python -m venv``), seeing this environment's
packages through a ``.pth`` file: each has its own ``sys.prefix``, hence its own extensions folder. The cache
root is the test's own (``XDG_CACHE_HOME``), so both start with nothing built.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from conftest import REPO
from helpers_train import cpu_env, read_metrics, tiny_train_config, write_config

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="DeepSpeed's CPU collectives: Linux")]


def _environment(folder: Path) -> Path:
    """A new virtual environment at ``folder`` that imports what this one has; returns its interpreter."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    here = sysconfig.get_paths()["purelib"]
    (Path(purelib) / "this_projects_packages.pth").write_text(f"import site; site.addsitedir({here!r})\n")
    return python


def _env(cache: Path) -> dict[str, str]:
    env = cpu_env(XDG_CACHE_HOME=str(cache))
    for name in ("TORCH_EXTENSIONS_DIR", "ADAPONDER_TORCH_EXTENSIONS_DIR"):
        env.pop(name, None)
    return env


def _built(cache: Path) -> dict[str, int]:
    """Each environment folder's built extension and when it was written (ns)."""
    return {so.parent.parent.name: so.stat().st_mtime_ns
            for so in (cache / "adaponder" / "torch_extensions").glob("*/deepspeed_shm_comm/*.so")}


def test_a_start_killed_while_building_stops_no_later_run_and_each_environment_builds_once(tmp_path, data):
    cache = tmp_path / "cache"
    a, b = _environment(tmp_path / "env-a"), _environment(tmp_path / "env-b")
    runs = iter(range(100))

    def config():
        out = tmp_path / f"run{next(runs)}"
        cfg = tiny_train_config(data["data"], data["tokenizer"], out, train={"steps": 2},
                                eval={"every": 0, "at_end": False})
        return write_config(tmp_path / f"{out.name}.yaml", cfg), out

    def pretrain(python: Path):
        cfg, out = config()
        p = subprocess.run([str(python), str(REPO / "launch" / "pretrain.py"), "--config", str(cfg)], cwd=tmp_path,
                           env=_env(cache), capture_output=True, text=True, timeout=900)
        text = p.stdout + p.stderr
        assert p.returncode == 0 and "error:" not in text and "Traceback" not in text, text[-3000:]
        assert [r["step"] for r in read_metrics(out)] == [1, 2], text[-3000:]
        return text

    # environment A's first start, killed (SIGKILL, the whole process group) while torch holds its build lock
    cfg, _ = config()
    first = subprocess.Popen([str(a), str(REPO / "launch" / "pretrain.py"), "--config", str(cfg)], cwd=tmp_path,
                             env=_env(cache), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    deadline = time.monotonic() + 600
    locks = []
    while not locks and first.poll() is None and time.monotonic() < deadline:
        locks = list((cache / "adaponder" / "torch_extensions").glob("*/deepspeed_shm_comm/lock"))
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert len(locks) == 1 and locks[0].exists(), "the start was not caught building"
    killed_folder = locks[0].parent.parent.name

    # environment B starts at once: nothing of A's is in its way
    text = pretrain(b)
    assert "waiting for" not in text and "removed " not in text, text[-3000:]
    built_b = _built(cache)
    assert killed_folder not in built_b and len(built_b) == 1

    # A again: its killed build's lock is cleared with one line, and A builds once
    text = pretrain(a)
    assert f"removed {locks[0]}, left by a build of deepspeed_shm_comm that was killed" in text, text[-3000:]
    built = _built(cache)
    assert set(built) == {killed_folder, *built_b} and built[next(iter(built_b))] == built_b[next(iter(built_b))]

    # alternating: neither environment builds again, nobody waits
    for python in (b, a, b):
        text = pretrain(python)
        assert "waiting for" not in text and "removed " not in text, text[-3000:]
    assert _built(cache) == built
