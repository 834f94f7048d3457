"""``adaponder calibrate``: the consistency exit's threshold (docs/method.md A23) for a tolerance δ at a stated
confidence, written next to the checkpoint (``exit_calibration.json``), where ``--exit-rule consistency`` (and lm-eval's
``exit_rule=consistency``) read it.

    adaponder calibrate CKPT --data DATA --split dev --delta 0.05 --confidence 0.95 [--test-split val]

With ``--test-split`` equal to ``--split`` the windows alternate: even ones calibrate, odd ones test. Each split is
read up to ``--max-tokens`` (0: all of it); every window runs once per threshold tried, so the time grows with the
tokens read (a progress bar counts the windows). A prepared folder must hold the model's tokenizer's ids. Ctrl-C
stops at once, writing nothing (exit code 130).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from adaponder.cli.doc import DefaultsHelpFormatter, description
from adaponder.cli.errors import UsageError, cli_main
from adaponder.cli.eval_args import checkpoint_command, checkpoint_folder
from adaponder.data.tokenizer import as_tokenizer
from adaponder.evaluation import exit_calibration
from adaponder.evaluation.exit_calibration import calibrate, windows_of
from adaponder.evaluation.perplexity import load_all
from adaponder.evaluation.settings import load_for_eval


#: Tokens read per split unless --max-tokens says otherwise: 256 windows of 64, enough for the test to certify a
#: threshold at δ = 0.05 and 95 % confidence (it needs ≥ 59 windows without a disagreement), in minutes on a CPU.
DEFAULT_MAX_TOKENS = 16384
EXIT_INTERRUPTED = 128 + signal.SIGINT


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = checkpoint_command("adaponder calibrate", description(exit_calibration.__doc__, __doc__))
    p.formatter_class = DefaultsHelpFormatter
    p.add_argument("--data", nargs="+", required=True, help="prepared data folders or text files/folders")
    p.add_argument("--split", default="dev", help="the calibration split of prepared data (default dev)")
    p.add_argument("--test-split", default=None, help="a split to measure the chosen threshold on")
    p.add_argument("--delta", type=float, default=0.05,
                   help="tolerance: the largest share of positions whose greedy token may differ from the full model's")
    p.add_argument("--confidence", type=float, default=0.95, help="1 − ε: the probability the tolerance holds")
    p.add_argument("--window", type=int, default=64, help="tokens per window (the independent unit)")
    p.add_argument("--batch-size", type=int, default=16, help="windows per forward")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"tokens read per split, at most (default {DEFAULT_MAX_TOKENS}; 0 = all of it): every window "
                        "runs once per threshold tried, so the time grows with the tokens read")
    p.add_argument("--device", default="cpu", help="torch device")
    args = p.parse_args(argv)
    if not 0 < args.delta < 1 or not 0 < args.confidence < 1:
        raise UsageError(f"--delta and --confidence must lie in (0, 1); got {args.delta} and {args.confidence}")
    if args.max_tokens < 0:
        raise UsageError(f"--max-tokens {args.max_tokens}: expected a number of tokens >= 1, or 0 for all of each split")
    cap = args.max_tokens or None
    ckpt = checkpoint_folder(args)
    saving = False
    try:
        cal = _calibrate(args, ckpt, cap)
        saving = True
        path = cal.save(ckpt)
    except KeyboardInterrupt:
        # as pretraining: one line and 128 + SIGINT, no traceback; the file is written by a rename, never in part
        target = Path(ckpt) / exit_calibration.CALIBRATION_FILE
        print(f"adaponder calibrate: stopped by Ctrl-C while writing {target}, which holds the earlier calibration "
              "(or none) or this one, whole" if saving else "adaponder calibrate: stopped by Ctrl-C; nothing was "
              "written", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
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


def _calibrate(args, ckpt: str, cap: int | None) -> exit_calibration.Calibration:
    model, tok = load_for_eval(ckpt, device=args.device)
    if model.consistency_heads is None:
        raise UsageError(f"{ckpt}: this {model.config.mode} model has no consistency heads (train it with "
                         "model.consistency_heads: true, docs/method.md A23)")
    eod = as_tokenizer(tok).eod_id
    wins = windows_of(_read(args, tok, cap, args.split), args.window, eod)
    test = None
    if args.test_split == args.split:
        wins, test = wins[0::2], wins[1::2]
    elif args.test_split is not None:
        test = windows_of(_read(args, tok, cap, args.test_split), args.window, eod)
    return calibrate(model, wins, args.delta, args.confidence, args.window, batch_size=args.batch_size,
                     split=args.split, test_windows=test, progress=True)


def _read(args, tok, cap: int | None, split: str):
    """The documents of ``split`` of every ``--data`` entry, each read up to ``cap`` tokens; says which were cut."""
    docs = []
    for src in args.data:
        part = load_all([src], tok, cap, None, split)
        if cap is not None and sum(len(d) for d in part) >= cap:
            print(f"{src}: read the first {cap} tokens of split {split!r} (--max-tokens; 0 reads all)", flush=True)
        docs += part
    return docs


if __name__ == "__main__":
    sys.exit(main())
