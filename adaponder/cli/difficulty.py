"""``adaponder-difficulty``: accuracy, NLL and exit pass by difficulty (:mod:`adaponder.evaluation.difficulty`).

Command line::

    adaponder-difficulty CKPT --data PREPARED_DIR [--split val] [--json out.json]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from adaponder.cli.doc import description
from adaponder.cli.errors import cli_main
from adaponder.cli.eval_args import checkpoint_command, checkpoint_folder
from adaponder.evaluation import difficulty
from adaponder.evaluation.difficulty import evaluate_difficulty, format_tables
from adaponder.evaluation.settings import load_for_eval
from adaponder.jsonio import json_safe, write_json_atomic
from adaponder.modeling.run_settings import RunSettings


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = checkpoint_command("adaponder-difficulty", description(difficulty.__doc__, __doc__),
                           "an exported model folder (hf/ of a run)")
    p.add_argument("--data", required=True, help="a labelled corpus folder (adaponder-reasoning-data)")
    p.add_argument("--split", default="val")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--tau", "--halting-threshold", dest="tau", type=float, default=None,
                   help="τ of A6 (default: 1e-4)")
    p.add_argument("--json", default=None, help="also write the result as JSON here")
    args = p.parse_args(argv)
    args.checkpoint = checkpoint_folder(args)
    model, tok = load_for_eval(args.checkpoint)
    res = evaluate_difficulty(model, args.data, tok, split=args.split, batch_size=args.batch_size,
                              settings=RunSettings() if args.tau is None else RunSettings(tau=args.tau))
    print(format_tables(res))
    if args.json:
        write_json_atomic(Path(args.json), json_safe(res))
        print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
