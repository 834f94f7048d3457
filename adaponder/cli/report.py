"""``adaponder-report``: one command, one Markdown report for a checkpoint (:mod:`adaponder.evaluation.report`).

Example::

    adaponder-report runs/demo/hf --out runs/demo/report \\
        --data /path/to/wikitext-2/wiki.test.tokens --max-tokens 20000 \\
        --tasks adaponder_suite --limit 100 --num-fewshot 0,5
    python -m adaponder.cli.report ...    # the same without the console script
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from adaponder.cli.doc import description
from adaponder.cli.errors import cli_main
from adaponder.cli.eval_args import add_data_args, checkpoint_command, checkpoint_folder
from adaponder.cli.lm_eval import check_limit
from adaponder.evaluation import plots, report
from adaponder.evaluation.dial import DEFAULT_TAUS, parse_taus, sweep_tau
from adaponder.evaluation.halting import hardest_tokens, nll_by_exit_pass
from adaponder.data.tokenizer import as_tokenizer
from adaponder.evaluation.perplexity import load_all, score_documents, summarize, summarize_by_source
from adaponder.evaluation.pruning import FIXED_RULES
from adaponder.evaluation.report import (DEFAULT_MAX_TOKENS, HELDOUT_ENV, _eval_data_dir, _jsonable, default_data,
                                         expand_tasks, iso_flops, run_lm_eval, task_manager, unknown_tasks,
                                         write_markdown)
from adaponder.evaluation.settings import load_for_eval, settings_of
from adaponder.evaluation.token_dump import write_token_dump


def build_parser() -> argparse.ArgumentParser:
    p = checkpoint_command("adaponder-report", description(report.__doc__, __doc__),
                           "a saved AdaPonder checkpoint folder (with its tokenizer)")
    p.add_argument("--out", required=True, help="output folder")
    add_data_args(p, required=False, default_data=f"${HELDOUT_ENV}, e.g. WikiText-2's wiki.test.tokens",
                  default_max_tokens=DEFAULT_MAX_TOKENS)
    g = p.add_argument_group("recurrence settings (pinned and printed)")
    g.add_argument("--passes", type=int, default=None, help="K (default: the checkpoint's)")
    g.add_argument("--tau", "--halting-threshold", dest="tau", type=float, default=None,
                   help="τ (default: 1e-4)")
    g.add_argument("--seed", type=int, default=0, help="seed of fixed pruning and lm-eval")
    g.add_argument("--dtype", default="float32")
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    g = p.add_argument_group("analyses")
    g.add_argument("--taus", default=None, help=f"τ dial values (default {','.join(map(str, DEFAULT_TAUS))})")
    g.add_argument("--no-dial", action="store_true", help="skip the τ sweep")
    g.add_argument("--no-iso-flops", action="store_true", help="skip the fixed-pruning control")
    g = p.add_argument_group("lm-eval")
    g.add_argument("--tasks", default=None,
                   help="comma-separated tasks or groups (default: adaponder_suite, + hellaswag if its file exists)")
    g.add_argument("--no-lm-eval", action="store_true", help="skip lm-eval")
    g.add_argument("--limit", type=float, default=None, help="documents per task (lm-eval --limit)")
    g.add_argument("--num-fewshot", default="0,5", help="comma-separated shot counts (default 0,5)")
    g.add_argument("--lm-eval-batch-size", type=int, default=8)
    g.add_argument("--include-path", default=None, help="lm-eval task folder (default: the repo's eval/tasks)")
    g.add_argument("--bootstrap-iters", type=int, default=1000, help="bootstrap iterations for stderr (lm-eval)")
    return p


def _checked_tasks(args):
    """``(tasks, task manager)`` of the lm-eval part, checked before any scoring (a misspelt task fails now, not
    after an hour); ``(None, None)`` with ``--no-lm-eval``."""
    if args.no_lm_eval:
        return None, None
    tasks = expand_tasks(args.tasks)
    if _eval_data_dir() is None and any(t.startswith("adaponder_") for t in tasks):
        raise SystemExit("the adaponder_* lm-eval tasks read the benchmarks' original files: set "
                         "ADAPONDER_EVAL_DATA=/path (see eval/tasks/README.md), name official lm-eval tasks "
                         "(--tasks lambada_openai,piqa,... download their datasets), or pass --no-lm-eval")
    tm = task_manager(args.include_path)
    unknown = unknown_tasks(tasks, tm)
    if unknown:
        raise SystemExit(f"unknown lm-eval task(s): {', '.join(unknown)} (not in lm-eval's registry nor in "
                         f"{args.include_path or 'eval/tasks'})")
    return tasks, tm


def _halting_controls(args, model, docs, score_kw: dict, ctx: dict, out: Path) -> None:
    """The iso-FLOPs control (fixed pruning at the learned mean exit pass) and the τ dial for a gated model, with
    their plots, into ``ctx``; for a model without gates, the note that says why they do not apply."""
    learned, settings, files = ctx["learned"], ctx["settings"], ctx["files"]
    K = model.config.num_passes
    gated = model.config.gated and K > 1
    hists, points = {"learned": learned["exit_histogram"]}, {}
    if gated and not args.no_iso_flops:
        target = learned["mean_exit"]
        print(f"[adaponder-report] iso-FLOPs control at mean exit pass {target:.4f}", flush=True)
        iso = iso_flops(model, docs, score_kw, target, args.seed)
        learned["_full_flops"] = iso["no halting"]["flops"]
        ctx.update(iso=iso, target=target)
        hists.update({rule: iso[rule]["exit_histogram"] for rule in FIXED_RULES})
        points = {k: iso[k] for k in (*FIXED_RULES, "no halting", "first pass only")}
    plots.exit_histogram_png(hists, out / "exit_histogram.png",
                             title="Exit-pass histogram" + (" at equal mean exit pass" if len(hists) > 1 else ""))
    files.append("exit_histogram.png")
    if gated and not args.no_dial:
        taus = parse_taus(args.taus) if args.taus else sorted(set(DEFAULT_TAUS) | {settings.tau})
        print(f"[adaponder-report] τ dial over {len(taus)} values", flush=True)
        ctx["dial"] = sweep_tau(model, docs, taus, **score_kw)
        plots.ppl_vs_flops_png(ctx["dial"], out / "ppl_vs_flops.png", points=points)
        files.append("ppl_vs_flops.png")
    elif not gated:
        ctx["no_gates_note"] = (f"Mode `{model.config.mode}` with K = {K} has no gates: every token runs all passes, "
                                "so the iso-FLOPs control and the τ dial do not apply.")


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.taus:
        parse_taus(args.taus)  # a bad list is named before anything loads
    if not args.no_lm_eval:
        check_limit(args.limit)  # (lm-eval reads 0 as every document)
    if args.max_tokens is None:  # sixteen re-scorings (iso-FLOPs, τ dial) of a whole corpus take hours on a CPU
        args.max_tokens = DEFAULT_MAX_TOKENS
    elif args.max_tokens <= 0:
        args.max_tokens = None
    t_start = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = args.data or default_data()
    if not data:
        raise SystemExit(f"no held-out data: pass --data FILE/FOLDER (text files or a prepared data folder) or set "
                         f"${HELDOUT_ENV}")
    tasks, tm = _checked_tasks(args)

    args.checkpoint = checkpoint_folder(args)
    model, tok = load_for_eval(args.checkpoint, passes=args.passes, dtype=args.dtype, device=args.device)
    settings = settings_of(model, args.checkpoint, tau=args.tau)
    print(settings.banner(), flush=True)
    (out / "settings.json").write_text(json.dumps(settings.as_dict(), indent=2))
    K = model.config.num_passes
    gated = model.config.gated and K > 1
    context = int(model.config.max_position_embeddings)

    codec = as_tokenizer(tok)
    docs = load_all(data, tok, args.max_tokens, args.max_tokens_per_doc, args.split, args.packing, args.window)
    score_kw = dict(window=args.window, stride=args.stride, batch_size=args.batch_size, eod_id=codec.eod_id,
                    pad_id=codec.pad_id)

    print(f"[adaponder-report] scoring {sum(len(d) for d in docs)} tokens in {len(docs)} documents", flush=True)
    scores = score_documents(model, docs, settings=settings.run_settings(model), **score_kw)
    window, stride = scores.meta["window"], scores.meta["stride"]
    by_source = summarize_by_source(scores, docs, model)
    learned = summarize(scores, docs, model)
    learned["_full_flops"] = None
    files = ["report.md", "results.json", "settings.json"]
    ctx = {"settings": settings, "data": data, "max_tokens": args.max_tokens, "window": window, "stride": stride,
           "seed": args.seed, "context": context, "by_source": by_source, "learned": learned, "files": files,
           "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
           "command": "adaponder-report " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                else sys.argv[1:]))}

    dump = out / "tokens.tsv"
    write_token_dump(scores, tok, dump, docs)
    files.append(dump.name)
    halting = nll_by_exit_pass(scores)
    ctx.update(halting=halting, dump=dump.name, hardest=hardest_tokens(scores, tok, 8) if gated else None)
    plots.nll_by_exit_png(halting, out / "nll_by_exit_pass.png")
    files.append("nll_by_exit_pass.png")
    _halting_controls(args, model, docs, score_kw, ctx, out)

    if not args.no_lm_eval:
        shots = [int(s) for s in str(args.num_fewshot).split(",") if s.strip()]
        limit = args.limit
        if limit is not None and limit >= 1:
            limit = int(limit)
        del model
        ctx.update(shots=shots, limit=limit,
                   lm_eval=run_lm_eval(args.checkpoint, settings, tasks, shots, limit,
                                       args.lm_eval_batch_size, args.include_path, args.seed,
                                       args.bootstrap_iters, tm=tm))

    ctx["seconds"] = time.time() - t_start
    write_markdown(out / "report.md", ctx)
    results = {k: v for k, v in ctx.items() if k not in ("settings", "files")}
    results["settings"] = settings.as_dict()
    (out / "results.json").write_text(json.dumps(_jsonable(results), indent=2, default=str))
    print(f"[adaponder-report] wrote {out / 'report.md'} ({ctx['seconds']:.0f} s)", flush=True)
    failed = [f"{r['task']} {r['num_fewshot']}-shot" for r in ctx.get("lm_eval") or [] if "error" in r]
    if failed:
        print(f"[adaponder-report] error: {len(failed)} lm-eval run(s) could not run (data missing): "
              f"{', '.join(failed)}; see report.md", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
