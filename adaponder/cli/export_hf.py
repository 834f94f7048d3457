#!/usr/bin/env python
"""Export a training checkpoint to a Hugging Face folder (weights consolidated from ZeRO shards).

    python launch/export_hf.py runs/demo/checkpoints runs/demo/hf-export          # newest checkpoint
    python launch/export_hf.py runs/demo/checkpoints/step00000200 out/ --dtype bf16
    adaponder-export runs/demo/checkpoints OUT_DIR                                  # installed

The folder loads with ``AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)`` and holds the
tokenizer, so ``lm_eval --model hf --model_args pretrained=out,trust_remote_code=True`` works directly.

The checkpoint is checked first (every file's recorded size and SHA-256; every .pt unpickled weights-only, so a
tampered file is refused, not run). The output folder must be new or empty unless --overwrite; it is written
as a temporary sibling folder (.NAME.tmp-<pid>) and renamed into place when complete.

Exit codes: 0 exported; 2 damaged or unsafe checkpoint, or an output folder that may not be written.
"""

import argparse
import sys

from adaponder.cli.errors import add_debug_help, cli_main, debug_requested, report


@cli_main
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="checkpoint folder (uses its 'latest') or one stepNNNNNNNN folder")
    p.add_argument("output", help="Hugging Face output folder")
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    add_debug_help(p)
    args = p.parse_args(argv)

    # torch, transformers and DeepSpeed take seconds to import: --help and a bad argument answer before they load
    from adaponder.train.checkpoint import CheckpointError, resolve_checkpoint
    from adaponder.train.export import export_checkpoint

    try:
        tag_dir = resolve_checkpoint(args.checkpoint)  # checked strictly by export_checkpoint
        out = export_checkpoint(tag_dir, args.output, dtype=args.dtype, overwrite=args.overwrite)
    except (CheckpointError, RuntimeError, OSError) as err:
        if debug_requested():
            raise
        return report(err)
    print(f"exported {tag_dir} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
