"""A non-finite final validation loss fails the run (exit 3, a clear message, no HF export).

The fault injection of the tests (``tests/faults.py``: ``nonfinite_steps``) only reaches training losses (and the guarded step
skips those), so the launcher runs in a fresh process whose ``Trainer.evaluate`` reports a NaN loss.
"""

import json
import subprocess
import sys

import pytest

from helpers_train import REPO, cpu_env, read_metrics, tiny_train_config, write_config

_DRIVER = r"""
import sys
sys.path.insert(0, {launch!r})
import adaponder.train.trainer as T

real = T.Trainer.evaluate

def evaluate(self, max_batches, **kwargs):
    summary = real(self, max_batches, **kwargs)
    summary["val_loss"] = float("nan")
    return summary

T.Trainer.evaluate = evaluate
from pretrain import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.integration
def test_nonfinite_final_validation_loss_exits_3_without_export(data, tmp_path):
    out_dir = tmp_path / "run"
    cfg = tiny_train_config(data["data"], data["tokenizer"], out_dir, train={"steps": 3},
                            checkpoint={"export_hf": True}, eval={"max_batches": 2, "report": True})
    path = write_config(tmp_path / "run.yaml", cfg)
    proc = subprocess.run([sys.executable, "-c", _DRIVER.format(launch=str(REPO / "launch")), "--config", str(path)],
                          env=cpu_env(), capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-4000:]
    expected = (f"stopping: the final validation loss is nan (expected a finite number) at step 3; no Hugging Face "
                f"export was written. The last checkpoint is {out_dir / 'checkpoints' / 'step00000003'}; check the "
                f"data and the train losses in {out_dir / 'metrics.jsonl'}.")
    assert expected in out.splitlines()
    assert not (out_dir / "hf").exists()
    assert not (out_dir / "report.md").exists() and not (out_dir / "summary.json").exists()
    # The training itself went fine and was saved: the checkpoint is there to be inspected.
    assert [r["step"] for r in read_metrics(out_dir)] == [1, 2, 3]
    assert (out_dir / "checkpoints" / "latest").read_text().strip() == "step00000003"
    events = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e.get("kind") == "event"][-1] == "nonfinite_final_eval"
