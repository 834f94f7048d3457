"""``adaponder-perplexity``: perplexity and bits per byte (:mod:`adaponder.evaluation.perplexity`).

Command line::

    adaponder-perplexity CKPT --data /path/to/wikitext-2/wiki.test.tokens \\
        --window 512 --stride 256 --max-tokens 50000 [--tau 1e-4] [--dump tokens.tsv]
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from adaponder.cli.doc import description
from adaponder.cli.errors import EXIT_NONFINITE, UsageError, add_debug_help, cli_main, require_checkpoint
from adaponder.cli.eval_args import (check_recurrence_args, check_token_caps, check_window_args, checkpoint_parser,
                                     documents_from_args)
from adaponder.data.tokenizer import as_tokenizer
from adaponder.evaluation import perplexity
from adaponder.evaluation.accounting import ONE_PASS_BASELINE
from adaponder.modeling import AdaPonderConfig
from adaponder.modeling.input_checks import context_note, context_tokens
from adaponder.evaluation.perplexity import (TABLE_HEADER, check_vocab, format_row, score_documents,
                                             summarize_by_source)
from adaponder.evaluation.pruning import FIXED_RULES
from adaponder.evaluation.settings import load_for_eval, load_tokenizer_for, settings_of
from adaponder.evaluation.token_dump import write_token_dump


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = checkpoint_parser("adaponder-perplexity", description(perplexity.__doc__, __doc__))
    p.add_argument("--dump", default=None, help="per-token dump (.jsonl or .tsv): token, exit pass, NLL")
    p.add_argument("--json", default=None, help="write the summary as JSON here")
    add_debug_help(p)
    args = p.parse_args(argv)
    check_token_caps(args)
    # Arguments and data that cannot work fail here, in one line, before the weights are loaded.
    args.checkpoint = str(require_checkpoint(args.checkpoint, revision=args.revision))
    for src in args.data:
        if not Path(src).exists():
            raise UsageError(f"--data {src}: no such file or folder")
    config = AdaPonderConfig.from_pretrained(args.checkpoint)
    check_recurrence_args(args, config)
    check_window_args(args, context_tokens(config), context_note(config))  # pause mode: fewer tokens
    tok = load_tokenizer_for(args.checkpoint)
    docs = documents_from_args(args, tok)
    check_vocab(docs, config.vocab_size)

    model, _ = load_for_eval(args.checkpoint, passes=args.passes, dtype=args.dtype, device=args.device)
    codec = as_tokenizer(tok)
    kw = dict(window=args.window, stride=args.stride, batch_size=args.batch_size, eod_id=codec.eod_id,
              pad_id=codec.pad_id, progress=True)
    learned = settings_of(model, args.checkpoint, tau=args.tau)
    target = args.target_mean_exit
    if args.exit_rule in FIXED_RULES and target is None:
        target = float(score_documents(model, docs, settings=learned.run_settings(), **kw).exit_pass.mean())
        print(f"[adaponder] learned policy's mean exit pass on this data: {target:.4f} (fixed-pruning target)")
    settings = settings_of(model, args.checkpoint, exit_rule=args.exit_rule, target_mean_exit=target,
                           pruning_seed=args.seed, tau=args.tau, q=args.q,
                           consistency_threshold=args.consistency_threshold)
    print(settings.banner())
    scores = score_documents(model, docs, settings=settings.run_settings(model), **kw)
    if scores.meta["packing"] == "stream":
        print(f"  packed stream (training validation's windows): window {docs[0].packed_window}, no overlap")
    else:
        print(f"  window {scores.meta['window']}, stride {scores.meta['stride']}")
    summary = summarize_by_source(scores, docs, model)
    print(TABLE_HEADER)
    for name, s in summary.items():
        print(format_row(name, s))
    print(ONE_PASS_BASELINE)
    bad = [name for name, s in summary.items() if not math.isfinite(s["nll"])]
    if bad:  # (nothing is written: a NaN must not pass for a result)
        print(f"error: the perplexity of {', '.join(bad)} is {summary[bad[0]]['ppl']} (a non-finite loss; expected a "
              f"finite number): {args.checkpoint} produced NaN or inf scores; no --dump/--json written",
              file=sys.stderr, flush=True)
        return EXIT_NONFINITE
    if args.dump:
        write_token_dump(scores, tok, args.dump, docs)
        print(f"per-token dump: {args.dump}")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": settings.as_dict(), "window": scores.meta,
                                               "results": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
