"""``adaponder train-draft``: a draft head for self-speculative decoding (docs/method.md A24), trained on a frozen
looped checkpoint, written with the checkpoint to a new folder.

    adaponder train-draft CKPT --data PREPARED --out CKPT-draft [--steps 1500 --window 256 --batch 2 --lr 1e-3]

Every weight of CKPT is kept as it is (the new folder's forward equals CKPT's); the head learns to predict the
full model's distribution from pass 1's state. Decoding with ``speculative=SpeculativeConfig(1, γ)`` or
``speculative="pipelined"`` then drafts with it. ``--redraft`` adds and trains a second head on pass K−1's state,
with which pipelined decoding drafts each token again before the full model's verdict (K ≥ 3); ``--early-redraft``
(with ``--redraft``, K ≥ 4) adds one on each of passes 2..K−2 as well, so a wrong draft is dropped after one pass.
``--greedy-windows N`` trains on the model's own greedy text as well (N continuations of training-split prompts,
every other step), the text the drafts meet while it decodes. Prints the drafts' agreement with the full model on the
held-out split before and after (and, with ``--greedy-windows``, on its greedy continuations of held-out prompts).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from adaponder.cli.doc import DefaultsHelpFormatter, description
from adaponder.cli.errors import UsageError, cli_main
from adaponder.cli.eval_args import checkpoint_command, checkpoint_folder
from adaponder.train import draft_head


#: The greedy-text windows: prompt tokens, then the tokens the model decodes from them.
PROMPT, NEW = 64, 64


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = checkpoint_command("adaponder train-draft", description(draft_head.__doc__, __doc__),
                           "a looped (ponderlm, loop or adaponder) checkpoint folder")
    p.formatter_class = DefaultsHelpFormatter
    p.add_argument("--data", required=True, help="a prepared data folder (its train split trains the head)")
    p.add_argument("--out", required=True, help="the folder to write the checkpoint with its draft head to")
    p.add_argument("--steps", type=int, default=1500, help="training steps")
    p.add_argument("--window", type=int, default=256, help="tokens per window")
    p.add_argument("--batch", type=int, default=2, help="windows per step")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate, cosine-decayed to a tenth")
    p.add_argument("--seed", type=int, default=0, help="seed of the window order and the greedy prompts")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--redraft", action="store_true", help="also a re-draft head on pass K−1 (pipelined decoding)")
    p.add_argument("--early-redraft", action="store_true",
                   help="with --redraft: re-draft heads on passes 2..K−2 too (K >= 4)")
    p.add_argument("--greedy-windows", type=int, default=0,
                   help="also train on N windows of the model's own greedy text (64-token training-split prompts and "
                        "the 64 tokens it decodes from each; every other step): 0 = the corpus alone")
    args = p.parse_args(argv)
    for name in ("steps", "window", "batch"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.greedy_windows < 0:
        raise UsageError(f"--greedy-windows must be >= 0, got {args.greedy_windows}")
    data = Path(args.data)
    if not (data / "meta.json").is_file():
        raise UsageError(f"--data {data}: not a prepared data folder (no meta.json; see adaponder prepare)")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: exists and is not empty; choose a new folder")
    ckpt = checkpoint_folder(args)
    import torch

    from adaponder.data.fingerprint import check_corpus_tokenizer
    from adaponder.data.layout import split_stream
    from adaponder.evaluation.settings import load_tokenizer_for
    from adaponder.modeling import AdaPonderConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    config = AdaPonderConfig.from_pretrained(ckpt)
    if config.mode not in ("ponderlm", "loop", "adaponder") or config.num_passes < 2:
        raise UsageError(f"{ckpt}: a {config.mode} model with {config.num_passes} pass(es) has no passes to draft "
                         "from; a draft head needs a looped model")
    if args.redraft and config.num_passes < 3:
        raise UsageError(f"--redraft: {ckpt} has K = {config.num_passes} passes; pass K−1 is pass 1, which the draft "
                         "head reads already")
    if args.early_redraft and not args.redraft:
        raise UsageError("--early-redraft adds re-draft heads before pass K−1's: give --redraft too")
    if args.early_redraft and config.num_passes < 4:
        raise UsageError(f"--early-redraft: {ckpt} has K = {config.num_passes} passes; passes 2..K−2 are none")
    # the head learns the model's distribution over the data's ids: data of another tokenizer teaches it nothing
    check_corpus_tokenizer(data, load_tokenizer_for(ckpt))
    heads = dict(draft_head=True, **({"redraft_head": True} if args.redraft else {}),
                 **({"early_redraft_heads": True} if args.early_redraft else {}))
    model = with_new_heads(ckpt, heads)
    train, val = split_stream(data, "train"), split_stream(data, "val")
    if int(train.max()) >= config.vocab_size:
        raise UsageError(f"--data {data}: token ids up to {int(train.max())}, beyond the checkpoint's vocabulary "
                         f"({config.vocab_size}); use the data the checkpoint was trained on")
    before = draft_head.draft_agreement(model, val, args.window)
    print(f"agreement with the full model before: {_agreement(before)} ({before['positions']} held-out positions)")
    greedy = held_out = None
    if args.greedy_windows:
        greedy = draft_head.greedy_windows(model, train, args.greedy_windows, PROMPT, NEW, seed=args.seed)
        held_out = draft_head.greedy_windows(model, val, 32, PROMPT, NEW, seed=args.seed + 1)
        before["greedy"] = draft_head.greedy_agreement(model, held_out, PROMPT)
        print(f"  on its greedy text: {_agreement(before['greedy'])} ({before['greedy']['positions']} positions "
              "continuing held-out prompts)")
    out.mkdir(parents=True, exist_ok=True)
    summary = draft_head.train_draft_head(model, train, args.steps, args.window, args.batch, args.lr, args.seed,
                                          log=out / "draft_metrics.jsonl", greedy=greedy)
    after = draft_head.draft_agreement(model, val, args.window)
    print(f"agreement with the full model after: {_agreement(after)}")
    if held_out is not None:
        after["greedy"] = draft_head.greedy_agreement(model, held_out, PROMPT)
        print(f"  on its greedy text: {_agreement(after['greedy'])}")
    model.save_pretrained(out)
    for extra in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "exit_calibration.json"):
        if (Path(ckpt) / extra).is_file():
            shutil.copy(Path(ckpt) / extra, out / extra)
    (out / "draft_head.json").write_text(json.dumps({"source": str(ckpt), "data": str(data), **vars(args),
                                                     "before": before, "after": after, **summary}, indent=2,
                                                    default=str))
    print(f"written: {out}")
    return 0


def with_new_heads(ckpt: str, heads: dict[str, bool]):
    """The checkpoint's model with the draft heads ``heads`` added (in eval mode), every weight it saved as saved.

    Loaded as it was saved first, so that transformers reports what this checkpoint lacks or holds beyond its own
    configuration; then its weights go into a model built with the heads, whose only weights not in the checkpoint
    must be theirs (the new heads start as the model initialises them; heads the checkpoint has keep their
    weights). Loading with the heads straight away would report each new head as MISSING: what adding it means."""
    from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM

    saved = AdaPonderForCausalLM.from_pretrained(ckpt)
    model = AdaPonderForCausalLM(AdaPonderConfig.from_pretrained(ckpt, **heads)).to(saved.dtype)
    missing, unexpected = model.load_state_dict(saved.state_dict(), strict=False)
    others = [k for k in missing if not k.startswith(("draft_head.", "redraft_head.", "early_redraft_heads."))]
    if others or unexpected:  # the same class on the same config with heads: nothing else can differ
        raise RuntimeError(f"{ckpt}: adding draft heads changed other weights (missing {others}, unexpected "
                           f"{list(unexpected)})")
    model.generation_config = saved.generation_config
    return model.eval()


def _agreement(figures: dict) -> str:
    names = {"draft_head": "draft head", "pass1_logits": "pass-1 logits", "redraft_head": "re-draft head (pass K−1)"}
    names.update({key: f"re-draft head (pass {key[len('redraft_pass'):]})" for key in sorted(figures)
                  if key.startswith("redraft_pass")})
    return ", ".join(f"{label} {figures[key]:.3f}" for key, label in names.items() if key in figures)


if __name__ == "__main__":
    sys.exit(main())
