"""No long silent phase in ``adaponder-pretrain``: preparing ``data.prepare`` on first use says what it prepares and
where, then shows a tokenizing bar; after the last step it says what the remaining time goes to (final validation,
checkpoint, export) and shows a validation bar."""

import subprocess
import sys

import pytest

from helpers_train import REPO, cpu_env, tiny_corpus

pytestmark = pytest.mark.slow


def test_pretrain_announces_and_shows_preparation_and_the_end_phases(tmp_path):
    corpus = tiny_corpus(tmp_path / "corpus", documents=8, chars_per_doc=2000)
    data = tmp_path / "data" / "prepared"
    argv = [sys.executable, "-m", "adaponder.cli.pretrain", "--config", str(REPO / "configs" / "tiny.yaml")]
    for kv in (f"data.path={data}", f"data.prepare=[{corpus}]", "data.val_fraction=0.25", "data.seq_len=32",
               "train.steps=1", "train.micro_batch=2", "train.global_batch=2", "train.threads=1",
               f"train.out_dir={tmp_path / 'run'}", "eval.max_batches=2", "eval.micro_batch=2", "eval.report=false",
               "logging.progress_bar=true", "logging.every=1"):
        argv += ["--set", kv]
    proc = subprocess.run(argv, cwd=str(tmp_path), env=cpu_env(), capture_output=True, text=True,
                          timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    announced = log.index(f"preparing data.prepare ['{corpus}'] into {data}")
    assert announced < log.index("tokenizing:") < log.index("training adaponder")  # the message comes first
    done = log.index(f"training done; now: final validation, checkpoint, Hugging Face export (into {tmp_path / 'run'})")
    assert done < log.index("validation:") < log.index("exported Hugging Face checkpoint")
    assert (data / "meta.json").is_file()
