"""What a study rerun says and does with each arm: a study killed in an arm's training resumes that arm from its
newest checkpoint ("resumed from step N") and trains only the rest; an edited evaluation section re-evaluates the
trained checkpoint of the arms it touches, naming the changed keys, and keeps the others' results; a changed
training section (the arm's own, or that of the arm it starts from) retrains, never reuses the old run."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO

ARM = "adaponder-paper"
NAME = f"{ARM}-s1234"
# 8 steps of 8 × 64 tokens, a checkpoint every 4: the kill in step 6 falls between the checkpoints of steps 4 and 8
FAST = ["base.train.tokens=4096", "base.checkpoint.every=4", "data.vocab=300", "base.model.vocab_size=300",
        "data.val_fraction=0.34", f"study.only=[{ARM}]", "study.repeat_seed=null", "eval.max_tokens_per_doc=256"]

# The training child as the study starts it, but SIGKILLed with the whole study (its process group) as step 6
# begins: a kill between checkpoints, at a step known in advance.
KILLER = """
import os, signal, sys
import adaponder.train.trainer as T
real = T.Trainer.train_step
def train_step(self, train_iter):
    if self.run.step + 1 == 6:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    return real(self, train_iter)
T.Trainer.train_step = train_step
from adaponder.cli.pretrain import main
sys.exit(main())
"""
# The study, its training children started through KILLER.
STUDY_WITH_KILLER = """
import sys
import adaponder.study.arms as arms
def module_command(module, argv):
    return [sys.executable, {killer!r}, *argv]
arms.module_command = module_command
from adaponder.cli.study import main
sys.exit(main(sys.argv[1:]))
"""


def _args(tmp: Path, *extra: str) -> list[str]:
    sets = FAST + [f"study.runs_dir={tmp / 'runs'}", f"study.results_dir={tmp / 'results'}",
                   f"study.report={tmp / 'study.md'}"]
    return ["--config", str(REPO / "configs/study/cpu.yaml"), "--profile", "quick", "--corpus", str(tmp / "corpus"),
            *[a for s in sets for a in ("--set", s)], *extra]


def _env() -> dict[str, str]:
    # unbuffered: what the killed study printed before the kill reaches the pipe
    return {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _study(tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adaponder.cli.study", *_args(tmp, *extra)], cwd=tmp, env=_env(),
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("study_rerun")
    text = gzip.decompress((REPO / "adaponder" / "assets" / "corpus" / "11-0.txt.gz").read_bytes()).decode("utf-8")
    (tmp / "corpus").mkdir()
    for i in range(6):
        (tmp / "corpus" / f"part{i}.txt").write_text(text[20000 + i * 12000: 20000 + (i + 1) * 12000],
                                                     encoding="utf-8", newline="")
    killer = tmp / "killer.py"
    killer.write_text(KILLER)
    proc = subprocess.run([sys.executable, "-c", STUDY_WITH_KILLER.format(killer=str(killer)), *_args(tmp)], cwd=tmp,
                          env=_env(), capture_output=True, text=True, timeout=900, start_new_session=True)
    return tmp, proc


@pytest.mark.integration
@pytest.mark.slow
def test_a_study_killed_in_training_resumes_the_arm_from_its_checkpoint(killed):
    tmp, first = killed
    run = tmp / "runs" / NAME
    assert first.returncode == -9, first.stdout[-3000:] + first.stderr[-3000:]
    assert f"== training {NAME}: started from step 0 of 8;" in first.stdout
    assert [p.name for p in (run / "checkpoints").glob("step*")] == ["step00000004"]
    assert not (tmp / "results" / f"{NAME}.json").exists()

    again = _study(tmp)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"== training {NAME}: resumed from step 4 of 8 ({run / 'checkpoints' / 'step00000004'})" in again.stdout
    out = again.stdout + again.stderr
    # only the rest is trained: steps 6 and 8 are logged (every 2 steps), steps 2 and 4 are not trained again
    assert "step 6/8 |" in out and "step 8/8 |" in out and "step 2/8 |" not in out and "step 4/8 |" not in out
    result = json.loads((tmp / "results" / f"{NAME}.json").read_text())
    assert result["train"]["steps"] == 8 and result["heldout"]["tokens"] > 0

    # nothing changed: nothing trained or evaluated
    third = _study(tmp)
    assert third.returncode == 0, third.stderr[-2000:]
    assert f"== {NAME}: done earlier" in third.stdout and "== training" not in third.stdout
    assert "evaluating" not in third.stdout


@pytest.mark.integration
@pytest.mark.slow
def test_an_edited_evaluation_section_reevaluates_and_says_so(killed):
    tmp, _ = killed
    path = tmp / "results" / f"{NAME}.json"
    before = json.loads(path.read_text())
    assert [row["tau"] for row in before["tau_dial"]] == [1e-4, 0.1, 0.3]
    proc = _study(tmp, "--set", "eval.taus=[1.0e-4, 0.05, 0.1, 0.3]")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (f"== {NAME}: its stored result no longer stands: the evaluation section changed "
            "(eval.taus: [0.0001, 0.1, 0.3] → [0.0001, 0.05, 0.1, 0.3])") in proc.stdout
    assert f"== {NAME}: trained earlier" in proc.stdout and f"== re-evaluating {NAME}" in proc.stdout
    assert "== training" not in proc.stdout
    after = json.loads(path.read_text())
    assert [row["tau"] for row in after["tau_dial"]] == [1e-4, 0.05, 0.1, 0.3]
    assert after["heldout"] == before["heldout"] and after["train"] == before["train"]  # the same checkpoint
    assert after["evaluation"]["taus"] == [1e-4, 0.05, 0.1, 0.3]


# -- the decisions, without training ---------------------------------------------------------------------------
def _cfg(*overrides):
    from adaponder.study import load_study_config

    return load_study_config(REPO / "configs/study/cpu.yaml", "quick", overrides=list(overrides))


def _stored(cfg, arm, mode, passes, **evaluation):
    return {"version": 2, "arm": arm, "seed": 1234, "mode": mode, "passes": passes, "fingerprint": "0" * 16,
            "training_fingerprint": cfg.training_fingerprint(arm, 1234),
            "evaluation": {**json.loads(json.dumps(vars(cfg.eval))), **evaluation}}


def test_an_evaluation_change_touches_only_the_arms_that_read_the_changed_keys():
    from adaponder.study.arms import stale_result

    cfg = _cfg()
    taus = cfg.eval.taus
    why, touching = stale_result(cfg, "vanilla", 1234, _stored(cfg, "vanilla", "vanilla", 1, taus=[0.5]))
    assert why == f"the evaluation section changed (eval.taus: [0.5] → {taus})" and touching == []
    _, touching = stale_result(cfg, "adaponder-paper", 1234, _stored(cfg, "adaponder-paper", "adaponder", 4, taus=[0.5]))
    assert touching == [f"eval.taus: [0.5] → {taus}"]
    # the consistency calibration: only arms with consistency heads
    _, touching = stale_result(cfg, "ponderlm-draft", 1234, _stored(cfg, "ponderlm-draft", "ponderlm", 4,
                                                                    consistency_delta=0.1))
    assert touching == ["eval.consistency_delta: 0.1 → 0.05"]
    _, touching = stale_result(cfg, "ponderlm", 1234, _stored(cfg, "ponderlm", "ponderlm", 4, consistency_delta=0.1))
    assert touching == []
    # the held-out tokens: every arm
    _, touching = stale_result(cfg, "vanilla", 1234, _stored(cfg, "vanilla", "vanilla", 1, max_tokens_per_doc=64))
    assert touching == ["eval.max_tokens_per_doc: 64 → 512"]
    # another training section: never taken for an evaluation change
    other = _cfg("base.optim.weight_decay=0.02")
    why, touching = stale_result(other, "vanilla", 1234, _stored(cfg, "vanilla", "vanilla", 1, taus=[0.5]))
    assert why == "the training section changed since its result was made" and touching is None


@pytest.mark.integration
@pytest.mark.integration  # the training child is a stand-in process
def test_an_arm_whose_source_arm_was_retrained_differently_is_trained_again(tmp_path, monkeypatch):
    """``arm.yaml`` of an arm started from another names only that arm's folder: the training fingerprint recorded
    beside it tells a source trained under another configuration, and the old run is moved aside, not reused."""
    import adaponder.study.arms as arms

    cfg = _cfg(f"study.runs_dir={tmp_path / 'runs'}", f"study.results_dir={tmp_path / 'results'}",
               "arms.gates-alone={from_arm: ponderlm, model.mode: adaponder, init.gates_alone: true}")
    other = _cfg(f"study.runs_dir={tmp_path / 'runs'}", f"study.results_dir={tmp_path / 'results'}",
                 "arms.gates-alone={from_arm: ponderlm, model.mode: adaponder, init.gates_alone: true}",
                 "arms.ponderlm={model.mode: ponderlm, optim.weight_decay: 0.02}")
    data = tmp_path / "data"
    data.mkdir()
    launched = []
    monkeypatch.setattr(arms, "module_command", lambda module, argv: launched.append(argv) or [sys.executable, "-c", ""])
    for arm in ("ponderlm", "gates-alone"):  # two finished runs under cfg
        run = arms.run_dir_of(cfg, arm, 1234)
        (run / "hf").mkdir(parents=True)
        (run / "hf" / "config.json").write_text("{}")
        (run / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "final": True}) + "\n")
        dirs = {"ponderlm": str(arms.run_dir_of(cfg, "ponderlm", 1234) / "hf")}
        (run / "arm.yaml").write_text(yaml.safe_dump(cfg.train_raw(arm, 1234, str(data), str(run), dirs)))
        (run / arms.ARM_IDENTITY_FILE).write_text(json.dumps({"training_fingerprint": cfg.training_fingerprint(arm, 1234)}))
    logged = []
    arms.train_arm(cfg, "gates-alone", 1234, data, log=logged.append)
    assert not launched and sum("trained earlier" in line for line in logged) == 2  # same configuration: reused
    logged.clear()
    arms.train_arm(other, "gates-alone", 1234, data, log=logged.append)
    moved = [line for line in logged if "moved to" in line]
    assert len(moved) == 2 and "optim.weight_decay: 0.01 → 0.02" in moved[0]
    assert "the arm it starts from (ponderlm) was trained under another configuration" in moved[1]
    assert len(launched) == 2 and len(list((tmp_path / "runs").glob("*.stale-*"))) == 2


def test_config_changes_names_every_dotted_key():
    from adaponder.study.arms import config_changes

    assert config_changes({"a": {"b": 1, "c": [1]}, "d": 2}, {"a": {"b": 1, "c": [2]}, "e": 3}) == [
        "a.c: [1] → [2]", "d: 2 → (unset)", "e: (unset) → 3"]
    assert config_changes({"a": 1}, {"a": 1}) == []
