"""Pretraining and GLUE fine-tuning run through one harness (``adaponder.train.harness.RunHarness``): the same
resume, checkpoint, signal and stop code paths, watched while real runs of both tasks go through them.

Neither task subclasses the harness: each composes its run from its parts (a ``TaskSpec``). One process runs four
launches with the harness's methods wrapped by a spy that records the task whose parts the run was built from: each
task is stopped by SIGTERM (sent to the process after its first step), then resumed with ``--resume auto`` and run
to its end.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers_finetune import finetune_argv
from helpers_train import REPO, cpu_env, tiny_train_config, write_config

#: The harness methods each task must go through, and how the spy sees them.
SHARED = ("resolve_resume", "check_resume", "load_checkpoint", "save", "_on_signal", "stop_if_asked",
          "run_steps", "close")

_DRIVER = r"""
import json, os, signal, sys
sys.path.insert(0, {launch!r})
from adaponder.train.harness import RunHarness
from adaponder.train.task_spec import TaskSpec

calls = []

def spy(name):
    real = getattr(RunHarness, name)

    def wrapper(self, *args, **kwargs):
        task = type(self.spec.train_step.__self__).__name__  # the task whose parts built this run
        calls.append([task, name, type(self) is RunHarness and type(self.spec) is TaskSpec])
        if name == "stop_if_asked" and self.step == 1 and self.stop_signal is None:
            os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's stop, after the first step
        return real(self, *args, **kwargs)

    setattr(RunHarness, name, wrapper)

for name in {shared!r}:
    spy(name)

import pretrain, finetune_glue
codes = [(pretrain if script == "pretrain" else finetune_glue).main(argv) for script, argv in json.loads(sys.argv[1])]
print("SPY " + json.dumps({{"codes": codes, "calls": calls}}))
"""


@pytest.mark.integration
def test_pretraining_and_finetuning_share_the_harness_code_paths(data, shared_data, tmp_path):
    from adaponder.palbert.finetune import FineTuner
    from adaponder.train.harness import RunHarness
    from adaponder.train.trainer import Trainer

    cfg = write_config(tmp_path / "pre.yaml", tiny_train_config(data["data"], data["tokenizer"], tmp_path / "pre",
                                                                train={"steps": 4}, eval={"max_batches": 2}))
    ft = finetune_argv("sst2", tmp_path / "ft", "timing.enabled=false")
    runs = [("pretrain", ["--config", str(cfg)]), ("pretrain", ["--config", str(cfg), "--resume", "auto"]),
            ("finetune_glue", ft), ("finetune_glue", ft + ["--resume", "auto"])]
    proc = subprocess.run([sys.executable, "-c", _DRIVER.format(launch=str(REPO / "launch"), shared=SHARED),
                           json.dumps(runs)], cwd=str(REPO), env=cpu_env(), capture_output=True, text=True,
                          timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    spied = json.loads(next(line[4:] for line in proc.stdout.splitlines() if line.startswith("SPY ")))
    # Each task stopped on SIGTERM with a checkpoint (128 + 15), then resumed and finished.
    assert spied["codes"] == [143, 0, 143, 0], out[-4000:]
    assert out.count("received SIGTERM: saved ") == 2
    assert f"resumed from {tmp_path / 'pre' / 'checkpoints' / 'step00000002'} at step 2" in out
    assert f"resumed from {tmp_path / 'ft' / 'checkpoints' / 'step00000002'} at step 2" in out
    # Every run is a plain RunHarness built from a TaskSpec (no subclass of it) ...
    assert all(composed for _, _, composed in spied["calls"]), spied["calls"]
    for task in ("Trainer", "FineTuner"):
        seen = {name for who, name, _ in spied["calls"] if who == task}
        assert seen == set(SHARED), f"{task} went around the harness: {sorted(set(SHARED) - seen)}"
    # ... and neither task has its own version of them.
    for cls in (Trainer, FineTuner):
        assert not issubclass(cls, RunHarness)
        assert not set(SHARED) & set(dir(cls)), f"{cls.__name__} defines {set(SHARED) & set(dir(cls))}"
