"""The study report's gate section: per-gate curves of each gated arm and where its gates ended, read from the
training summary (no training here: synthetic summaries)."""

from pathlib import Path

from adaponder.study import gate_report


def _result(arm: str, seed: int, warmup: str | None, medians: list[list[float]]) -> dict:
    curve = []
    for i, m in enumerate(medians):
        row = {"step": 25 * (i + 1), "tokens": 1000 * (i + 1), "lm_loss": 3.0, "tau": 1e-4,
               "active_fraction": [1.0, 0.9, 0.5, 0.2]}
        if warmup and i < 2:
            row["gate_warmup"] = warmup  # a bypassed warm-up logs no gate statistics
        else:
            row |= {"gate_median": m, "gate_halt_share": [0.1, 0.4, 0.6]}
        curve.append(row)
    return {"arm": arm, "seed": seed, "train": {"curve": curve}}


def test_section_tabulates_final_and_lowest_medians_and_draws_every_gated_arm(tmp_path: Path):
    results = [
        {"arm": "vanilla", "seed": 1, "train": {"curve": [{"step": 25, "lm_loss": 3.0}]}},
        _result("adaponder-warm", 1, "bypassed", [[0, 0, 0], [0, 0, 0], [0.9, 1e-9, 0.5], [0.8, 1e-3, 0.4]]),
        _result("adaponder-paper", 1, None, [[0.99, 0.9, 0.9], [1e-12, 0.5, 0.7], [1e-8, 0.6, 0.8]]),
    ]
    lines = gate_report.section(results, tmp_path, lambda p: Path(p).name, lambda shown: f"{len(shown)} runs")
    text = "\n".join(lines)
    table = text.split("![")[0]
    assert "vanilla" not in table
    # warm-up column, final medians, lowest medians (the warm-up rows carry none), halt shares, passes 2..K active
    assert "| adaponder-warm | 1 | bypassed | 0.8 / 0.001 / 0.4 | 0.8 / 1e-09 / 0.4 | 10% / 40% / 60% | 90% / 50% / 20% |" in table
    assert "| adaponder-paper | 1 | none | 1e-08 / 0.6 / 0.8 | 1e-12 / 0.5 / 0.7 |" in table
    assert (tmp_path / "gate_curves.png").stat().st_size > 10_000 and "gate_curves.png" in text


def test_no_gated_result_gives_no_section(tmp_path: Path):
    results = [{"arm": "ponderlm", "seed": 1, "train": {"curve": [{"step": 25, "lm_loss": 3.0}]}}]
    assert gate_report.section(results, tmp_path, str, lambda shown: "") == []
    assert not (tmp_path / "gate_curves.png").exists()
