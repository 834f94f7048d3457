"""``adaponder-dial``: the τ sweep of :mod:`adaponder.evaluation.dial`, perplexity against realised FLOPs.

Command line::

    adaponder-dial CKPT --data FILE... --taus 1e-4,0.01,0.1,0.3,0.5 [--plot dial.png]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from adaponder.cli.doc import description
from adaponder.cli.errors import cli_main
from adaponder.cli.eval_args import check_token_caps, checkpoint_folder, checkpoint_parser, documents_from_args
from adaponder.data.tokenizer import as_tokenizer
from adaponder.evaluation import dial, plots
from adaponder.evaluation.accounting import ONE_PASS_BASELINE
from adaponder.evaluation.dial import DEFAULT_TAUS, dial_table, parse_taus, sweep_tau
from adaponder.evaluation.settings import load_for_eval, settings_of


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = checkpoint_parser("adaponder-dial", description(dial.__doc__, __doc__), recurrence=False)
    p.add_argument("--taus", default=None,
                   help=f"comma-separated τ values (default {','.join(map(str, DEFAULT_TAUS))})")
    p.add_argument("--passes", type=int, default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--plot", default=None, help="write perplexity vs FLOPs here (PNG)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    check_token_caps(args)
    args.checkpoint = checkpoint_folder(args)
    taus = parse_taus(args.taus)  # (a bad list is named before the model loads)
    # (keywords: a positional call broke silently when a parameter left load_for_eval's signature)
    model, tok = load_for_eval(args.checkpoint, passes=args.passes, dtype=args.dtype, device=args.device)
    print(settings_of(model, args.checkpoint).banner())
    codec = as_tokenizer(tok)
    docs = documents_from_args(args, tok)
    rows = sweep_tau(model, docs, taus, window=args.window, stride=args.stride,
                     batch_size=args.batch_size, eod_id=codec.eod_id, pad_id=codec.pad_id)
    print(dial_table(rows))
    print(ONE_PASS_BASELINE)
    if args.plot:
        plots.ppl_vs_flops_png(rows, Path(args.plot))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
