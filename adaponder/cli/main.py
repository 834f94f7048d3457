"""``adaponder``: one command with a subcommand for every job.

    adaponder --help                              # every subcommand, one line each
    adaponder pretrain --config tiny              # a preset by name, from a checkout or an installed wheel
    adaponder study --config reasoning --profile quick
    adaponder COMMAND --help                      # that subcommand's arguments and defaults

Each subcommand is the ``main(argv) -> exit code`` of one module of :mod:`adaponder.cli` (the same function the
older ``adaponder-NAME`` console scripts run, kept as aliases). Only the chosen module is imported, so
``adaponder --help`` and a mistyped subcommand answer before torch loads. Multi-GPU pretraining keeps its launcher
entry: ``deepspeed launch/pretrain.py --config ...`` in a checkout, ``deepspeed --module adaponder.cli.pretrain``
when installed.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from adaponder.cli.errors import EXIT_USER_ERROR, UsageError


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, the :mod:`adaponder.cli` module whose ``main`` runs it, and its one-line summary."""

    name: str
    module: str
    summary: str
    alias: str | None = None  # the older console script that runs the same function

    def entry(self) -> Callable[[list[str]], int]:
        return importlib.import_module(f"adaponder.cli.{self.module}").main


COMMANDS: tuple[Command, ...] = (
    Command("prepare", "prepare", "tokenize text, JSONL, parquet or datasets (or --bundled) into memory-mapped shards",
            "adaponder-prepare"),
    Command("reasoning-data", "reasoning_data", "write the synthetic multi-hop corpus with a difficulty per token",
            "adaponder-reasoning-data"),
    Command("plan", "plan", "memory, FLOPs, micro-batch and days to the token budget of a config on a GPU",
            "adaponder-plan"),
    Command("pretrain", "pretrain", "pretrain or continue pretraining from a config (DeepSpeed; --config tiny)",
            "adaponder-pretrain"),
    Command("finetune", "finetune_glue", "PALBERT-mode GLUE fine-tuning and every exit rule's evaluation (--config rte)",
            "adaponder-finetune-glue"),
    Command("export", "export_hf", "a training checkpoint (ZeRO-3 too) to a Hugging Face folder", "adaponder-export"),
    Command("train-report", "train_report", "validation perplexity and exit-pass histogram of an exported model",
            "adaponder-train-report"),
    Command("eval", "lm_eval", "lm-eval task scores plus mean exit pass and FLOPs per token", "adaponder-eval"),
    Command("perplexity", "perplexity", "perplexity and bits per byte of a checkpoint on text or prepared data",
            "adaponder-perplexity"),
    Command("difficulty", "difficulty", "accuracy, NLL and exit pass by difficulty on a labelled reasoning corpus",
            "adaponder-difficulty"),
    Command("dial", "dial", "the tau dial: perplexity against FLOPs over halting thresholds", "adaponder-dial"),
    Command("halting", "halting", "per-token exit passes and NLL by exit pass, with plots", "adaponder-halting"),
    Command("train-draft", "train_draft", "a draft head for self-speculative decoding, trained on a frozen checkpoint"),
    Command("calibrate", "calibrate", "the consistency exit's threshold for a tolerance δ, written next to the checkpoint"),
    Command("report", "report", "one Markdown report with plots: perplexity, halting, pruning, tau dial, lm-eval",
            "adaponder-report"),
    Command("study", "study", "the evidence study: train and evaluate every arm, write the report (--config reasoning)",
            "adaponder-study"),
    Command("build-extensions", "build_extensions",
            "build DeepSpeed's CPU collectives once for this environment (set-up does it)"),
    Command("bench", "bench", "the benchmarks of eval/bench_*.py (a source checkout): bench NAME [ARGS]"),
)
BY_NAME = {c.name: c for c in COMMANDS}


def overview() -> str:
    """``adaponder --help``: usage and one line per subcommand."""
    width = max(len(c.name) for c in COMMANDS)
    lines = ["usage: adaponder COMMAND [ARGS ...]     (adaponder COMMAND --help: its arguments)", "",
             "Adaptive-depth looped language models: data, training, evaluation and the study.", "", "commands:"]
    lines += [f"  {c.name:<{width}}  {c.summary}" for c in COMMANDS]
    lines += ["", "Configs are files or shipped presets by name (--config tiny, --config rte, --config reasoning).",
              "--debug (any command): the traceback instead of one 'error:' line."]
    return "\n".join(lines)


def command(name: str) -> Command:
    """The subcommand ``name``; a :class:`UsageError` naming the closest ones when there is none."""
    if name in BY_NAME:
        return BY_NAME[name]
    close = difflib.get_close_matches(name, list(BY_NAME), n=2)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise UsageError(f"adaponder: unknown command {name!r}{hint} (adaponder --help lists them)")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        if len(args) > 1 and args[0] == "help":  # `adaponder help pretrain` = `adaponder pretrain --help`
            return main([args[1], "--help"])
        print(overview())
        return 0 if args else EXIT_USER_ERROR
    try:
        chosen = command(args[0])
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    # argparse names the program after argv[0]: usage lines and errors read "adaponder pretrain ..."
    sys.argv = [f"adaponder {chosen.name}", *args[1:]]
    return chosen.entry()(args[1:])


__all__ = ["BY_NAME", "COMMANDS", "Command", "command", "main", "overview"]


if __name__ == "__main__":
    sys.exit(main())
