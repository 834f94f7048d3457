"""``adaponder-report`` on the tiny checkpoint: report.md holds every table, the PNGs exist and are images."""

import json

import matplotlib.image as mpimg
import pytest

from adaponder.modeling.run_settings import DEFAULT_TAU
from conftest import SHARED_DATA
from helpers_evaluation import tiny_checkpoint

TEXT = ("The old lighthouse keeper climbed the stairs every evening. He lit the lamp, wrote the weather in "
        "his log and watched the ships pass the rocks. One night the lamp failed, and he kept a fire burning "
        "on the gallery until dawn, so that no ship was lost. ") * 3


@pytest.mark.integration
def test_report_on_tiny_checkpoint(tmp_path_factory, tmp_path):
    if not (SHARED_DATA / "eval" / "lambada_openai").is_dir():
        pytest.skip("eval data not found")
    from adaponder.cli.report import main

    ckpt = tiny_checkpoint(tmp_path_factory)
    data = tmp_path / "heldout.txt"
    data.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "report"
    assert main([str(ckpt), "--out", str(out), "--data", str(data), "--window", "96", "--stride", "48",
                 "--taus", "0.3,0.5,0.7", "--tasks", "adaponder_lambada_openai,adaponder_piqa", "--limit", "3",
                 "--num-fewshot", "0,5", "--lm-eval-batch-size", "4", "--bootstrap-iters", "10",
                 "--device", "cpu"]) == 0

    md = (out / "report.md").read_text(encoding="utf-8")
    for heading in ("## Recurrence settings (pinned)", "## Perplexity and bits per byte", "## Compute (A17)",
                    "## Halting: where the gates spend compute", "## Iso-FLOPs control",
                    "## Compute dial (τ sweep)", "## lm-eval"):
        assert heading in md, heading
    assert f"halting threshold τ: {DEFAULT_TAU:g}" in md and "passes K: 4" in md
    assert "| uniform fixed pruning |" in md and "| geometric fixed pruning |" in md
    assert "| adaponder_piqa | acc |" in md and "| adaponder_lambada_openai | perplexity |" in md
    assert "0-shot | 5-shot" in md and "mean exit pass (scored tokens)" in md
    for png in ("exit_histogram.png", "nll_by_exit_pass.png", "ppl_vs_flops.png"):
        assert f"]({png})" in md
        assert (out / png).stat().st_size > 0
        img = mpimg.imread(out / png)
        assert img.shape[0] > 100 and img.shape[1] > 100

    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["tau"] == DEFAULT_TAU
    rows = (out / "tokens.tsv").read_text(encoding="utf-8").splitlines()
    assert rows[0].split("\t") == ["doc", "position", "token_id", "token", "exit_pass", "nll"]
    exits = [int(r.split("\t")[4]) for r in rows[1:]]
    assert results["learned"]["tokens"] == len(exits) > 0
    # The learned policy's numbers and the iso-FLOPs target, recomputed from the per-token dump.
    assert results["learned"]["exit_histogram"] == [exits.count(k) for k in range(1, 5)]
    assert results["learned"]["mean_exit"] == pytest.approx(sum(exits) / len(exits))
    assert results["target"] == pytest.approx(sum(exits) / len(exits))
    for rule in ("uniform", "geometric"):  # each fixed-pruning policy is built for that mean
        assert results["iso"][rule]["target_mean_exit"] == pytest.approx(sum(exits) / len(exits))
    assert [r["tau"] for r in results["dial"]] == [0.3, 0.5, 0.7]
    assert {(r["task"], r["num_fewshot"]) for r in results["lm_eval"]} == {
        (t, n) for t in ("adaponder_lambada_openai", "adaponder_piqa") for n in (0, 5)}
    assert all("error" not in r and r["metrics"] for r in results["lm_eval"])


def test_help_states_the_report_defaults():
    from adaponder.cli.report import build_parser
    from adaponder.evaluation.report import DEFAULT_MAX_TOKENS

    helps = {a.dest: a.help for a in build_parser()._actions}  # reading the parser, not editing it
    assert helps["max_tokens"] == f"cap on scored tokens per --data entry (default {DEFAULT_MAX_TOKENS}; 0 = all)"
    assert helps["data"].startswith("text files/folders") and "(default: " in helps["data"]


class _FakeLM:
    def __init__(self, **kwargs):
        pass

    def reset_halting_stats(self):
        pass

    def halting_summary(self):
        return {}


class _FakeTasks:
    all_tasks = ["ok_task", "missing_data", "buggy"]


def test_lm_eval_missing_data_is_a_row_and_a_bug_propagates(monkeypatch):
    """Only a task whose data file is missing becomes a table row; any other error fails the report."""
    pytest.importorskip("lm_eval")
    import lm_eval

    import adaponder.evaluation.lm_eval_model as lm_eval_model
    from adaponder.evaluation.report import run_lm_eval, unknown_tasks
    from adaponder.evaluation.settings import RecurrenceSettings

    def simple_evaluate(tasks, **kwargs):
        if tasks == ["missing_data"]:
            raise FileNotFoundError("/nowhere/lambada_test.jsonl not found")
        if tasks == ["buggy"]:
            raise ZeroDivisionError("a bug")
        return {"results": {tasks[0]: {"acc,none": 0.5, "acc_stderr,none": 0.1, "sample_len": 3}}}

    monkeypatch.setattr(lm_eval, "simple_evaluate", simple_evaluate)
    monkeypatch.setattr(lm_eval_model, "AdaPonderLM", _FakeLM)
    settings = RecurrenceSettings(checkpoint="ckpt", mode="adaponder", passes=4, trained_passes=4,
                                  tau=0.5)
    kw = dict(shots=[0], limit=3, batch_size=1, include_path=None, seed=0, bootstrap_iters=0, tm=_FakeTasks())
    rows = run_lm_eval("ckpt", settings, ["ok_task", "missing_data"], **kw)
    assert rows[0]["metrics"] == {"acc": (0.5, 0.1)} and "error" not in rows[0]
    assert rows[1]["error"] == "FileNotFoundError: /nowhere/lambada_test.jsonl not found"
    with pytest.raises(ZeroDivisionError):
        run_lm_eval("ckpt", settings, ["ok_task", "buggy"], **kw)
    assert unknown_tasks(["ok_task", "typo", "buggy"], _FakeTasks()) == ["typo"]
