"""``adaponder calibrate``: the consistency exit's threshold (docs/method.md A23) for a tolerance δ at a stated
confidence, written next to the checkpoint (``exit_calibration.json``), where ``--exit-rule consistency`` (and lm-eval's
``exit_rule=consistency``) read it.

    adaponder calibrate CKPT --data DATA --split dev --delta 0.05 --confidence 0.95 [--test-split val]

With ``--test-split`` equal to ``--split`` the windows alternate: even ones calibrate, odd ones test.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from adaponder.cli.doc import description
from adaponder.cli.errors import UsageError, cli_main
from adaponder.cli.eval_args import add_checkpoint_args, checkpoint_folder
from adaponder.data.tokenizer import as_tokenizer
from adaponder.evaluation import exit_calibration
from adaponder.evaluation.exit_calibration import calibrate, windows_of
from adaponder.evaluation.perplexity import load_all
from adaponder.evaluation.settings import load_for_eval


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="adaponder calibrate", description=description(exit_calibration.__doc__, __doc__),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_args(p)
    p.add_argument("--data", nargs="+", required=True, help="prepared data folders or text files/folders")
    p.add_argument("--split", default="dev", help="the calibration split of prepared data (default dev)")
    p.add_argument("--test-split", default=None, help="a split to measure the chosen threshold on")
    p.add_argument("--delta", type=float, default=0.05,
                   help="tolerance: the largest share of positions whose greedy token may differ from the full model's")
    p.add_argument("--confidence", type=float, default=0.95, help="1 − ε: the probability the tolerance holds")
    p.add_argument("--window", type=int, default=64, help="tokens per window (the independent unit)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=None, help="cap on tokens read per split")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    if not 0 < args.delta < 1 or not 0 < args.confidence < 1:
        raise UsageError(f"--delta and --confidence must lie in (0, 1); got {args.delta} and {args.confidence}")
    ckpt = checkpoint_folder(args)
    model, tok = load_for_eval(ckpt, device=args.device)
    if model.consistency_heads is None:
        raise UsageError(f"{ckpt}: this {model.config.mode} model has no consistency heads (train it with "
                         "model.consistency_heads: true, docs/method.md A23)")
    eod = as_tokenizer(tok).eod_id
    wins = windows_of(load_all(args.data, tok, args.max_tokens, None, args.split), args.window, eod)
    test = None
    if args.test_split == args.split:
        wins, test = wins[0::2], wins[1::2]
    elif args.test_split is not None:
        test = windows_of(load_all(args.data, tok, args.max_tokens, None, args.test_split), args.window, eod)
    cal = calibrate(model, wins, args.delta, args.confidence, args.window, batch_size=args.batch_size,
                    split=args.split, test_windows=test)
    path = cal.save(ckpt)
    K = cal.passes
    print(f"consistency exit calibrated on {cal.windows} windows ({cal.tokens} tokens) of split {args.split!r}: "
          f"threshold {cal.threshold:g} for δ = {cal.delta:g} at confidence {cal.confidence:g}")
    print(f"  calibration: disagreement {cal.calibration_disagreement:.4f}, mean exit pass "
          f"{cal.calibration_mean_exit:.3f} of {K} ({1 - cal.calibration_mean_exit / K:.1%} of passes saved)")
    if cal.test is not None:
        print(f"  test ({args.test_split!r}, {cal.test['windows']} windows): disagreement {cal.test['disagreement']:.4f}, "
              f"mean exit pass {cal.test['mean_exit']:.3f} ({cal.test['passes_saved']:.1%} of passes saved)")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
