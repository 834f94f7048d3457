"""One run engine: pretraining and fine-tuning are composed from the same parts and trained by the same ``fit``.

Each task's real parts (its ``TaskSpec``) are taken as they are, except the data and model builders, replaced by
fakes: synthetic token rows or labelled examples, and a tiny randomly initialised model, with no prepared corpus,
tokenizer or pretrained checkpoint. Both are driven through ``RunHarness`` and ``fit``: stopped at ``train.stop_at``
with a checkpoint written by the shared save path, then resumed from it to their last step.

A run joins a (1-rank) process group and sets ``RANK``/``MASTER_PORT``, so the runs go in a process of their own
(as in ``test_run_harness``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers_finetune import SMOKE
from helpers_train import REPO, cpu_env, tiny_train_config

_DRIVER = r"""
import dataclasses, json, random, sys
from types import SimpleNamespace

import torch

from adaponder.modeling import AdaPonderForCausalLM
from adaponder.palbert.config import load_finetune_config
from adaponder.palbert.finetune import TINY_RANDOM, FineTuner, build_classifier
from adaponder.train.config import config_from_dict
from adaponder.train.engine import fit
from adaponder.train.harness import RunHarness
from adaponder.train.stopping import TrainingStopped
from adaponder.train.trainer import Trainer

args = json.loads(sys.argv[1])
used = {"pretraining": {"data": 0, "model": 0, "rows": 0}, "fine-tuning": {"data": 0, "model": 0}}
FAKE_RECORD = {"train": {"kind": "synthetic", "path": "fake", "split": "train", "fingerprint": "fake"}, "val": None}


class FakeLoader:
    # Synthetic token rows, the same for a given position; the position is the loader's state.
    num_samples = 64

    def __init__(self, rows, seq_len, vocab):
        self.rows, self.seq_len, self.vocab, self.drawn = rows, seq_len, vocab, 0

    def __iter__(self):
        while True:
            g = torch.Generator().manual_seed(self.drawn)
            self.drawn += 1
            used["pretraining"]["rows"] += self.rows
            yield torch.randint(0, self.vocab, (self.rows, self.seq_len + 1), generator=g)

    def state_dict(self):
        return {"drawn": self.drawn}

    def load_state_dict(self, state):
        self.drawn = int(state["drawn"])


def pretraining(resume):
    t = Trainer(config_from_dict(args["pretraining"]), resume)

    def build_data():
        used["pretraining"]["data"] += 1
        t.tokenizer_path, t.tokenizer = None, SimpleNamespace(fingerprint="fake-tokens")

    def open_data():
        t.loader = FakeLoader(t.plan.micro_batch, t.plan.seq_len, t.run.model.config.vocab_size)

    def build_model():
        used["pretraining"]["model"] += 1
        torch.manual_seed(0)
        return AdaPonderForCausalLM(t.cfg.model_config())

    spec = dataclasses.replace(t.run.spec, build_data=build_data, open_data=open_data, data_record=lambda: FAKE_RECORD,
                               build_model=build_model)
    t.run = RunHarness(spec, t.cfg, resume)
    return t


def fine_tuning(resume):
    cfg = load_finetune_config(args["ft_config"], args["ft_overrides"])
    t = FineTuner(cfg, init=TINY_RANDOM, output=args["ft_output"], data_dir=args["glue_dir"], resume=resume,
                  log=lambda line: None)

    def build_data():
        used["fine-tuning"]["data"] += 1
        rng = random.Random(0)
        t.tokenizer = SimpleNamespace(pad_id=1, fingerprint="fake-tokens", name="fake")
        ids = lambda n: [[rng.randrange(2, 200) for _ in range(rng.randrange(3, 10))] for _ in range(n)]
        t.train_ids, t.dev_ids = ids(16), ids(8)
        t.train_y, t.dev_y = [i % 2 for i in range(16)], [i % 2 for i in range(8)]
        t.counts = {"train": 16, "train_full": 16, "dev": 8, "dev_full": 8}
        t.majority = None
        t.steps_per_epoch = 16 // cfg.train.batch_size
        t.run.total_steps, t.eval_every = t.steps_per_epoch, 2

    def build_model():
        used["fine-tuning"]["model"] += 1
        return build_classifier(cfg, TINY_RANDOM, t.spec, seed=0)

    t.run = RunHarness(dataclasses.replace(t.run.spec, build_data=build_data, build_model=build_model), cfg, resume)
    return t


ends = {"pretraining": [], "fine-tuning": []}
for name, make in (("pretraining", pretraining), ("fine-tuning", fine_tuning)):
    for resume in (None, "auto"):
        task = make(resume)
        run = task.run
        with run.session(alike=(TrainingStopped,)):
            run.setup()
            try:
                fit(run, task.training_loop())
                ends[name].append(["done", run.step])
            except TrainingStopped as stop:
                ends[name].append(["stopped", run.step, stop.exit_code])
print("ENGINE " + json.dumps({"ends": ends, "used": used}))
"""


def _glue(folder):
    """A tiny SST-2 (the fine-tuning run reads the examples' fingerprints; the fake builds their tokens)."""
    folder.mkdir(parents=True)
    for split, n in (("train", 16), ("dev", 8)):
        rows = [f"sentence number {i} of {split} \t{i % 2}" for i in range(n)]
        (folder / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return folder.parent


@pytest.mark.integration
def test_pretraining_and_fine_tuning_run_on_one_engine_with_fake_builders(tmp_path):
    pre_out, ft_out = tmp_path / "pre", tmp_path / "ft"
    pre = tiny_train_config(tmp_path / "no-corpus", tmp_path / "no-tokenizer.json", pre_out,
                            train={"steps": 4, "stop_at": 2}, eval={"at_end": False})
    args = {"pretraining": pre, "ft_config": str(REPO / "configs" / "glue" / "sst2.yaml"),
            "ft_overrides": [*SMOKE, "timing.enabled=false", "train.batch_size=4", "train.stop_at=2"],
            "ft_output": str(ft_out), "glue_dir": str(_glue(tmp_path / "glue" / "SST-2"))}
    proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(args)], cwd=str(REPO), env=cpu_env(),
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    report = json.loads(next(line[7:] for line in proc.stdout.splitlines() if line.startswith("ENGINE ")))

    # Both tasks stopped at train.stop_at (exit 0), then resumed from that checkpoint and ran to their last step.
    assert report["ends"] == {"pretraining": [["stopped", 2, 0], ["done", 4]],
                              "fine-tuning": [["stopped", 2, 0], ["done", 4]]}, out[-4000:]
    for folder in (pre_out, ft_out):
        ckpt = folder / "checkpoints"
        assert f"resumed from {ckpt / 'step00000002'} at step 2" in out
        assert (ckpt / "latest").read_text().strip() == "step00000004"
        state = json.loads((ckpt / "step00000004" / "trainer_state.json").read_text())
        # ... and what the shared save path recorded came from the fakes.
        assert state["step"] == 4 and state["compat"]["tokenizer_fingerprint"] == "fake-tokens"
    # The fakes built each run's data and model (one fresh run, one resume), and the fake rows were trained on:
    # 4 steps × 2 micro-batches of 4 rows, none drawn twice across the resume.
    assert report["used"]["pretraining"] == {"data": 2, "model": 2, "rows": 32}
    assert report["used"]["fine-tuning"] == {"data": 2, "model": 2}
    train = [json.loads(line) for line in (pre_out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in train if r.get("kind") == "train"] == [1, 2, 3, 4]
    results = json.loads((ft_out / "results.json").read_text())
    assert results["train"]["steps"] == 4 and "train" in results["phases"]


def test_a_task_without_a_required_part_fails_where_its_spec_is_built():
    from adaponder.train.task_spec import TaskSpec

    parts = dict(folders=lambda: None, build_data=lambda: None, compatibility=dict, data_record=dict,
                 optimizer_values=lambda: None, build_engine=lambda: None, checkpoint_state=dict,
                 train_step=lambda batches: {})
    with pytest.raises(TypeError, match="build_model"):
        TaskSpec(**parts)
    spec = TaskSpec(**parts, build_model=lambda: None)
    assert spec.done_early() is False and spec.run_info() == {} and spec.after_step() is None  # optional: no-ops
