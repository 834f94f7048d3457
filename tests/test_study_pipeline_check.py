"""The quick profiles are pipeline checks: their report says so in its title and judges nothing (no claims, goals
or trend verdicts), while the full study's report keeps its verdicts. Drawn from the committed results, no
training."""

import re
from pathlib import Path

import pytest

from conftest import REPO

from adaponder.study import trend
from adaponder.study.config import load_study_config
from adaponder.study.report import PIPELINE_TITLE, write_report

#: What a judgement looks like in the report: the claims table, the goals table, a verdict word.
VERDICTS = re.compile(r"claim|verdict|\bholds\b|does not hold|within noise|undecided|not met|cannot be tested|### Goals",
                      re.IGNORECASE)


def _report(tmp: Path, config: str, results_dir: str, profile: str | None) -> str:
    cfg = load_study_config(REPO / config, profile, overrides=[
        f"study.results_dir={tmp / 'results'}", f"study.report={tmp / 'study.md'}", "study.compare_results=[]"])
    results = trend.load_results(REPO / results_dir)
    meta = {"documents": 54, "val_documents": 5, "train_tokens": 1000, "val_tokens": 100}
    if "reasoning" in config:
        meta["task"] = {"name": "multihop", "symbols": 24}
    return write_report(cfg, results, meta, "adaponder study ...").read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("config,results_dir", [("configs/study/cpu.yaml", "docs/study"),
                                                ("configs/study/reasoning.yaml", "docs/study/reasoning")])
def test_quick_profile_report_is_a_pipeline_check_without_verdicts(tmp_path, config, results_dir):
    text = _report(tmp_path, config, results_dir, "quick")
    first = text.splitlines()[0]
    assert first.startswith(f"# {PIPELINE_TITLE}") and "not a result" in first
    assert VERDICTS.findall(text) == []
    # the tables and plots of the pipeline are all still there
    assert "## Results" in text and "![Pareto plot](results/pareto.png)" in text
    assert (tmp_path / "results" / "pareto.png").stat().st_size > 10_000


def test_full_study_report_keeps_its_verdicts(tmp_path):
    text = _report(tmp_path, "configs/study/cpu.yaml", "docs/study", None)
    assert text.startswith("# Study: AdaPonderLM") and PIPELINE_TITLE not in text
    assert "## The paper's claims at this scale" in text and "| claim | numbers | verdict |" in text
