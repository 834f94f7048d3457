"""``adaponder-train-report``: validation loss, perplexity and the halting report of an exported model on a prepared
val split (:mod:`adaponder.train.report`).

Command line::

    adaponder-train-report --model HF_DIR --data PREPARED_DIR [--seq-len 256] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from adaponder.data.errors import DataError
from adaponder.data.fingerprint import check_corpus_tokenizer
from adaponder.data.loader import iter_eval_batches
from adaponder.data.tokenizer import load_tokenizer
from adaponder.modeling import AdaPonderForCausalLM
from adaponder.train.report import compute_saved, console_report, evaluate_model, write_report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="adaponder-train-report",
                                description="Evaluate an exported model on a prepared val split and write report.md")
    p.add_argument("--model", required=True, help="Hugging Face folder (e.g. runs/demo/hf)")
    p.add_argument("--data", required=True, help="prepared data folder")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--max-batches", type=int, default=None)
    p.add_argument("--out", default=None, help="where to write report.md (default: the model folder)")
    args = p.parse_args(argv)

    # The installed adaponder classes, never the modeling code saved in the folder (no trust_remote_code).
    try:
        model = AdaPonderForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    except (OSError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"error: {args.model}: cannot load it as an adaponder model ({reason})", file=sys.stderr)
        return 2
    try:
        if (Path(args.model) / "tokenizer.json").is_file():  # the tokenizer it was exported with must be the data's
            check_corpus_tokenizer(args.data, load_tokenizer(Path(args.model) / "tokenizer.json"))
        batches = iter_eval_batches(args.data, args.seq_len, args.micro_batch, vocab_size=model.config.vocab_size,
                                    max_batches=args.max_batches)
        summary = evaluate_model(model, batches)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary.update(compute_saved(model, summary["exit_hist"], args.seq_len))
    write_report(args.out or args.model, summary, title=f"Report: {args.model}")
    print(console_report(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
