"""Evaluation by difficulty on a corpus whose tokens carry a known difficulty (:mod:`adaponder.data.reasoning`).

Every held-out token is scored once (:func:`~adaponder.evaluation.perplexity.score_documents`, one window per
document) and joined with its label: answer tokens by difficulty ``H``, the others by class (structure,
prompt, filler). Reported:

* per difficulty: answer accuracy (the greedy prediction is the answer), mean answer NLL, mean exit pass;
* per class: tokens, mean NLL, mean exit pass, and the share of all token-passes spent on the class — do the
  gates spend passes where passes can help (multi-step answers) or on tokens nothing can predict (filler)?
* Spearman's rank correlation between difficulty and exit pass over the answer tokens;
* per query symbol (``per_symbol``): the answers and correct answers by ``H`` and the exit-pass counts by
  ``(H, exit pass)``, so that intervals can resample symbols (every answer about one symbol stands or falls
  together) and recompute accuracy, exit pass and Spearman from the stored counts;
* the full cost: FLOPs per token (A17, gates and every head counted) for all tokens and per class, and
  perplexity with and without the query-symbol positions (a held-out symbol after a hop marker is a token
  no training document shows there);
* for gated models, the same accuracy by difficulty under fixed pruning at the learned mean exit pass (the
  iso-FLOPs control of :mod:`~adaponder.evaluation.pruning`).

The exit pass of a token is that of the position predicting it (A8): for an answer, the ``=`` before it.

Command line: ``adaponder-difficulty`` (:mod:`adaponder.cli.difficulty`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adaponder.data.fingerprint import check_labelled_corpus
from adaponder.data.layout import read_meta
from adaponder.data.reasoning import read_token_labels
from adaponder.modeling.run_settings import RunSettings

from .perplexity import TokenScores, load_documents, score_documents
from .pruning import FIXED_RULES, make_policy

#: Class codes of the non-answer labels (see :mod:`adaponder.data.reasoning`); answers are labelled H >= 1.
CLASSES = {"structure": 0, "prompt": -1, "filler": -2}
#: The prompt split in its two kinds (a hop marker ``<hH>``; the query symbol ``sX`` after it).
PROMPT_KINDS = ("hop_marker", "query_symbol")


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when either side is constant or empty."""
    from scipy.stats import spearmanr  # scipy.stats takes seconds to import: only this figure needs it

    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    return float(spearmanr(x, y).statistic)


def token_labels(scores: TokenScores, labels: Sequence[np.ndarray]) -> np.ndarray:
    """The label of every scored token (``labels[doc][position]``)."""
    out = np.empty(len(scores), dtype=np.int64)
    for d in np.unique(scores.doc):
        sel = scores.doc == d
        out[sel] = labels[int(d)][scores.position[sel]]
    return out


def _mean(a: np.ndarray) -> float:
    return float(a.mean()) if len(a) else float("nan")


def per_symbol_outcomes(labels: np.ndarray, symbols: np.ndarray, correct: np.ndarray, exits: np.ndarray,
                        passes: int) -> dict[str, Any]:
    """Answers grouped by their query symbol: ``symbols`` (sorted ids), ``answers[s][H-1]``,
    ``correct[s][H-1]`` and ``exit_counts[s][H-1][D-1]`` (answers of difficulty H that exited at pass D)."""
    answers = labels > 0
    sym, hop, ok, ex = symbols[answers], labels[answers] - 1, correct[answers].astype(np.int64), exits[answers] - 1
    ids = np.unique(sym)
    row = np.searchsorted(ids, sym)
    levels = int(labels.max()) if answers.any() else 0
    counts = np.zeros((len(ids), levels, passes), dtype=np.int64)
    np.add.at(counts, (row, hop, np.clip(ex, 0, passes - 1)), 1)
    right = np.zeros((len(ids), levels), dtype=np.int64)
    np.add.at(right, (row, hop), ok)
    return {"symbols": ids.tolist(), "answers": counts.sum(axis=2).tolist(), "correct": right.tolist(),
            "exit_counts": counts.tolist()}


def by_difficulty(scores: TokenScores, labels: np.ndarray, symbols: np.ndarray | None = None,
                  kinds: np.ndarray | None = None, model=None) -> dict[str, Any]:
    """The tables of the module doc from scored tokens and their labels (``token_labels``). ``symbols`` (the
    query symbol of every answer, the token before it) adds ``per_symbol``; ``kinds`` (a :data:`PROMPT_KINDS`
    index for prompt tokens, -1 elsewhere) splits the prompt class; ``model`` adds FLOPs per token."""
    if scores.correct is None:
        raise ValueError("these scores carry no greedy-prediction flags; score them with score_documents")
    exits = scores.exit_pass.astype(np.int64)
    total_passes = float(exits.sum())
    levels = []
    for h in sorted(int(v) for v in np.unique(labels[labels > 0])):
        sel = labels == h
        levels.append({"difficulty": h, "tokens": int(sel.sum()), "accuracy": _mean(scores.correct[sel]),
                       "mean_nll": _mean(scores.nll[sel]), "mean_exit": _mean(exits[sel])})
    groups = [("answer", labels > 0)] + [(n, labels == c) for n, c in CLASSES.items()]
    if kinds is not None:
        groups += [(name, (labels == CLASSES["prompt"]) & (kinds == i)) for i, name in enumerate(PROMPT_KINDS)]
    context = int(scores.context.max()) if len(scores) else None
    classes = {}
    for name, sel in groups:
        classes[name] = {"tokens": int(sel.sum()), "mean_nll": _mean(scores.nll[sel]), "mean_exit": _mean(exits[sel]),
                         "pass_share": float(exits[sel].sum()) / total_passes if total_passes else float("nan"),
                         "token_share": float(sel.mean()) if len(sel) else float("nan")}
        if model is not None and sel.any():
            classes[name]["flops"] = _flops(model, exits[sel], context)
    answers = labels > 0
    out = {"levels": levels, "classes": classes, "answer_accuracy": _mean(scores.correct[answers]),
           "spearman_difficulty_exit": spearman(labels[answers], exits[answers]),
           "mean_exit": _mean(exits), "tokens": len(scores),
           "ppl": float(math.exp(_mean(scores.nll))) if len(scores) else float("nan")}
    if kinds is not None:
        keep = ~((labels == CLASSES["prompt"]) & (kinds == PROMPT_KINDS.index("query_symbol")))
        out["ppl_without_query_symbols"] = float(math.exp(_mean(scores.nll[keep]))) if keep.any() else float("nan")
    if model is not None:
        out["flops"] = _flops(model, exits, context)
    if symbols is not None:
        out["per_symbol"] = per_symbol_outcomes(labels, symbols, scores.correct, exits, int(scores.passes))
    return out


def _flops(model, exits: np.ndarray, context: int | None) -> dict[str, float]:
    """FLOPs per token by part (A17: backbone, every head product, pondering, gates) at these exit passes."""
    return {k: float(v) for k, v in model.flops_per_token(torch.as_tensor(exits), context=context).items()}


def token_context(scores: TokenScores, docs: Sequence[Sequence[int]], task: Mapping[str, Any] | None
                  ) -> tuple[np.ndarray, np.ndarray | None]:
    """For every scored token, the token before it (an answer's query symbol), and the kind of a prompt token
    (index into :data:`PROMPT_KINDS`; -1 for other tokens) when the corpus's task metadata says which ids are
    hop markers (``None`` otherwise)."""
    prev = np.array([docs[int(d)].ids[int(p) - 1] if p > 0 else -1 for d, p in zip(scores.doc, scores.position)],
                    dtype=np.int64)
    if not task or "max_hops" not in task:
        return prev, None
    hop0, hops = 2, int(task["max_hops"])  # the multihop vocabulary: two specials, then the hop markers
    tok = scores.token.astype(np.int64)
    is_hop = (tok >= hop0) & (tok < hop0 + hops)
    return prev, np.where(is_hop, 0, 1)


def evaluate_difficulty(model, data_dir: str | Path, tokenizer, split: str = "val", batch_size: int = 32,
                        pruning_seeds: Sequence[int] = (0,), settings: RunSettings | None = None) -> dict[str, Any]:
    """Score ``split`` of a labelled corpus with ``model`` and return :func:`by_difficulty`'s tables, plus
    ``fixed_pruning`` (rule → per-seed tables at the learned mean exit pass) for gated models."""
    check_labelled_corpus(data_dir, split, tokenizer)  # labels and tokenizer of this corpus, shards unchanged
    labels = read_token_labels(data_dir, split)
    docs = load_documents(data_dir, tokenizer, split=split)
    meta = read_meta(data_dir)
    window = max(len(d) for d in docs)  # one window per document: every token sees its whole document
    kw = dict(window=window, stride=window, batch_size=batch_size, eod_id=int(meta["eod_id"]))
    settings = settings or RunSettings()
    scores = score_documents(model, docs, settings=settings, **kw)
    lab = token_labels(scores, labels)
    prev, kinds = token_context(scores, docs, meta.get("task"))
    out = by_difficulty(scores, lab, symbols=prev, kinds=kinds, model=model)
    K = int(model.config.num_passes)
    if model.config.gated and settings.exit_rule is None and pruning_seeds and 1.0 < out["mean_exit"] < K:
        out["fixed_pruning"] = {
            rule: [by_difficulty(score_documents(model, docs, settings=settings.replace(
                exit_rule=make_policy(rule, K, out["mean_exit"], seed=s)), **kw), lab,
                                 symbols=prev, model=model)
                   for s in pruning_seeds]
            for rule in FIXED_RULES}
    return out


def difficulty_by_tau(model, data_dir: str | Path, tokenizer, taus: Sequence[float], split: str = "val",
                      batch_size: int = 32) -> list[dict[str, Any]]:
    """:func:`evaluate_difficulty` at each halting threshold τ (ascending; no pruning controls): what raising τ
    costs each difficulty level. Each τ is an argument of the scoring calls; the model's config is not touched."""
    return [{"tau": float(tau), **evaluate_difficulty(model, data_dir, tokenizer, split, batch_size, pruning_seeds=(),
                                                      settings=RunSettings(tau=tau))}
            for tau in sorted(taus)]


def format_tables(res: Mapping[str, Any]) -> str:
    """Markdown tables of one :func:`evaluate_difficulty` result."""
    lines = ["| difficulty | answers | accuracy | mean NLL | mean exit pass |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['difficulty']} | {r['tokens']} | {r['accuracy']:.3f} | {r['mean_nll']:.3f} | {r['mean_exit']:.2f} |"
              for r in res["levels"]]
    lines += ["", "| tokens | count | mean NLL | mean exit pass | share of tokens | share of token-passes |",
              "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {name} | {c['tokens']} | {c['mean_nll']:.3f} | {c['mean_exit']:.2f} | {c['token_share']:.3f} | "
              f"{c['pass_share']:.3f} |" for name, c in res["classes"].items()]
    rho = res["spearman_difficulty_exit"]
    lines += ["", f"Spearman(difficulty, exit pass) on answers: {'–' if math.isnan(rho) else f'{rho:.3f}'}"]
    for rule, runs in (res.get("fixed_pruning") or {}).items():
        accs = ", ".join(f"H={r['difficulty']}: {np.mean([run['levels'][i]['accuracy'] for run in runs]):.3f}"
                         for i, r in enumerate(res["levels"]))
        lines.append(f"fixed pruning ({rule}, mean exit {res['mean_exit']:.2f}): {accs}")
    return "\n".join(lines)


__all__ = ["CLASSES", "PROMPT_KINDS", "by_difficulty", "per_symbol_outcomes", "token_context", "difficulty_by_tau", "evaluate_difficulty", "format_tables", "spearman", "token_labels"]


if __name__ == "__main__":  # the command line lives in adaponder.cli; say so rather than exit silently
    raise SystemExit("this module has no command line: run `adaponder-difficulty` (or `python -m adaponder.cli.difficulty`)")
