"""The compute dial: sweep the halting threshold τ (A6) and measure perplexity against realised FLOPs.

A token halts after pass i when its gate ``s^i < τ``, so a larger τ halts more tokens earlier and costs
fewer FLOPs. Each τ re-scores the same documents with the same windows.

Command line: ``adaponder-dial`` (:mod:`adaponder.cli.dial`).
"""

from __future__ import annotations

from collections.abc import Sequence

from adaponder.arg_checks import number_list
from adaponder.modeling.configuration_adaponder import halting_threshold_problem
from adaponder.modeling.run_settings import RunSettings

from .perplexity import Document, score_documents, summarize
from .tables import markdown_table

DEFAULT_TAUS = (1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)


def parse_taus(text: str | Sequence[float] | None) -> list[float]:
    if text is None:
        return list(DEFAULT_TAUS)
    if isinstance(text, str):  # a command-line list: a bad item is named with the argument
        vals = number_list(text, "--taus", float, what="τ", check=lambda t: not halting_threshold_problem(t),
                           expected="comma-separated numbers in (0, 1), e.g. 0.5,0.7,0.9")
    else:
        vals = [float(t) for t in text if str(t).strip()]
    bad = [t for t in vals if halting_threshold_problem(t)]
    if bad:
        raise ValueError(f"τ values must lie in (0, 1); got {bad}")
    return sorted(set(vals))


def sweep_tau(model, docs: Sequence[Document], taus: Sequence[float], **score_kw) -> list[dict]:
    """One row per τ (ascending): ``tau``, ``ppl``, ``bpb``, ``nll``, ``mean_exit``, ``exit_histogram``,
    ``flops`` (see :func:`~adaponder.evaluation.accounting.flops_summary`). Each τ is an argument of the scoring
    calls; the model's config is not touched."""
    return [{"tau": float(tau), **summarize(score_documents(model, docs, settings=RunSettings(tau=tau), **score_kw), docs,
                                            model)}
            for tau in sorted(taus)]


def dial_table(rows: Sequence[dict]) -> str:
    return markdown_table(
        ["τ", "mean exit pass", "MFLOPs/token", "× one pass", "perplexity", "bits/byte"],
        ([f"{r['tau']:g}", f"{r['mean_exit']:.3f}", f"{r['flops']['total'] / 1e6:.2f}",
          f"{r['flops']['x_one_pass']:.3f}", f"{r['ppl']:.3f}", f"{r['bpb']:.4f}"] for r in rows), align="rrrrrr")


__all__ = ["DEFAULT_TAUS", "dial_table", "parse_taus", "sweep_tau"]


if __name__ == "__main__":  # the command line lives in adaponder.cli; say so rather than exit silently
    raise SystemExit("this module has no command line: run `adaponder-dial` (or `python -m adaponder.cli.dial`)")
