"""The compute dial: sweep the halting threshold τ (A6) and measure perplexity against realised FLOPs.

A token halts after pass i when its gate ``s^i < τ``, so a larger τ halts more tokens earlier and costs
fewer FLOPs. Each τ re-scores the same documents with the same windows.

Command line::

    python -m adaponder.evaluation.dial CKPT --data FILE... --taus 1e-4,0.01,0.1,0.3,0.5 [--plot dial.png]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from adaponder.cli.errors import cli_main

from .perplexity import Document, score_documents, summarize

DEFAULT_TAUS = (1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)


def parse_taus(text: str | Sequence[float] | None) -> list[float]:
    if text is None:
        return list(DEFAULT_TAUS)
    vals = [float(t) for t in (text.split(",") if isinstance(text, str) else text) if str(t).strip()]
    bad = [t for t in vals if not 0.0 < t < 1.0]
    if bad:
        raise ValueError(f"τ values must lie in (0, 1); got {bad}")
    return sorted(set(vals))


def sweep_tau(model, docs: Sequence[Document], taus: Sequence[float], **score_kw) -> list[dict]:
    """One row per τ (ascending): ``tau``, ``ppl``, ``bpb``, ``nll``, ``mean_exit``, ``exit_histogram``,
    ``flops`` (see :func:`~adaponder.evaluation.accounting.flops_summary`). τ is restored afterwards."""
    original = model.config.halting_threshold
    rows = []
    try:
        for tau in sorted(taus):
            model.config.halting_threshold = float(tau)
            scores = score_documents(model, docs, **score_kw)
            rows.append({"tau": float(tau), **summarize(scores, docs, model)})
    finally:
        model.config.halting_threshold = original
    return rows


def dial_table(rows: Sequence[dict]) -> str:
    lines = ["| τ | mean exit pass | MFLOPs/token | × one pass | perplexity | bits/byte |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['tau']:g} | {r['mean_exit']:.3f} | {r['flops']['total'] / 1e6:.2f} | "
                     f"{r['flops']['x_one_pass']:.3f} | {r['ppl']:.3f} | {r['bpb']:.4f} |")
    return "\n".join(lines)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    from . import plots
    from .accounting import ONE_PASS_BASELINE
    from .perplexity import _Codec, add_data_args, documents_from_args
    from .settings import load_for_eval, settings_of

    p = argparse.ArgumentParser(prog="python -m adaponder.evaluation.dial", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    add_data_args(p)
    p.add_argument("--taus", default=None,
                   help=f"comma-separated τ values (default {','.join(map(str, DEFAULT_TAUS))})")
    p.add_argument("--passes", type=int, default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--plot", default=None, help="write perplexity vs FLOPs here (PNG)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    model, tok = load_for_eval(args.checkpoint, args.passes, None, args.dtype, args.device)
    print(settings_of(model, args.checkpoint).banner())
    codec = _Codec(tok)
    docs = documents_from_args(args, tok)
    rows = sweep_tau(model, docs, parse_taus(args.taus), window=args.window, stride=args.stride,
                     batch_size=args.batch_size, eod_id=codec.eod_id, pad_id=codec.pad_id)
    print(dial_table(rows))
    print(ONE_PASS_BASELINE)
    if args.plot:
        plots.ppl_vs_flops_png(rows, Path(args.plot))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


__all__ = ["DEFAULT_TAUS", "dial_table", "parse_taus", "sweep_tau"]

if __name__ == "__main__":
    sys.exit(main())
