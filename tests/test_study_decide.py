"""What lets the reasoning study decide: data draws that change the permutation and the held-out symbols, a
development split disjoint from the test split, intervals that resample symbols (checked against hand
computations), the full FLOPs count (against a hand count), and the study's run matrix."""

import math

import numpy as np
import pytest
import torch
from conftest import REPO, tiny_config

from adaponder.data.reasoning import MultiHopSpec, generate_split, permutation, symbol_sets
from adaponder.evaluation.difficulty import by_difficulty, per_symbol_outcomes
from adaponder.evaluation.perplexity import TokenScores
from adaponder.study import intervals as iv

SPEC = MultiHopSpec(symbols=64, max_hops=3, filler_symbols=5, queries=6, doc_tokens=32, train_docs=60, val_docs=30,
                    held_out_fraction=0.25, dev_fraction=0.5, seed=0)


def _answers(spec: MultiHopSpec, split: str) -> set[tuple[int, int]]:
    """(H, query symbol index) of every answer of a split."""
    tokens, labels = generate_split(spec, split)
    symbol0 = 2 + spec.max_hops
    pos = np.flatnonzero(labels > 0)
    return {(int(labels[p]), int(tokens[p - 1]) - symbol0) for p in pos}


def test_data_seed_draws_another_permutation_and_held_out_set_with_disjoint_splits():
    other = MultiHopSpec(**{**SPEC.__dict__, "seed": 1})
    assert not np.array_equal(permutation(SPEC), permutation(other))
    a, b = symbol_sets(SPEC), symbol_sets(other)
    assert set(a["test"].tolist()) != set(b["test"].tolist())
    for sets in (a, b):
        train, dev, test = (set(sets[k].tolist()) for k in ("train", "dev", "test"))
        assert train.isdisjoint(dev) and train.isdisjoint(test) and dev.isdisjoint(test)
        assert len(dev) == 8 and len(test) == 8 and len(train | dev | test) == SPEC.symbols
    for spec in (SPEC, other):
        sets = symbol_sets(spec)
        trained = {x for h, x in _answers(spec, "train") if h >= 2}
        assert trained <= set(sets["train"].tolist())           # no held-out composition is ever trained
        assert {x for _, x in _answers(spec, "dev")} <= set(sets["dev"].tolist())
        assert {x for _, x in _answers(spec, "val")} <= set(sets["test"].tolist())


def test_the_development_split_leaves_the_training_split_unchanged():
    without = MultiHopSpec(**{**SPEC.__dict__, "dev_fraction": 0.0})
    for got, want in zip(generate_split(SPEC, "train"), generate_split(without, "train")):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="split 'dev'"):
        generate_split(without, "dev")
    assert "dev_fraction" in " ".join(MultiHopSpec(symbols=8, held_out_fraction=0.25, dev_fraction=0.9).problems())


def test_two_symbol_bootstrap_matches_the_hand_computation():
    # One run, two symbols asked once each, one right: a resample holds the right one 0, 1 or 2 times with
    # probabilities 1/4, 1/2, 1/4, so the accuracy is 0, 0.5 or 1 and the 95 % interval is [0, 1].
    run = {"answers": [[1], [1]], "correct": [[1], [0]], "exit_counts": [[[1]], [[1]]]}
    interval, draws = iv.bootstrap([run], iv.accuracy(1), resamples=8000, draws=True)
    assert interval.mean == 0.5 and (interval.low, interval.high) == (0.0, 1.0)
    assert abs(np.mean(draws == 0.5) - 0.5) < 0.03 and abs(np.mean(draws == 1.0) - 0.25) < 0.03


def test_bootstrap_resamples_symbols_not_answers():
    # 40 symbols, each asked 50 times, half solved outright: the standard error is that of 40 symbols,
    # sqrt(0.25 / 40) = 0.079, not that of 2,000 answers (0.011).
    run = {"answers": [[50]] * 40, "correct": [[50]] * 20 + [[0]] * 20, "exit_counts": [[[50]]] * 40}
    interval, draws = iv.bootstrap([run], iv.accuracy(1), resamples=4000, draws=True)
    assert abs(draws.std() - math.sqrt(0.25 / 40)) < 0.01
    # Two runs that disagree: the run level alone spans them (each run's own symbols all agree).
    solved = {"answers": [[5]] * 10, "correct": [[5]] * 10, "exit_counts": [[[5]]] * 10}
    failed = {**solved, "correct": [[0]] * 10}
    both = iv.bootstrap([solved, failed], iv.accuracy(1), resamples=4000)
    assert both.mean == 0.5 and both.low == 0.0 and both.high == 1.0
    same = iv.bootstrap([solved, solved], iv.accuracy(1))
    assert (same.low, same.mean, same.high) == (1.0, 1.0, 1.0)
    assert iv.difference([solved], [failed], iv.accuracy(1)).above(0.9)


def test_spearman_and_exit_pass_from_stored_counts_equal_the_token_level_figures():
    from adaponder.evaluation.difficulty import spearman

    rng = np.random.default_rng(0)
    labels = rng.integers(1, 4, 500)
    exits = np.clip(labels + rng.integers(-1, 2, 500), 1, 4)
    symbols = rng.integers(10, 30, 500)
    ps = per_symbol_outcomes(labels, symbols, np.ones(500, bool), exits, passes=4)
    assert np.isclose(iv.bootstrap([ps], iv.spearman).mean, spearman(labels, exits))
    assert np.isclose(iv.bootstrap([ps], iv.mean_exit(2)).mean, exits[labels == 2].mean())


def test_full_flops_of_a_tiny_gated_model_equal_a_hand_count():
    from adaponder.modeling import AdaPonderForCausalLM

    cfg = tiny_config("adaponder", passes=4)
    model = AdaPonderForCausalLM(cfg).eval()
    d, L, V, f, ctx, K = 64, 2, 97, 128, 10, 4
    g = cfg.gate_hidden_mult * d
    exits = np.array([1, 4, 2, 4])       # answers exit at 1 and 4; the filler at 2 and 4
    labels = np.array([1, 2, -2, -2])

    def hand(D: int) -> float:  # one token that ran D passes
        layer = 2 * (3 * d * d + d * d + 2 * d * f) + 4 * ctx * d
        return D * L * layer + D * 2 * d * V + (D - 1) * 2 * d * V + min(D, K - 1) * 2 * (d * g + g)

    n = len(exits)
    scores = TokenScores(doc=np.zeros(n, int), position=np.arange(1, n + 1), token=np.arange(n), nll=np.ones(n),
                         exit_pass=exits, context=np.full(n, ctx), passes=K, correct=np.ones(n, bool))
    out = by_difficulty(scores, labels, symbols=np.array([7, 8, 0, 0]), model=model)
    assert math.isclose(out["classes"]["answer"]["flops"]["total"], (hand(1) + hand(4)) / 2, rel_tol=1e-9)
    assert math.isclose(out["flops"]["total"], sum(hand(int(D)) for D in exits) / n, rel_tol=1e-9)
    assert out["per_symbol"]["symbols"] == [7, 8] and out["per_symbol"]["exit_counts"][0][0] == [1, 0, 0, 0]


def test_the_study_runs_every_arm_on_every_seed_and_data_draw_replicate_by_replicate():
    from adaponder.study import load_study_config
    from adaponder.study.config import StudyConfigError

    cfg = load_study_config(REPO / "configs/study/reasoning.yaml")
    runs = cfg.arm_runs()
    arms = cfg.chosen_arms()
    seeds = {a: cfg.study.arm_seeds.get(a, cfg.study.seeds) for a in arms}
    assert len(runs) == sum(len(s) for s in seeds.values()) * len(cfg.study.data_seeds)
    assert all(len(s) * len(cfg.study.data_seeds) >= 6 for s in seeds.values())
    assert runs[:len(arms)] == [(a, cfg.study.seeds[0], cfg.study.data_seeds[0]) for a in arms]
    # an arm with fewer seeds (study.arm_seeds) runs on those only, replicate by replicate with the rest
    assert [s for a, s, d in runs if a == "ponderlm-draft" and d == 0] == cfg.study.arm_seeds["ponderlm-draft"]
    with pytest.raises(StudyConfigError, match="arm_seeds.ponderlm: \\[7\\], expected seeds of study.seeds"):
        load_study_config(REPO / "configs/study/reasoning.yaml", overrides=["study.arm_seeds={ponderlm: [7]}"])
    assert cfg.fingerprint("ponderlm", 1234, 0) != cfg.fingerprint("ponderlm", 1234, 1)
    # the gates-alone arm starts from ponderlm's checkpoint of the same seeds, which enters its fingerprint
    raw = cfg.train_raw("adaponder-gates-alone", 1, "d", "o", {"ponderlm": "runs/p/hf"})
    assert raw["init"]["backbone"] == "runs/p/hf" and raw["init"]["gates_alone"] is True
    assert "hidden_size" not in raw["model"]
    with pytest.raises(StudyConfigError, match="must come before"):
        load_study_config(REPO / "configs/study/reasoning.yaml",
                          overrides=["study.only=[adaponder-gates-alone,ponderlm]"])
    with pytest.raises(StudyConfigError, match="data_seeds"):
        load_study_config(REPO / "configs/study/cpu.yaml", overrides=["study.data_seeds=[0,1]"])
