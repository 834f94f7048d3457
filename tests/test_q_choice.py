"""The Q-exit threshold chosen on the development split (adaponder.study.q_choice, docs/method.md A25).

- The choice is the smallest q whose development accuracy at H = 1 and H = 2 is within the goal's margin of
  ``ponderlm``'s (lower bound of the difference above −0.03): every smaller q of the grid fails it.
- It never reads the test split: other test labels (the test grids and test evaluations of every run, the
  reference's included) leave the same q, and so does removing the test split from the results; the development
  split does move it.
"""

from __future__ import annotations

import copy

import numpy as np

from adaponder.study.q_choice import MARGIN, TEST_GRID, choose_q

SYMBOLS, LEVELS, K = 32, 4, 4
GRID = ("0.3", "0.5", "0.7", "0.9")


def _per_symbol(rng, accuracy: float) -> dict:
    answers = rng.integers(50, 70, size=(SYMBOLS, LEVELS))
    p = np.clip(rng.normal(accuracy, 0.05, size=SYMBOLS), 0, 1)[:, None]
    correct = rng.binomial(answers, np.broadcast_to(p, answers.shape))
    exits = np.zeros((SYMBOLS, LEVELS, K), dtype=int)
    exits[:, :, -1] = answers
    return {"answers": answers.tolist(), "correct": correct.tolist(), "exit_counts": exits.tolist()}


def _results(seed: int = 0, dev_accuracy=(0.4, 0.6, 0.86, 0.9), test_accuracy=(0.3, 0.5, 0.7, 0.9)) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for run in range(4):
        out.append({"arm": "ponderlm", "seed": run, "difficulty_dev": {"per_symbol": _per_symbol(rng, 0.8)},
                    "difficulty": {"per_symbol": _per_symbol(rng, 0.8)}})
        out.append({"arm": "new", "seed": run,
                    "difficulty_q_grid_dev": {q: {"per_symbol": _per_symbol(rng, a)} for q, a in zip(GRID, dev_accuracy)},
                    TEST_GRID: {q: {"per_symbol": _per_symbol(rng, a)} for q, a in zip(GRID, test_accuracy)},
                    "difficulty": {"per_symbol": _per_symbol(rng, 0.7)}})
    return out


def test_the_smallest_q_that_meets_the_criterion_on_dev_is_chosen():
    choice = choose_q(_results(), "new")
    assert choice is not None and choice.met and choice.runs == 4
    rows = dict(choice.rows)
    assert all(d.low > -MARGIN for d in rows[choice.q])
    for q in GRID[:GRID.index(choice.q)]:
        assert any(d.low <= -MARGIN for d in rows[q])
    assert choice.q == "0.7"  # the synthetic development accuracies make 0.7 the first one not below ponderlm's
    assert len(choice.test_runs(_results())) == 4


def test_the_choice_never_reads_the_test_split():
    base = _results()
    chosen = choose_q(base, "new")
    changed = copy.deepcopy(base)
    rng = np.random.default_rng(99)
    for r in changed:  # other test labels: every test evaluation redrawn, the best-looking q made another one
        r["difficulty"] = {"per_symbol": _per_symbol(rng, 0.1)}
        if TEST_GRID in r:
            r[TEST_GRID] = {q: {"per_symbol": _per_symbol(rng, a)} for q, a in zip(GRID, (0.95, 0.1, 0.1, 0.1))}
    assert choose_q(changed, "new") == chosen
    removed = copy.deepcopy(base)
    for r in removed:
        r.pop("difficulty")
        r.pop(TEST_GRID, None)
    assert choose_q(removed, "new") == chosen
    # the development split decides: not below ponderlm from the smallest q on, the smallest q is chosen
    assert choose_q(_results(dev_accuracy=(0.86, 0.86, 0.86, 0.86)), "new").q == "0.3"


def test_no_q_meets_it_then_the_best_is_named_not_met():
    choice = choose_q(_results(dev_accuracy=(0.2, 0.3, 0.5, 0.6)), "new")
    assert not choice.met and choice.q == "0.9"
    assert choose_q(_results(), "missing") is None
