"""``adaponder-eval --help``: adaponder-eval's own arguments and defaults first, then the lm-eval options it passes
through, with the help lines whose defaults adaponder-eval changes rewritten (lm-eval's own help says
``--model`` defaults to ``hf``, which is not what ``adaponder-eval`` runs)."""

from __future__ import annotations

import argparse

from adaponder.cli.errors import add_debug_help

DESCRIPTION = """\
lm-eval's `lm-eval run` with the `adaponder` model registered: scores an AdaPonder checkpoint on lm-eval tasks with
the recurrence settings (K, tau, exit rule) pinned and printed, then prints the realised compute (mean exit pass,
exit histogram, FLOPs per token) after lm-eval's results table; the same figures are in the results JSON under
config.adaponder. A missing checkpoint or any other user error is one 'error:' line and exit code 2; NaN/inf
scores exit with 3."""

EPILOG = """\
examples:
  adaponder-eval runs/demo/hf --tasks adaponder_lambada_openai --limit 100 --batch_size 8
  adaponder-eval your-org/adaponder-410m --model_args revision=v1 --tasks adaponder_piqa   # a hub id
  adaponder-eval --model_args checkpoint=CKPT,tau=0.1,exit_rule=uniform \\
      --tasks adaponder_suite --num_fewshot 5 --output_path out/
  adaponder-eval ls tasks                 # lm-eval's subcommands work too (ls, validate)

Every argument not listed above goes to lm-eval unchanged; its options follow."""

MODEL_ARGS_HELP = (
    "the adaponder model's arguments, k=v,...: checkpoint=PATH_OR_HUB_ID (or pretrained=; the positional CHECKPOINT "
    "fills it in), revision=REV (of a hub id), passes=K, tau=TAU (τ of A6, a setting of each call; default "
    "1e-4), exit_rule=learned|uniform|geometric, target_mean_exit, pruning_seed, calibration_data, "
    "calibration_tokens, speculative_draft_tokens, speculative_draft_passes, dtype (default auto: the "
    "checkpoint's), device (default cuda if available, else cpu), batch_size, and any other HFLM argument")


def own_parser(task_dir: str | None) -> argparse.ArgumentParser:
    """adaponder-eval's own arguments, for the help text (the command line itself is parsed by lm-eval)."""
    p = argparse.ArgumentParser(prog="adaponder-eval", description=DESCRIPTION, epilog=EPILOG,
                                usage="adaponder-eval [CHECKPOINT] --tasks TASK[,TASK...] [lm-eval options]",
                                formatter_class=argparse.RawDescriptionHelpFormatter, add_help=False)
    g = p.add_argument_group("adaponder-eval's own arguments and defaults")
    g.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    g.add_argument("checkpoint", nargs="?", metavar="CHECKPOINT",
                   help="a saved AdaPonder checkpoint folder (the hf/ of a run) or a Hugging Face hub id (org/name; "
                        "revision=REV in --model_args), resolved offline through the Hugging Face cache as "
                        "init.backbone is; becomes checkpoint=CHECKPOINT in --model_args")
    g.add_argument("--model", default="adaponder",
                   help="lm-eval model (default: adaponder, not lm-eval's hf; any other model runs as in lm-eval)")
    g.add_argument("--model_args", help=MODEL_ARGS_HELP)
    g.add_argument("--include_path", default=task_dir,
                   help="lm-eval task folder (default: the adaponder_* tasks shipped with adaponder, "
                        f"{task_dir or 'not found'}); their data come from $ADAPONDER_EVAL_DATA")
    g.add_argument("--tasks-path", action="store_true",
                   help="print the folder of the adaponder_* tasks and exit: unmodified lm-eval runs them with "
                        '--include_path "$(adaponder eval --tasks-path)"')
    add_debug_help(g)
    return p


def lm_eval_run_help() -> str:
    """lm-eval's ``run`` options, with ``--model`` / ``--include_path`` / ``--model_args`` pointing at the defaults
    above. Built from lm-eval's own parser so the list matches the installed lm-eval."""
    from lm_eval._cli import HarnessCLI  # lm-eval only when the help is printed: adaponder-eval imports this module first

    cli = HarnessCLI()
    run = next((a.choices["run"] for a in cli._parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if run is None:  # a future lm-eval without a ``run`` subcommand
        return "lm-eval options: see `lm-eval --help`\n"
    rewritten = {"model": "model name (adaponder-eval default: adaponder; see above)",
                 "model_args": "model arguments (see above for the adaponder model's)",
                 "include_path": "extra task folder (adaponder-eval default: its adaponder_* tasks; see above)"}
    for action in run._actions:
        if action.dest in rewritten:
            action.help = rewritten[action.dest]
        elif action.dest == "help":
            action.help = argparse.SUPPRESS
    run.usage = argparse.SUPPRESS
    run.description = None
    return "lm-eval options (passed through unchanged):\n" + run.format_help().lstrip("\n")


def format_help(task_dir: str | None) -> str:
    return own_parser(task_dir).format_help() + "\n" + lm_eval_run_help()


__all__ = ["format_help", "lm_eval_run_help", "own_parser"]
