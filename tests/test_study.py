"""The evidence study (`adaponder study`): the quick profile end to end on a tiny corpus, resume arm by
arm, exact reproduction, the trained tokenizer used from prepare through lm-eval, and config errors."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

ARMS = ["vanilla", "ponderlm", "loop", "pause", "adaponder-paper", "adaponder-strong", "ponderlm-k1", "adaponder-warm",
        "ponderlm-draft", "ponderlm-pondernet", "ponderlm-detached"]
REPEATED = ["vanilla", "ponderlm", "adaponder-paper", "ponderlm-draft", "ponderlm-pondernet"]  # also on seed 4321


def _tiny_corpus(folder: Path) -> Path:
    """Six small documents cut from the bundled Alice in Wonderland (CRLF endings kept)."""
    text = gzip.decompress((REPO / "adaponder" / "assets" / "corpus" / "11-0.txt.gz").read_bytes()).decode("utf-8")
    folder.mkdir(parents=True)
    for i in range(6):
        (folder / f"part{i}.txt").write_text(text[20000 + i * 12000: 20000 + (i + 1) * 12000], encoding="utf-8",
                                             newline="")
    return folder


def _study(tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "launch" / "study.py"), "--config", str(REPO / "configs/study/cpu.yaml"),
           "--profile", "quick", "--corpus", str(tmp / "corpus"),
           "--set", f"study.runs_dir={tmp / 'runs'}", "--set", f"study.results_dir={tmp / 'results'}",
           "--set", f"study.report={tmp / 'study.md'}", "--set", "base.train.tokens=2048",
           "--set", "data.vocab=300", "--set", "base.model.vocab_size=300", "--set", "data.val_fraction=0.34",
           *extra]
    env = {**__import__("os").environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("study")
    _tiny_corpus(tmp / "corpus")
    proc = _study(tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, proc


@pytest.mark.integration
def test_quick_profile_trains_and_reports_every_arm(study):
    tmp, proc = study
    results = {p.stem: json.loads(p.read_text()) for p in (tmp / "results").glob("*.json")}
    expected = {f"{a}-s1234" for a in ARMS} | {f"{a}-s4321" for a in REPEATED}
    assert set(results) == expected
    for res in results.values():
        assert res["train"]["tokens"] == 2048 and res["heldout"]["tokens"] > 0
        assert res["heldout"]["ppl"] > 1
    # same budget and data for every arm; the pause arm pays for its (P+1)× sequence, vanilla is cheapest
    flops = {k: v["heldout"]["flops"]["total"] for k, v in results.items()}
    assert min(flops, key=flops.get).startswith("vanilla")
    assert flops["pause-s1234"] > 3 * flops["vanilla-s1234"]
    gated = results["adaponder-strong-s1234"]
    assert [r["tau"] for r in gated["tau_dial"]] == [1e-4, 0.1, 0.3]
    assert len(gated["nll_by_exit_pass"]) == 4
    report = (tmp / "study.md").read_text()
    for arm in ARMS:
        assert f"| {arm} | 1234 |" in report
    # a smoke run of the pipeline: titled as such, and it judges none of the paper's claims
    assert report.startswith("# Pipeline check (quick profile) — not a result") and "adaponder study --config" in report
    assert "The paper's claims at this scale" not in report and "**holds**" not in report
    assert 0 <= results["adaponder-warm-s1234"]["greedy_changed_by_later_passes"] <= 1
    # the arm with consistency heads: its exit calibrated on every other held-out window, read on the others
    cal = results["ponderlm-draft-s1234"]["consistency_exit"]
    assert cal["delta"] == 0.05 and cal["windows"] > 0 and cal["test"]["windows"] > 0
    assert 0 <= cal["test"]["disagreement"] <= 1 and 1 <= cal["test"]["mean_exit"] <= 4
    assert "vanilla-s1234" not in report.split("change the greedy token")[1].split("\n")[0]  # pondering arms only
    for png in ("pareto.png", "training_curves.png", "exit_histograms.png", "nll_by_exit_pass.png", "gate_curves.png"):
        assert (tmp / "results" / png).stat().st_size > 10_000
    # gate statistics travel from the run's metrics into the result and the report; ungated arms carry none
    paper = [c for c in results["adaponder-paper-s1234"]["train"]["curve"] if c.get("gate_median")]
    assert paper and all(len(c["gate_median"]) == 3 and len(c["gate_halt_share"]) == 3 for c in paper)
    assert not any("gate_median" in c or "active_fraction" in c for c in results["vanilla-s1234"]["train"]["curve"])
    gates = report.split("## Gates during training")[1]
    assert "| adaponder-paper | 1234 | none |" in gates and "vanilla" not in gates.split("![")[0]


@pytest.mark.integration
def test_rerun_trains_nothing_and_a_retrained_arm_reproduces_exactly(study):
    tmp, _ = study
    before = json.loads((tmp / "results" / "vanilla-s1234.json").read_text())
    again = _study(tmp)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "== training" not in again.stdout and again.stdout.count("done earlier") == len(ARMS) + len(REPEATED)
    # forget one arm completely (result and run folder): training it again gives the same figures
    import shutil

    (tmp / "results" / "vanilla-s1234.json").unlink()
    shutil.rmtree(tmp / "runs" / "vanilla-s1234")
    third = _study(tmp)
    assert third.returncode == 0, third.stderr[-2000:]
    assert third.stdout.count("== training") == 1
    after = json.loads((tmp / "results" / "vanilla-s1234.json").read_text())
    assert after["heldout"] == before["heldout"]
    assert [c["lm_loss"] for c in after["train"]["curve"]] == [c["lm_loss"] for c in before["train"]["curve"]]


@pytest.mark.integration
def test_refresh_training_rereads_curves_without_training(study):
    """A result stored before its summary held gate statistics gets them back from the run folder: nothing is
    trained or evaluated, and the evaluation figures are untouched."""
    tmp, _ = study
    path = tmp / "results" / "adaponder-paper-s1234.json"
    stored = json.loads(path.read_text())
    stripped = [{k: v for k, v in c.items() if not k.startswith("gate_")} for c in stored["train"]["curve"]]
    path.write_text(json.dumps({**stored, "train": {**stored["train"], "curve": stripped}}))
    proc = _study(tmp, "--report-only", "--refresh-training")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "adaponder-paper-s1234: training summary re-read" in proc.stdout and "== training" not in proc.stdout
    after = json.loads(path.read_text())
    assert after["train"]["curve"] == stored["train"]["curve"] and after["heldout"] == stored["heldout"]
    assert after["train"]["wall_s"] == stored["train"]["wall_s"]


@pytest.mark.integration
def test_trained_tokenizer_is_used_from_prepare_to_lm_eval(study, shared_data):
    """prepare --train-tokenizer → train → export → lm-eval on the exported checkpoint, all with the 300-entry BPE."""
    tmp, _ = study
    data = next((tmp / "runs").glob("data-*"))
    meta = json.loads((data / "meta.json").read_text())
    assert meta["vocab_size"] == 300 and meta["tokenizer"]["trained_on"] == "train split"
    ckpt = tmp / "runs" / "adaponder-strong-s1234" / "hf"
    from transformers import AutoTokenizer

    from adaponder.data import load_tokenizer

    ours = load_tokenizer(data / "tokenizer.json")
    exported = AutoTokenizer.from_pretrained(ckpt)
    sample = (tmp / "corpus" / "part0.txt").read_text(encoding="utf-8")
    assert exported(sample, add_special_tokens=False)["input_ids"] == ours.encode(sample)
    assert ours.decode(ours.encode(sample)) == sample  # byte-level: lossless, CRLF included
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import adaponder.evaluation.lm_eval_model  # noqa: F401  (registers "adaponder")

    if not (shared_data / "eval" / "lambada_openai").is_dir():
        pytest.skip("lm-eval task data not found")
    res = simple_evaluate(model="adaponder", model_args=f"checkpoint={ckpt}", tasks=["adaponder_lambada_openai"],
                          limit=4, batch_size=4, device="cpu",
                          task_manager=TaskManager(include_path=str(REPO / "eval" / "tasks")), bootstrap_iters=0)
    assert res["results"]["adaponder_lambada_openai"]["sample_len"] == 4
    assert res["config"]["adaponder"]["scored"]["tokens"] >= 4


def test_study_config_errors_name_every_key(tmp_path):
    from adaponder.study import StudyConfigError, load_study_config

    bad = tmp_path / "bad.yaml"
    raw = (REPO / "configs/study/cpu.yaml").read_text()
    bad.write_text(raw.replace("  vocab: 4096", "  vocab: 4096\n  vocabulary: 5").replace(
        "loop: {model.mode: loop}", "loop: {model.mode: looped}"))
    with pytest.raises(StudyConfigError) as err:
        load_study_config(bad, overrides=["data.vocab=100", "data.val_fraction=1", "eval.taus=[0.1, x]",
                                          "study.seed=1e3"])  # YAML 1.1 reads 1e3 as a string: still a number
    *problems, arm = err.value.problems
    assert problems == [
        "data.vocab: must be >= 258, got 100",
        "data.vocabulary: unknown key (did you mean vocab?)",
        "data.val_fraction: must be < 1, got 1",
        "eval.taus: must be a list of a number, got [0.1, 'x']",
    ]
    assert arm.startswith("arms.loop: model: 'mode' must be one of") and arm.endswith("got 'looped'")
    assert str(bad) in str(err.value)
    with pytest.raises(StudyConfigError, match="profile 'huge' is not defined"):
        load_study_config(REPO / "configs/study/cpu.yaml", profile="huge")
