"""The reasoning study (configs/study/reasoning.yaml): its quick profile end to end on a tiny multi-hop task, resume
without retraining, a deleted arm retrained to the same figures; the goals and the token-budget trend computed
from known numbers."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

ARMS = ["vanilla", "ponderlm", "adaponder-paper", "adaponder-gates-alone"]
RUNS = [f"{a}-s1234-d{d}" for d in (0, 1) for a in ARMS]


def _study(tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "launch" / "study.py"), "--config", str(REPO / "configs/study/reasoning.yaml"),
           "--profile", "quick", "--set", f"study.runs_dir={tmp / 'runs'}",
           "--set", f"study.results_dir={tmp / 'results'}", "--set", f"study.report={tmp / 'study.md'}", *extra]
    env = {**__import__("os").environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("reasoning")
    proc = _study(tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp


@pytest.mark.integration
def test_quick_profile_reports_accuracy_and_exits_by_difficulty(study):
    results = {p.stem: json.loads(p.read_text()) for p in (study / "results").glob("*.json")}
    assert set(results) == set(RUNS)
    for res in results.values():
        levels = res["difficulty"]["levels"]
        assert [lv["difficulty"] for lv in levels] == [1, 2, 3]
        assert all(lv["tokens"] == 12 * 2 for lv in levels)  # 12 held-out documents, each H twice
        # per-symbol outcomes of the test split, and the development split on its own symbols
        test_syms, dev_syms = set(res["difficulty"]["per_symbol"]["symbols"]), set(res["difficulty_dev"]["per_symbol"]["symbols"])
        assert test_syms and dev_syms and test_syms.isdisjoint(dev_syms)
        assert sum(map(sum, res["difficulty"]["per_symbol"]["answers"])) == 12 * 2 * 3
    assert results["ponderlm-s1234-d0"]["difficulty"]["per_symbol"] != results["ponderlm-s1234-d1"]["difficulty"]["per_symbol"]
    gated = results["adaponder-paper-s1234-d0"]
    assert [row["tau"] for row in gated["difficulty_tau"]] == [1e-4, 0.3]
    assert gated["difficulty_no_halting"]["mean_exit"] == 4
    report = (study / "study.md").read_text()
    for text in ("## Accuracy by difficulty", "### Where the gates spend passes",
                 "the `multihop` task", "| adaponder-paper-s1234-d0 | τ = 0.3 |",
                 "## Decided figures", "### Learning and halting apart", "### The full cost"):
        assert text in report
    # a pipeline check: no goals judged on 16 training steps
    assert report.startswith("# Pipeline check (quick profile) — not a result") and "### Goals" not in report
    for png in ("accuracy_by_difficulty.png", "exit_by_difficulty.png"):
        assert (study / "results" / png).stat().st_size > 10_000


@pytest.mark.integration
def test_rerun_trains_nothing_and_a_deleted_arm_retrains_to_the_same_figures(study):
    before = json.loads((study / "results" / "ponderlm-s1234-d0.json").read_text())
    report = (study / "study.md").read_text()
    again = _study(study)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "== training" not in again.stdout and again.stdout.count("done earlier") == len(RUNS)
    assert (study / "study.md").read_text() == report
    (study / "results" / "ponderlm-s1234-d0.json").unlink()
    shutil.rmtree(study / "runs" / "ponderlm-s1234-d0")
    third = _study(study)
    assert third.returncode == 0, third.stderr[-2000:]
    # ponderlm again, then the gates-alone arm started from it (its fingerprint holds ponderlm's)
    assert third.stdout.count("== training") == 1 and "== training ponderlm-s1234-d0" in third.stdout
    after = json.loads((study / "results" / "ponderlm-s1234-d0.json").read_text())
    assert after["difficulty"] == before["difficulty"] and after["heldout"] == before["heldout"]


@pytest.mark.integration
def test_a_changed_configuration_retrains_instead_of_reusing_the_old_run(study):
    """A finished run folder of another configuration is moved aside, not reused under the new fingerprint."""
    before = json.loads((study / "results" / "vanilla-s1234-d0.json").read_text())
    proc = _study(study, "--set", "base.optim.weight_decay=0.05", "--set", "study.only=[vanilla]",
                  "--set", "study.data_seeds=[0]")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "trained under another configuration; moved to" in proc.stdout and "== training vanilla-s1234-d0" in proc.stdout
    after = json.loads((study / "results" / "vanilla-s1234-d0.json").read_text())
    assert after["fingerprint"] != before["fingerprint"] and after["heldout"] != before["heldout"]
    assert len(list((study / "runs").glob("vanilla-s1234-d0.stale-*"))) == 1


def _res(arm, seed, accs, exits=None, mode=None, passes=4, rho=None):
    exits = exits or [passes] * len(accs)
    levels = [{"difficulty": h + 1, "tokens": 100, "accuracy": a, "mean_nll": 1.0, "mean_exit": e}
              for h, (a, e) in enumerate(zip(accs, exits))]
    cls = {name: {"tokens": 10, "mean_nll": 1.0, "mean_exit": 2.0, "pass_share": 0.2, "token_share": 0.25}
           for name in ("answer", "structure", "prompt", "filler")}
    cls["answer"]["mean_exit"] = sum(exits) / len(exits)
    return {"arm": arm, "seed": seed, "mode": mode or arm.split("-")[0], "passes": passes,
            "difficulty": {"levels": levels, "classes": cls, "spearman_difficulty_exit": rho, "mean_exit": 2.0}}


def test_goals_are_computed_against_the_seed_spread():
    from adaponder.study.difficulty_report import accuracy_spread, check_goals

    results = [_res("vanilla", 1, [1.0, 0.0, 0.0, 0.0], passes=1), _res("vanilla", 2, [1.0, 0.02, 0.0, 0.0], passes=1),
               _res("ponderlm", 1, [1.0, 0.6, 0.3, 0.25]), _res("ponderlm", 2, [1.0, 0.5, 0.3, 0.21]),
               _res("adaponder-paper", 1, [1.0, 0.54, 0.28, 0.21], exits=[1, 2, 3, 4], rho=0.7)]
    assert accuracy_spread(results) == pytest.approx(0.1)
    rows = check_goals(results)
    assert len(rows) == 5
    # worst seed against vanilla's best: ponderlm at H=2 0.5 − 0.02; adaponder-paper (one seed) 0.54 − 0.02
    assert rows[0]["verdict"] == "holds" and "adaponder-paper at H=2" in rows[0]["numbers"] and "+0.520" in rows[0]["numbers"]
    assert rows[1]["verdict"] == "met"                    # H=3, 4: +0.30, +0.23
    assert rows[2]["verdict"] == "met"                    # within 0.03 of (0.55, 0.30, 0.23) at 62 % of the passes
    assert rows[3]["verdict"] == "met by adaponder-paper"  # the warm-up goal: within 0.05, ≤ 80 %, ρ ≥ 0.5
    assert rows[4]["verdict"] == "met" and "ρ = 0.700" in rows[4]["numbers"]
    # one point more than the tolerance at one level, or a budget above 70 %, fails the goal
    results[-1] = _res("adaponder-paper", 1, [1.0, 0.51, 0.28, 0.21], exits=[1, 2, 3, 4], rho=0.3)
    rows = check_goals(results)
    assert rows[2]["verdict"] == "not met" and rows[3]["verdict"] == "not met" and rows[4]["verdict"] == "not met"
    assert "worst -0.040 at H=2" in rows[3]["numbers"]


def test_the_noise_floor_leaves_out_arms_read_at_their_exits():
    """An arm trained by PonderNet's expected loss alone (A21) is read at its exits: the seed spread of its
    all-passes perplexity is reported beside the noise floor, not used as the floor for every claim."""
    from adaponder.study.report import arm_spreads, check_claims, seed_spread

    def res(arm, seed, ppl, per_pass=None):
        overrides = {"model.mode": "ponderlm"} | ({"schedule.per_pass": per_pass} if per_pass else {})
        return {"arm": arm, "seed": seed, "heldout": {"ppl": ppl}, "overrides": overrides}

    results = [res("vanilla", 1, 150.0), res("vanilla", 2, 152.0), res("ponderlm", 1, 143.5), res("ponderlm", 2, 145.5),
               res("ponderlm-pondernet", 1, 145.6, "pondernet"), res("ponderlm-pondernet", 2, 158.5, "pondernet")]
    assert arm_spreads(results)["ponderlm-pondernet"] == pytest.approx(12.9)
    assert seed_spread(results) == pytest.approx(2.0)
    assert check_claims(results)[0]["verdict"] == "holds"  # 151.0 − 144.5 = 6.5 > 2.0
    detached = [dict(r, overrides={**r["overrides"], "schedule.per_pass": "pondernet-detached"})
                if r["arm"] == "ponderlm-pondernet" else r for r in results]
    assert seed_spread(detached) == pytest.approx(12.9)  # trained for its last pass: its spread counts


def test_token_trend_table_gain_and_verdict(tmp_path):
    from adaponder.study import trend
    from adaponder.study.report import seed_spread

    def r(arm, seed, tokens, ppl):
        return {"arm": arm, "seed": seed, "heldout": {"ppl": ppl}, "train": {"tokens": tokens}}

    old = tmp_path / "old"
    old.mkdir()
    for res in (r("ponderlm-k1", 1, 100, 140.0), r("ponderlm", 1, 100, 144.0), r("ponderlm", 2, 100, 146.0)):
        (old / f"{res['arm']}-s{res['seed']}.json").write_text(json.dumps(res))
    (old / "notes.json").write_text("[1, 2]")  # not a result: ignored
    new = [r("ponderlm-k1", 1, 400, 80.0), r("ponderlm", 1, 400, 76.0)]
    lines = trend.section(new, [str(old)], 1, seed_spread, tmp_path, lambda p: p.name, "note")
    text = "\n".join(lines)
    assert "| ponderlm | 144.00 | 76.00 |" in text and "| gain of ponderlm over ponderlm-k1 | -4.00 | +4.00 |" in text
    assert "at any one budget): 2.00." in text
    assert "grows with tokens (-4.00 → +4.00); the deficit flips: the passes pay" in text
    assert (tmp_path / "token_trend.png").stat().st_size > 10_000
    assert trend.verdict({100: -4.0, 400: -3.0}, 2.0).startswith("no change beyond the seed spread")
    assert trend.verdict({100: -4.0}, 2.0) == "one budget only: no trend yet"


def _sym_res(arm, seed, solved, mode=None, exits=4):
    """A result whose test split holds 10 symbols per level, each asked 5 times; ``solved[h]`` of them right."""
    answers = [[5, 5] for _ in range(10)]
    correct = [[5 if i < solved[0] else 0, 5 if i < solved[1] else 0] for i in range(10)]
    counts = [[[5 if p == exits - 1 else 0 for p in range(4)] for _ in range(2)] for _ in range(10)]
    flops = {"total": 1e6 * exits}
    cls = {"answer": {"mean_exit": float(exits), "pass_share": 0.3, "flops": flops}}
    per = {"symbols": list(range(10)), "answers": answers, "correct": correct, "exit_counts": counts}
    levels = [{"difficulty": h, "accuracy": solved[h - 1] / 10} for h in (1, 2)]
    return {"arm": arm, "seed": seed, "mode": mode or arm.split("-")[0], "passes": 4,
            "difficulty": {"levels": levels, "classes": cls, "per_symbol": per, "flops": flops}}


def test_decided_goals_compare_intervals_not_means():
    from adaponder.study.decide import goals

    results = ([_sym_res("vanilla", s, (10, 0)) for s in (1, 2, 3)] + [_sym_res("ponderlm", s, (10, 10)) for s in (1, 2, 3)]
               + [_sym_res("adaponder-paper", s, (10, 10), exits=2) for s in (1, 2, 3)]
               + [_sym_res("adaponder-warm", s, (10, 0 if s == 1 else 10), exits=2) for s in (1, 2, 3)])
    rows = {g["goal"].split(" ")[0] + (" rho" if "Spearman" in g["goal"] else ""): g for g in goals(results)}
    assert rows["the"]["verdict"] == "holds"                       # ponderlm − vanilla at H=2: 1.0, every resample
    assert rows["adaponder-paper"]["verdict"] == "holds"          # equal accuracy at half the FLOPs
    # one of three warm runs fails outright: the mean is 0.33 below ponderlm, but the interval reaches 0
    warm = rows["adaponder-warm"]
    assert warm["verdict"] == "undecided" and "H=2: -0.333 [-1.000, 0.000]" in warm["numbers"]
    # the same solved symbols with the answer-token FLOPs of ponderlm: accurate enough, not cheap enough
    dear = [r for r in results if r["arm"] != "adaponder-paper"] + [
        _sym_res("adaponder-paper", s, (10, 10), exits=4) for s in (1, 2, 3)]
    assert {g["goal"].split(" ")[0]: g for g in goals(dear)}["adaponder-paper"]["verdict"] == "not met"
    results = [r for r in results if r["arm"] != "adaponder-warm"] + [
        _sym_res("adaponder-warm", s, (10, 2), exits=2) for s in (1, 2, 3)]
    assert {g["goal"].split(" ")[0]: g for g in goals(results)}["adaponder-warm"]["verdict"] == "not met"
