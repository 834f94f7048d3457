"""``adaponder-halting``: the halting analysis of :mod:`adaponder.evaluation.halting` on held-out documents.

Command line (scores the data with the learned policy, then writes the dump and prints the tables)::

    adaponder-halting CKPT --data FILE... --dump tokens.tsv [--plots DIR]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from adaponder.cli.doc import description
from adaponder.cli.errors import cli_main
from adaponder.cli.eval_args import check_token_caps, checkpoint_folder, checkpoint_parser, documents_from_args
from adaponder.data.tokenizer import as_tokenizer
from adaponder.evaluation import halting, plots
from adaponder.evaluation.halting import nll_by_exit_pass
from adaponder.evaluation.perplexity import score_documents
from adaponder.evaluation.settings import load_for_eval, settings_of
from adaponder.evaluation.token_dump import write_token_dump
from adaponder.modeling.exits import exit_histogram


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = checkpoint_parser("adaponder-halting", description(halting.__doc__, __doc__))
    p.add_argument("--dump", default="tokens.tsv", help="per-token dump (.tsv or .jsonl)")
    p.add_argument("--plots", default=None, help="folder for exit_histogram.png and nll_by_exit_pass.png")
    args = p.parse_args(argv)
    if args.exit_rule != "learned":
        p.error("the halting analysis describes the learned policy; use --exit-rule learned")
    check_token_caps(args)
    args.checkpoint = checkpoint_folder(args)
    model, tok = load_for_eval(args.checkpoint, passes=args.passes, dtype=args.dtype, device=args.device)
    settings = settings_of(model, args.checkpoint, tau=args.tau)
    print(settings.banner())
    codec = as_tokenizer(tok)
    docs = documents_from_args(args, tok)
    scores = score_documents(model, docs, window=args.window, stride=args.stride, batch_size=args.batch_size,
                             eod_id=codec.eod_id, pad_id=codec.pad_id, progress=True,
                             settings=settings.run_settings(model))
    write_token_dump(scores, tok, args.dump, docs)
    print(f"per-token dump: {args.dump} ({len(scores)} tokens)")
    print("| exit pass | tokens | fraction | mean NLL | perplexity |\n|---:|---:|---:|---:|---:|")
    for r in nll_by_exit_pass(scores):
        print(f"| {r['exit_pass']} | {r['tokens']} | {r['fraction']:.4f} | {r['mean_nll']:.4f} | {r['ppl']:.2f} |")
    if args.plots:
        out = Path(args.plots)
        plots.exit_histogram_png(exit_histogram(scores.exit_pass, scores.passes), out / "exit_histogram.png")
        plots.nll_by_exit_png(nll_by_exit_pass(scores), out / "nll_by_exit_pass.png")
        print(f"plots: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
