"""``adaponder-prepare``: tokenize raw text into memory-mappable token shards (:mod:`adaponder.data.prepare`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from adaponder.cli.errors import add_debug_help, cli_main, debug_requested, report
from adaponder.data.corpus import bundled_corpus_dir
from adaponder.data.prepare import DEFAULT_SHARD_TOKENS, prepare, summary
from adaponder.data.sources import hub_source


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="adaponder-prepare",
        description="Tokenize text (txt, JSONL[.gz/.zst], parquet, saved HF datasets; files, folders or globs) "
        "into memory-mapped token shards for adaponder.data.loader.PackedLoader.",
    )
    p.add_argument("inputs", nargs="*", metavar="INPUT", help="file, folder, glob or saved dataset folder")
    p.add_argument("-o", "--output", required=True, help="output folder (written atomically)")
    p.add_argument("--bundled", action="store_true", help="add the small corpus bundled with adaponder")
    g = p.add_argument_group("Hugging Face datasets (through the datasets cache; offline: only what is cached)")
    g.add_argument("--hf-dataset", metavar="NAME", default=None,
                   help="add a datasets dataset by name (datasets.load_dataset(NAME, ...)), or a local folder of data "
                   "files or written by save_to_disk")
    g.add_argument("--hf-config", metavar="C", default=None, help="its configuration (subset) name")
    g.add_argument("--split", metavar="S", default=None, help="its split (default: every split, in order)")
    g.add_argument("--streaming", action="store_true", help="stream it instead of downloading it whole first")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json / folder / sentencepiece .model "
                   "(default: bundled Pythia GPT-NeoX-20B tokenizer)")
    p.add_argument("--train-tokenizer", type=int, default=None, metavar="VOCAB",
                   help="train a byte-level BPE tokenizer with VOCAB entries on the train split and save it as "
                   "tokenizer.json next to the shards (instead of --tokenizer)")
    p.add_argument("--text-field", default="text", help="JSONL key or column holding the text (default: text)")
    p.add_argument("--val-fraction", type=float, default=0.01, help="fraction of documents for val (default 0.01)")
    p.add_argument("--seed", type=int, default=0, help="seed of the document-level split (default 0)")
    p.add_argument("-j", "--workers", type=int, default=0, help="tokenization processes (default: all CPUs)")
    p.add_argument("--errors", choices=("strict", "replace"), default="strict",
                   help="invalid UTF-8: fail (strict, default) or substitute U+FFFD and count (replace)")
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="max tokens per shard file")
    p.add_argument("--overwrite", action="store_true", help="replace an existing prepared output folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``adaponder-prepare`` / ``python -m adaponder.cli.prepare``."""
    parser = build_parser()
    add_debug_help(parser)
    args = parser.parse_args(argv)
    inputs: list = list(args.inputs) + ([str(bundled_corpus_dir())] if args.bundled else [])
    if args.hf_dataset is not None:
        inputs.append(hub_source(args.hf_dataset, args.hf_config, args.split, args.streaming))
    elif args.hf_config is not None or args.split is not None or args.streaming:
        parser.error("--hf-config, --split and --streaming apply to --hf-dataset")
    if not inputs:
        parser.error("give at least one INPUT, --bundled or --hf-dataset NAME")
    try:
        meta = prepare(
            inputs,
            args.output,
            tokenizer=args.tokenizer,
            text_field=args.text_field,
            val_fraction=args.val_fraction,
            seed=args.seed,
            num_workers=args.workers,
            errors=args.errors,
            progress=not args.no_progress,
            shard_tokens=args.shard_tokens,
            overwrite=args.overwrite,
            train_tokenizer=args.train_tokenizer,
        )
    except ValueError as exc:  # DataError, and prepare()'s checks of its arguments (--val-fraction, ...)
        if debug_requested():
            raise
        return report(exc)
    except KeyboardInterrupt:
        print("adaponder-prepare: interrupted; nothing was written", file=sys.stderr)
        return 130
    print(summary(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
