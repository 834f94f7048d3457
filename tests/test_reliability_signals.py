"""A SIGTERM to the ``deepspeed`` runner alone (a scheduler that signals only the process it
started) used to kill the runner and leave the ranks training on, orphaned, without the checkpoint-on-signal.
Now each rank watches the launcher processes above it: they all checkpoint together and exit 143, and the
run continues with ``--resume auto``. The stop message is printed once.

One 2-rank CPU launch (Linux: the test reaps the orphans as a child subreaper to learn their exit codes) and
one 1-rank resume.
"""

import signal
import subprocess
import sys
import threading
import time

import pytest

from adaponder.train.distributed import deal
from adaponder.train.stopping import LauncherWatch
from helpers_train import (REPO, cpu_env, free_port, read_metrics, signal_deepspeed_launch, tiny_train_config, write_config)


@pytest.mark.deepspeed
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reaping orphans needs PR_SET_CHILD_SUBREAPER")
def test_sigterm_to_the_deepspeed_runner_checkpoints_every_rank_and_exits_143(data, tmp_path):
    out = tmp_path / "sig"
    cfg = write_config(tmp_path / "sig.yaml", tiny_train_config(
        data["data"], data["tokenizer"], out, train={"steps": 100000, "grad_accum": None, "global_batch": 8},
        checkpoint={"every": 100000}, eval={"at_end": False}))
    res = signal_deepspeed_launch(cfg, 2, free_port(), wait_for=out / "metrics.jsonl", lines=3, target="runner")
    log = res["log"]
    codes = {p["pid"]: p["code"] for p in res["procs"]}
    launch = [p["pid"] for p in res["procs"] if "deepspeed.launcher.launch" in p["cmd"]]
    assert res["signalled"] == res["runner"] and codes[res["runner"]] == -signal.SIGTERM, log[-3000:]
    assert res["rank_codes"] == {0: 143, 1: 143}, (res, log[-3000:])
    # deepspeed's launch.py, orphaned with the runner gone, exits with its first rank's real exit status
    assert len(launch) == 1 and codes[launch[0]] == 128 + signal.SIGTERM, (res["procs"], log[-3000:])
    # The stop message names the cause once, by rank 0, whichever rank's watch saw the runner go first (rank 0's
    # own watch line, "the launcher process N (deepspeed) is gone", is there only when its watch was first).
    assert log.count("a launcher process is gone: saved") == 1, log[-3000:]
    assert "received SIGTERM: saved" not in log and "signal on another rank" not in log

    ck = out / "checkpoints"
    tag = (ck / "latest").read_text().strip()
    step = int(tag.removeprefix("step"))
    assert step >= 3
    assert {"rank00000.pt", "rank00001.pt", "trainer_state.json"} <= {f.name for f in (ck / tag).iterdir()}
    events = read_metrics(out, "event")
    assert events[-1]["event"] == "stopped_by_signal" and events[-1]["step"] == step
    assert events[-1]["launcher_gone"] is True and events[-1]["signal"] is None
    assert read_metrics(out)[-1]["step"] == step

    # the run goes on from there (here on one rank: the ZeRO-1 state is re-sharded)
    proc = subprocess.run([sys.executable, str(REPO / "launch" / "pretrain.py"), "--config", str(cfg), "--resume",
                           "auto", "--set", f"train.stop_at={step + 1}"], env=cpu_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {ck / tag} at step {step}" in proc.stderr
    assert [r["step"] for r in read_metrics(out)][-2:] == [step, step + 1]


@pytest.mark.integration
def test_launcher_watch_fires_once_when_a_watched_process_exits():
    import psutil

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    fired = []
    watch = LauncherWatch([psutil.Process(child.pid)], lambda: fired.append(time.time()), interval=0.05)
    watch.start()
    time.sleep(0.3)
    assert fired == []  # alive: nothing
    child.terminate()  # left unreaped: a zombie counts as gone
    deadline = time.time() + 10
    while not fired and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    child.wait()
    assert len(fired) == 1
    assert not any(t.name == "adaponder-launcher-watch" and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize("n, world", [(5, 2), (6, 2), (7, 3), (2, 4)])
def test_deal_gives_every_batch_to_one_rank_and_equal_forward_counts(n, world):
    dealt = [list(deal(range(n), r, world)) for r in range(world)]
    counted = sorted(x for part in dealt for x, c in part if c)
    assert counted == list(range(n))  # each batch once, whatever the number of ranks
    assert len({len(part) for part in dealt}) == 1  # same number of forward calls (ZeRO-3)
    assert all(x == n - n % world for part in dealt for x, c in part if not c)  # padding: the last round's first


def test_watch_is_not_started_outside_a_launcher():
    from adaponder.train.stopping import install_stop_signals, restore_signals

    old = install_stop_signals(lambda s: None)
    try:
        assert old.watch is None  # pytest is no launcher: a plain `python ...` run must survive its shell
        assert set(old) == {signal.SIGTERM, signal.SIGINT}
    finally:
        restore_signals(old)


def test_stop_cause_names_own_signal_then_a_launcher_gone_anywhere_then_another_rank():
    from adaponder.train.stopping import stop_cause

    assert stop_cause(signal.SIGINT, True) == "received SIGINT"  # this rank's own signal names the stop
    assert stop_cause(None, True) == "a launcher process is gone"  # another rank's watch saw it first
    assert stop_cause(None, False) == "received a signal on another rank"
