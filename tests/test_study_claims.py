"""The paper's claims in the study reports are judged on intervals (adaponder.study.report.check_claims).

- A perplexity claim reads the interval of the difference of the two arms' run means, not the largest seed spread of
  any arm: one collapsed arm's spread no longer makes vanilla against ponderlm "not distinguishable"; on a labelled
  task the perplexity read is the one without query symbols; one run of an arm gives no interval, and says so.
- Claim (4) on runs that halt but were not evaluated with fixed pruning says it was not run, not "no halting"; with
  the difficulty evaluation's fixed-pruning control it is judged on the answer-accuracy difference's interval.
"""

from __future__ import annotations

import numpy as np

from adaponder.study.report import check_claims, seed_spread


def _run(arm, seed, ppl, *, mode=None, mean_exit=4.0, ppl_wq=None, difficulty=None):
    res = {"arm": arm, "seed": seed, "mode": mode or ("adaponder" if arm.startswith("adaponder") else "ponderlm"),
           "passes": 4, "heldout": {"ppl": ppl, "mean_exit": mean_exit, "flops": {"total": 1e6 * mean_exit}},
           "overrides": {}}
    if ppl_wq is not None or difficulty is not None:
        res["difficulty"] = {"ppl_without_query_symbols": ppl_wq, **(difficulty or {})}
    return res


def _claim(rows, start):
    return [r for r in rows if r["claim"].startswith(start)]


def test_a_collapsed_arm_does_not_set_the_noise_floor_of_other_claims():
    results = [_run("vanilla", s, 499.0 + s, mode="vanilla") for s in range(4)]
    results += [_run("ponderlm", s, 88.0 + s) for s in range(4)]
    results += [_run("adaponder-paper", s, p, mean_exit=1.5) for s, p in enumerate((100.0, 954.0, 120.0, 300.0))]
    assert seed_spread(results) > 800  # the old floor: vanilla 499 against ponderlm 88 read "not distinguishable"
    (row,) = _claim(check_claims(results), "(1)")
    assert row["verdict"] == "holds" and "[" in row["numbers"]
    # the perplexity without query symbols decides where the task has it
    for r in results:
        r["difficulty"] = {"ppl_without_query_symbols": 20.0 + r["seed"] + (0.5 if r["arm"] == "vanilla" else 0.0)}
    (row,) = _claim(check_claims(results), "(1)")
    assert "without query symbols" in row["numbers"] and row["verdict"].startswith("not distinguishable")
    one = [r for r in results if r["arm"] != "vanilla" or r["seed"] == 0]
    (row,) = _claim(check_claims(one), "(1)")
    assert row["verdict"].startswith("cannot be judged")


def _per_symbol(rng, accuracy):
    answers = np.full((16, 4), 40)
    correct = rng.binomial(answers, accuracy)
    exits = np.zeros((16, 4, 4), dtype=int)
    exits[:, :, 0] = answers
    return {"answers": answers.tolist(), "correct": correct.tolist(), "exit_counts": exits.tolist()}


def test_claim_four_says_when_fixed_pruning_was_not_run_and_judges_it_on_intervals_when_it_was():
    base = [_run("ponderlm", s, 88.0 + s) for s in range(3)]
    halting = [_run("adaponder-paper", s, 120.0, mean_exit=1.55) for s in range(3)]
    rows = _claim(check_claims(base + halting), "(4)")
    assert rows and all("not tested" in r["verdict"] and "no halting" not in r["verdict"] for r in rows)
    never = [_run("adaponder-paper", s, 120.0, mean_exit=4.0) for s in range(3)]
    assert all("no halting" in r["verdict"] for r in _claim(check_claims(base + never), "(4)"))
    rng = np.random.default_rng(0)
    for learned, verdict in ((0.9, "holds"), (0.2, "does not hold")):
        runs = [_run("adaponder-paper", s, 120.0, mean_exit=1.55, ppl_wq=30.0, difficulty={
            "mean_exit": 1.55, "per_symbol": _per_symbol(rng, learned),
            "fixed_pruning": {"uniform": [{"per_symbol": _per_symbol(rng, 0.5)}]}}) for s in range(3)]
        (row,) = _claim(check_claims(base + runs), "(4)")
        assert row["verdict"] == verdict and "uniform: learned − fixed" in row["numbers"]
