"""Options shared by the evaluation commands (``adaponder-perplexity``, ``-halting``, ``-dial``, ``-report``) and
the checks and documents they name."""

from __future__ import annotations

import argparse

import torch

from adaponder.errors import UsageError
from adaponder.evaluation.perplexity import PACKINGS, Document, load_all
from adaponder.evaluation.settings import EXIT_RULES
from adaponder.hub import checkpoint_source


def checkpoint_parser(prog: str, description: str, recurrence: bool = True) -> argparse.ArgumentParser:
    """The start every checkpoint-scoring command shares: the checkpoint, the held-out data options and (with
    ``recurrence``) the recurrence settings; the caller adds its own options after these."""
    p = checkpoint_command(prog, description)
    add_data_args(p)
    if recurrence:
        add_recurrence_args(p)
    return p


def checkpoint_command(prog: str, description: str,
                       what: str = "a saved AdaPonder checkpoint folder") -> argparse.ArgumentParser:
    """The parser of a command on one checkpoint: ``description`` kept as written, then the checkpoint
    (:func:`add_checkpoint_args`, ``what`` describing it); the caller adds its own options after it."""
    p = argparse.ArgumentParser(prog=prog, description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_checkpoint_args(p, what)
    return p


def add_checkpoint_args(p: argparse.ArgumentParser, what: str = "a saved AdaPonder checkpoint folder") -> None:
    """The positional checkpoint and ``--revision``: a folder, or a hub id read as ``init.backbone`` reads it."""
    p.add_argument("checkpoint", help=f"{what}, or a Hugging Face hub id (org/name; see --revision)")
    p.add_argument("--revision", default=None,
                   help="branch, tag or commit of a hub-id checkpoint (offline: read from the Hugging Face cache)")


def checkpoint_folder(args: argparse.Namespace) -> str:
    """``args.checkpoint`` as the folder to load: a hub id (+ ``--revision``) resolved to its cached snapshot
    (:func:`adaponder.hub.checkpoint_source`; an uncached id offline is one error naming it), a path unchanged."""
    return str(checkpoint_source(args.checkpoint, args.revision))


def add_recurrence_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("recurrence settings (pinned and printed)")
    g.add_argument("--passes", type=int, default=None, help="K, the passes to run (default: the checkpoint's)")
    g.add_argument("--tau", "--halting-threshold", dest="tau", type=float, default=None,
                   help="τ of A6 (default: 1e-4)")
    g.add_argument("--exit-rule", choices=EXIT_RULES, default="learned",
                   help="learned gates; q-exit (per token on the halting heads); consistency (the consistency heads "
                        "at the threshold `adaponder calibrate` wrote next to the checkpoint); or fixed pruning with a "
                        "uniform/geometric exit histogram")
    g.add_argument("--q", type=float, default=0.5, help="q of Q-exit: stop once Σ p_j > q (default 0.5)")
    g.add_argument("--consistency-threshold", type=float, default=None,
                   help="the consistency exit's threshold (default: the checkpoint's calibration)")
    g.add_argument("--target-mean-exit", type=float, default=None,
                   help="mean exit pass for fixed pruning (default: the learned policy's on the same data)")
    g.add_argument("--seed", type=int, default=0, help="seed of fixed pruning's random subsets")
    g.add_argument("--dtype", default="float32")
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


def add_data_args(p: argparse.ArgumentParser, required: bool = True, *, default_data: str | None = None,
                  default_max_tokens: int | None = None) -> None:
    """The held-out data options. ``default_data`` (with ``required=False``) and ``default_max_tokens`` only
    describe, in the help, the defaults the caller applies when ``--data`` / ``--max-tokens`` are not given."""
    g = p.add_argument_group("held-out data")
    data_help = "text files/folders (one file = one document) or prepared data folders (val split)"
    g.add_argument("--data", nargs="+", required=required,
                   help=data_help + (f" (default: {default_data})" if default_data else ""))
    g.add_argument("--split", default="val", help="split of prepared data folders")
    g.add_argument("--packing", choices=PACKINGS, default="documents",
                   help="documents: each document on its own, EOD as its first context (default); stream: a "
                        "prepared split packed and cut like training-time validation (windows of --window, no "
                        "overlap; --max-tokens caps the samples)")
    g.add_argument("--window", type=int, default=None, help="window length (default: min(context, 1024))")
    g.add_argument("--stride", type=int, default=None, help="window start step (default: window / 2)")
    g.add_argument("--batch-size", type=int, default=None, help="windows per forward (default: 2048 // window)")
    g.add_argument("--max-tokens", type=int, default=None,
                   help="cap on scored tokens per --data entry" + (
                       f" (default {default_max_tokens}; 0 = all)" if default_max_tokens is not None else ""))
    g.add_argument("--max-tokens-per-doc", type=int, default=None, help="cap on scored tokens per document")


def documents_from_args(args: argparse.Namespace, tokenizer) -> list[Document]:
    """The held-out documents named by :func:`add_data_args`' options."""
    return load_all(args.data, tokenizer, args.max_tokens, args.max_tokens_per_doc, args.split,
                    getattr(args, "packing", "documents"), args.window)


def check_token_caps(args: argparse.Namespace) -> None:
    """:class:`UsageError` for a ``--max-tokens`` / ``--max-tokens-per-doc`` below 1: a cap of 0 scored everything,
    as if no cap were given (leaving the option out is how to score everything)."""
    for flag in ("max_tokens", "max_tokens_per_doc"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} {value}: expected a number of tokens >= 1 (leave the option "
                             "out to score everything)")


def check_recurrence_args(args: argparse.Namespace, config) -> None:
    """:class:`UsageError` for a ``--passes`` the checkpoint (its ``config``) cannot run (below 1; beyond the K a
    gated model has gates for; other than 1 for a vanilla one; the rule of
    :func:`~adaponder.evaluation.settings.recurrence_overrides`) and a ``--target-mean-exit`` outside ``[1, passes in
    use]`` (no exit pass lies beyond the last pass), named before the weights are loaded."""
    K = config.num_passes
    passes = args.passes if args.passes is not None else K
    if args.passes is not None:
        if config.mode == "vanilla" and passes != 1:
            raise UsageError(f"--passes {passes}: a vanilla (one-pass) checkpoint runs exactly one pass")
        top = K if config.mode == "adaponder" else None
        if passes < 1 or (top is not None and passes > top):
            raise UsageError(f"--passes {passes}: " + (f"the checkpoint has gates for K = {top} passes (the K it was "
                                                      f"trained with); expected 1 <= --passes <= {top}" if top
                                                      else "expected at least 1"))
    target = getattr(args, "target_mean_exit", None)
    if target is not None and not 1 <= target <= passes:
        raise UsageError(f"--target-mean-exit {target:g}: a mean exit pass lies between 1 and the passes run "
                         f"({passes} here); expected 1 <= --target-mean-exit <= {passes}")


def check_window_args(args: argparse.Namespace, context: int, note: str | None = None) -> None:
    """:class:`UsageError` for ``--window`` / ``--stride`` values that cannot work: a window below 1 or beyond the
    checkpoint's ``context`` in tokens (``note`` says where it comes from, default ``max_position_embeddings``),
    a stride outside ``[1, window]``."""
    if args.window is not None and not 1 <= args.window <= context:
        raise UsageError(f"--window {args.window}: expected 1 <= window <= the checkpoint's context "
                         f"({note or f'max_position_embeddings {context}'})")
    window = args.window or min(context, 1024)  # default_window's rule
    if args.stride is not None and not 1 <= args.stride <= window:
        raise UsageError(f"--stride {args.stride}: expected 1 <= stride <= window ({window})")


__all__ = ["add_checkpoint_args", "add_data_args", "add_recurrence_args", "checkpoint_command", "checkpoint_folder",
           "check_recurrence_args", "check_token_caps", "check_window_args", "documents_from_args"]
