"""One job per output folder (docs/reliability.md, section K): a second pretraining, fine-tuning or preparation on
a folder in use exits 2 at once naming the holder; a lock left by a killed process blocks nothing; checkpoint
temporaries carry their writer's PID, so another live writer's are never deleted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers_train import REPO, cpu_env, read_metrics, tiny_train_config, write_config

from adaponder.run_lock import LOCK_NAME, RunLockError, lock_beside, lock_folder

_HOLD = """
import sys, time
from adaponder.run_lock import lock_folder
lock = lock_folder(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


def _wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            if text in path.read_text():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{path} never held {text!r} (exit {proc.poll()})")


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _second_while_the_first_holds(launcher, first_cfg: Path, lock: Path, second_cfg: Path):
    """Start a training run of ``first_cfg``; once its lock file ``lock`` names it, stop it (SIGSTOP) and run
    ``second_cfg`` in ``launcher``; then let the first finish. Returns (the first process, its output, the second's
    exit code, the second's output)."""
    first = subprocess.Popen([sys.executable, str(REPO / "launch" / "pretrain.py"), "--config", str(first_cfg)],
                             cwd=str(REPO), env=cpu_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_text(lock, f"PID {first.pid},", first)
        os.kill(first.pid, signal.SIGSTOP)  # the first run holds the folder while the second starts
        try:
            code, text = launcher.run("--config", second_cfg)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        first_out, _ = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    return first, first_out, code, text


def test_lock_refuses_a_second_holder_naming_it_and_is_freed_on_release(tmp_path):
    folder = tmp_path / "run"
    lock = lock_folder(folder)
    assert (folder / LOCK_NAME).read_text().startswith(f"host {socket.gethostname()}, PID {os.getpid()}, started ")
    with pytest.raises(RunLockError) as err:  # (flock: a second descriptor conflicts even within one process)
        lock_folder(folder)
    msg = str(err.value)
    assert msg.startswith(f"run folder {folder} is in use by another job (host {socket.gethostname()}, PID "
                          f"{os.getpid()}, started ") and str(folder / LOCK_NAME) in msg
    lock.release()
    assert not folder.exists()  # made for the lock, still empty: removed with it
    with lock_folder(folder):
        (folder / "kept.txt").write_text("x")
    assert not (folder / LOCK_NAME).exists() and (folder / "kept.txt").is_file()
    beside = lock_beside(tmp_path / "prepared")
    assert (tmp_path / ".prepared.lock").is_file()
    with pytest.raises(RunLockError, match="output folder .*prepared is in use by another job"):
        lock_beside(tmp_path / "prepared")
    beside.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.integration
def test_two_pretraining_runs_on_one_folder_second_exits_2_first_finishes(data, launcher, tmp_path):
    out = tmp_path / "run"
    # A holder killed with SIGKILL leaves its lock file, but the OS has released the lock: no obstacle.
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], env=cpu_env(), stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "locked"
    holder.kill()
    holder.wait()
    assert f"PID {holder.pid}," in (out / LOCK_NAME).read_text()
    # Temporaries of another live writer (unlocked misuse) must survive; a dead one's are cleaned up.
    ck = out / "checkpoints"
    ck.mkdir()
    other = subprocess.Popen(["sleep", "600"])
    live_tmp, dead_tmp = ck / f".tmp-step00000002-{other.pid}", ck / f".tmp-step00000002-{_dead_pid()}"
    live_tmp.mkdir()
    dead_tmp.mkdir()
    cfg = write_config(tmp_path / "run.yaml", tiny_train_config(data["data"], data["tokenizer"], out,
                                                                  train={"steps": 4}, checkpoint={"every": 2}))
    try:
        first, first_out, code, text = _second_while_the_first_holds(launcher, cfg, out / LOCK_NAME, cfg)
    finally:
        other.kill()
    assert code == 2, text
    assert f"error: run folder {out} is in use by another job (host {socket.gethostname()}, PID {first.pid}, " \
           "started " in text
    assert "training " not in text  # refused before any model or data was built
    assert first.returncode == 0, first_out[-3000:]
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3, 4]  # no rows lost or doubled
    assert live_tmp.is_dir() and not dead_tmp.exists()
    assert not (out / LOCK_NAME).exists()
    code, text = launcher.run("--config", cfg, "--resume", "auto")  # the first run's checkpoints load
    assert code == 0 and f"resumed from {ck / 'step00000004'} at step 4" in text, text


@pytest.mark.integration
def test_a_checkpoint_folder_shared_by_two_runs_is_locked_second_exits_2(data, launcher, tmp_path):
    """``checkpoint.dir`` may name any folder, another run's checkpoints included: it is locked on its own, so a
    second run with another ``train.out_dir`` but the same checkpoint folder is refused, naming the holder."""
    shared = tmp_path / "first" / "checkpoints"  # the first run's own (default) checkpoint folder
    first_cfg = write_config(tmp_path / "first.yaml", tiny_train_config(
        data["data"], data["tokenizer"], tmp_path / "first", train={"steps": 4}, checkpoint={"every": 2}))
    second_cfg = write_config(tmp_path / "second.yaml", tiny_train_config(
        data["data"], data["tokenizer"], tmp_path / "second", checkpoint={"dir": str(shared)}))
    first, first_out, code, text = _second_while_the_first_holds(launcher, first_cfg, shared / LOCK_NAME, second_cfg)
    assert code == 2, text
    assert f"error: checkpoint folder {shared} is in use by another job (host {socket.gethostname()}, PID " \
           f"{first.pid}, started " in text
    assert "training " not in text  # refused before any model or data was built
    assert not (tmp_path / "second").exists()  # its own run folder, made for its lock, is gone with it
    assert first.returncode == 0, first_out[-3000:]
    assert (shared / "latest").read_text().strip() == "step00000004" and not (shared / LOCK_NAME).exists()


_PAUSED_PREPARE = """
import sys
import adaponder.data.prepare as P
check = P._check_output_dir
def paused(out, overwrite):  # the output checked, the lock held: wait for the test
    check(out, overwrite)
    print("checked", flush=True)
    sys.stdin.readline()
P._check_output_dir = paused
from adaponder.cli.prepare import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.integration
def test_two_prepares_into_one_new_output_second_exits_2(data, tmp_path):
    out = tmp_path / "prepared"
    argv = [str(data["corpus"]), "-o", str(out), "--tokenizer", str(data["tokenizer"]), "-j", "1", "--no-progress"]
    first = subprocess.Popen([sys.executable, "-c", _PAUSED_PREPARE, *argv], env=cpu_env(), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert first.stdout.readline().strip() == "checked"
        second = subprocess.run([sys.executable, "-m", "adaponder.cli.prepare", *argv], env=cpu_env(),
                                capture_output=True, text=True, timeout=300)
        first.stdin.write("go\n")
        first.stdin.flush()
        first_out, _ = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 2, second.stderr
    assert second.stderr.strip().splitlines()[-1].startswith(
        f"error: output folder {out} is in use by another job (host {socket.gethostname()}, PID {first.pid}, ")
    assert first.returncode == 0 and "wrote" in first_out, first_out
    assert (out / "meta.json").is_file() and not (tmp_path / ".prepared.lock").exists()


@pytest.mark.integration
def test_finetuning_on_an_output_in_use_exits_2_naming_the_holder(shared_data, tmp_path):
    from helpers_finetune import finetune_argv, start_script

    out = tmp_path / "ft"
    with lock_folder(out):
        proc = start_script(finetune_argv("sst2", out))
        text, _ = proc.communicate(timeout=600)
    assert proc.returncode == 2, text[-3000:]
    assert f"error: --output folder {out} is in use by another job (host {socket.gethostname()}, PID " \
           f"{os.getpid()}, " in text
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()


@pytest.mark.integration
def test_a_refusal_reaches_every_rank_under_deepspeed(data, tmp_path):
    from helpers_train import deepspeed_launch, free_port

    out = tmp_path / "run"
    cfg = write_config(tmp_path / "run.yaml", tiny_train_config(data["data"], data["tokenizer"], out))
    with lock_folder(out):  # held by this process: rank 0 is refused, rank 1 must not wait for it
        code, text = deepspeed_launch(cfg, 2, free_port(), timeout=240)
    assert code == 2, text[-3000:]
    assert text.count(f"error: run folder {out} is in use by another job (host {socket.gethostname()}, PID "
                      f"{os.getpid()}, ") == 1, text[-3000:]  # (printed by rank 0 only)
