"""Every figure of the evaluation report, the studies and the training report, rendered from the committed study
results (docs/study/**.json) and from synthetic results with crowded elements (ten τ values, five of them
within 3 % of one pass): no text box overlaps another or leaves the figure, no annotation sits on a spine, no
marker hides under another, legends stay outside the axes, log axes carry plain-number ticks, no two lines look
alike or run unseen under one another, and no footer carries an absolute path."""

from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from conftest import REPO  # noqa: E402
from helpers_plots import all_problems, text_boxes  # noqa: E402

from adaponder.evaluation import plots as eval_plots  # noqa: E402
from adaponder.study import difficulty_report, gate_report, trend  # noqa: E402
from adaponder.study import plots as study_plots  # noqa: E402
from adaponder.study.config import load_study_config  # noqa: E402
from adaponder.study.report import data_note  # noqa: E402
from adaponder.train import gate_watch  # noqa: E402
from adaponder.train import report as train_report  # noqa: E402

TEXT = trend.load_results(REPO / "docs/study")
REASONING = trend.load_results(REPO / "docs/study/reasoning")
TOKENS_4M = trend.load_results(REPO / "docs/study/tokens-4m")
ABSOLUTE = "/somewhere/private/machine"


def _note(shown):
    """The footer the study writes for a corpus and runs folder given as absolute paths."""
    cfg = load_study_config(REPO / "configs/study/cpu.yaml", corpus=[f"{ABSOLUTE}/corpus/gutenberg"],
                            overrides=[f"study.runs_dir={ABSOLUTE}/runs"])
    return data_note(cfg, {"documents": 54, "val_documents": 5}, shown)


def _dial():
    taus = (1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
    rows = [{"tau": t, "ppl": 30.0 + 12 * t, "flops": {"x_one_pass": 4.0 - 3.0 * t if t < 0.2 else 1.0 + 0.01 * t}}
            for t in taus]
    points = {"uniform": (2.0, 33.0), "geometric": (2.0, 33.4), "no halting": (4.0, 30.0),
              "first pass only": (1.0, 39.0)}
    return rows, {k: {"ppl": p, "flops": {"x_one_pass": x}} for k, (x, p) in points.items()}


def _gate_records():
    return [{"kind": "train", "step": 10 * i, "tau": 1e-4, "gate_median": [0.9 / (i + 1), 1e-3 / (i + 1), 0.5],
             "active_fraction": [1.0, 0.9 - 0.01 * i, 0.5, 0.2]} for i in range(1, 30)]


FIGURES = {
    "evaluation ppl_vs_flops": lambda: eval_plots.draw_ppl_vs_flops(*_dial()),
    "evaluation exit_histogram": lambda: eval_plots.draw_exit_histogram(
        {"learned": [500, 120, 80, 300], "uniform": [480, 140, 90, 290], "geometric": [470, 150, 100, 280]}),
    "evaluation exit_histogram, K=8": lambda: eval_plots.draw_exit_histogram(
        {"learned": [5, 4, 3, 2, 2, 2, 1, 1], "uniform": [4] * 8, "geometric": [8, 6, 4, 3, 2, 1, 1, 1]}),
    "evaluation nll_by_exit": lambda: eval_plots.draw_nll_by_exit(
        [{"exit_pass": d, "tokens": 1000 * d, "mean_nll": 3.0 + 0.2 * d} for d in (1, 2, 3, 4)]),
    "study pareto": lambda: study_plots.draw_pareto(TEXT, _note(TEXT)),
    "study nll_by_exit_pass": lambda: study_plots.draw_nll_by_exit(TEXT, _note(TEXT)),
    "study exit_histograms": lambda: study_plots.draw_exit_histograms(TEXT, _note(TEXT)),
    "study training_curves": lambda: study_plots.draw_training_curves(TEXT, _note(TEXT)),
    "study gate_curves": lambda: gate_report.draw_gate_curves(TEXT, _note(TEXT)),
    "tokens-4m pareto": lambda: study_plots.draw_pareto(TOKENS_4M, _note(TOKENS_4M)),
    "tokens-4m training_curves": lambda: study_plots.draw_training_curves(TOKENS_4M, _note(TOKENS_4M)),
    "tokens-4m token_trend": lambda: trend.draw_trend(trend.budget_table(TEXT + TOKENS_4M, 1234), _note(TEXT), 0.5),
    "reasoning pareto": lambda: study_plots.draw_pareto(REASONING, _note(REASONING)),
    "reasoning nll_by_exit_pass": lambda: study_plots.draw_nll_by_exit(REASONING, _note(REASONING)),
    "reasoning exit_histograms": lambda: study_plots.draw_exit_histograms(REASONING, _note(REASONING)),
    "reasoning training_curves": lambda: study_plots.draw_training_curves(REASONING, _note(REASONING)),
    "reasoning gate_curves": lambda: gate_report.draw_gate_curves(REASONING, _note(REASONING)),
    "reasoning accuracy_by_difficulty": lambda: difficulty_report.draw_accuracy(
        [r for r in REASONING if r.get("difficulty")], _note(REASONING)),
    "reasoning exit_by_difficulty": lambda: difficulty_report.draw_exit(
        [r for r in REASONING if r.get("difficulty")], _note(REASONING)),
    "training exit_pass_hist": lambda: train_report.draw_histogram([120, 40, 30, 310], "mean exit pass 3.0 of K=4"),
    "training gates": lambda: gate_watch.draw_gate_curves(_gate_records(), "Gates during training (warm-up: off)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FIGURES))
def test_figure_is_readable(name):
    fig = FIGURES[name]()
    assert fig is not None, f"{name}: nothing drawn from the fixture"
    try:
        assert all_problems(fig) == [], name
        texts = [t.get_text() for t, _ in text_boxes(fig)]
        assert len(texts) >= 5  # titles, axis and tick labels at least: the check saw the figure
        assert not any(ABSOLUTE in s for s in texts), f"{name}: an absolute path in the figure"
    finally:
        plt.close(fig)


def test_the_checks_catch_overlapping_labels_hidden_markers_and_inner_legends():
    """The checks themselves: a figure with each fault is reported, its clean twin is not."""
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1, 2, 3], "o-", label="dial")
    ax.scatter([1], [1], s=300, color="k", zorder=5, label="first pass only")
    ax.annotate("τ=0.2", (2, 2))
    ax.annotate("τ=0.3", (2, 2.01))
    ax.legend(loc="center")
    ax.set_yscale("log")
    problems = " | ".join(all_problems(fig))
    plt.close(fig)
    for what in ("overlap: 'τ=0.2' and 'τ=0.3'", "hidden under 'first pass only'", "legend over an axes",
                 "log axis y"):
        assert what in problems


def test_quick_profile_histogram_promises_only_what_it_draws():
    """Arms that never halt carry no fixed-pruning controls: neither the title nor the legend mentions them."""
    bare = [{**r, "fixed_pruning": {}} for r in TEXT]
    fig = study_plots.draw_exit_histograms(bare, "note")
    texts = " ".join(t.get_text() for t, _ in text_boxes(fig))
    plt.close(fig)
    assert "learned gates" in texts and "pruning" not in texts
    fig = study_plots.draw_exit_histograms(TEXT, "note")
    texts = " ".join(t.get_text() for t, _ in text_boxes(fig))
    plt.close(fig)
    assert "fixed pruning, uniform" in texts and "fixed pruning, geometric" in texts


def test_png_writers_save_the_drawn_figure(tmp_path: Path):
    rows, points = _dial()
    assert eval_plots.ppl_vs_flops_png(rows, tmp_path / "p.png", points=points).stat().st_size > 10_000
    assert study_plots.pareto_png(TEXT, tmp_path / "s.png", _note).stat().st_size > 10_000
    assert gate_watch.gate_curves_png(_gate_records(), tmp_path / "g.png", "gates").stat().st_size > 10_000
    assert gate_watch.gate_curves_png([{"kind": "train", "step": 1}], tmp_path / "none.png", "gates") is None
    assert train_report.save_histogram_png([1, 2, 3, 4], tmp_path / "h.png", "t").stat().st_size > 5_000
    assert plt.get_fignums() == []  # every writer closes its figure
