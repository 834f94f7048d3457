"""Evaluation of AdaPonder checkpoints: lm-eval, perplexity / bits per byte, halting analysis,
iso-FLOPs fixed-pruning controls, the τ compute dial, plots and a Markdown report.

Modules (each usable on its own; the commands over them, ``adaponder-eval``, ``adaponder-perplexity``, ... are
in :mod:`adaponder.cli`):

* :mod:`~adaponder.evaluation.settings` — load a checkpoint with pinned recurrence settings (K, τ, exit rule).
* :mod:`~adaponder.evaluation.perplexity` — sliding-window token NLL, perplexity and bits per byte.
* :mod:`~adaponder.evaluation.halting` — exit-pass histogram, mean NLL by exit pass, hardest tokens.
* :mod:`~adaponder.evaluation.token_dump` — the per-token dump (token, exit pass, NLL) and its reader.
* :mod:`~adaponder.evaluation.pruning` — fixed pruning (uniform / geometric exit histograms at a target mean).
* :mod:`~adaponder.evaluation.dial` — τ sweep: perplexity vs realised FLOPs.
* :mod:`~adaponder.evaluation.plots` — PNG figures (matplotlib, Agg).
* :mod:`~adaponder.evaluation.lm_eval_model` — the ``adaponder`` lm-eval model (imports lm-eval; not loaded here).
* :mod:`~adaponder.evaluation.report` — ``adaponder-report``: everything above in one ``report.md``.

Names are imported lazily so that ``import adaponder.evaluation`` stays cheap (no lm-eval, no matplotlib).
"""

from __future__ import annotations

from adaponder._lazy import lazy_getattr


_LAZY = {
    "RecurrenceSettings": "settings",
    "load_for_eval": "settings",
    "Document": "perplexity",
    "TokenScores": "perplexity",
    "load_documents": "perplexity",
    "sliding_windows": "perplexity",
    "score_documents": "perplexity",
    "summarize": "perplexity",
    "bits_per_byte": "perplexity",
    "exit_histogram": "accounting",
    "nll_by_exit_pass": "halting",
    "write_token_dump": "token_dump",
    "read_token_dump": "token_dump",
    "FixedPruningPolicy": "pruning",
    "target_histogram": "pruning",
    "uniform_histogram": "pruning",
    "geometric_histogram": "pruning",
    "halting_rates": "pruning",
    "make_policy": "pruning",
    "sweep_tau": "dial",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = list(_LAZY)
