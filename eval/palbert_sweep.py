#!/usr/bin/env python
"""PALBERT-mode fine-tunes on SST-2 and RTE over several seeds.

For each task and seed it runs :func:`adaponder.palbert.finetune.run_finetune` (what
``launch/finetune_glue.py`` runs) and then summarises across seeds:

* acceptance 3: every run completes and its table lists every exit rule; on SST-2 the dev accuracy (Q-exit)
  is above the majority-class rate, and Q-exit's accuracy averaged over the seeds is at least sampling's;
* acceptance 4: time per example with Q-exit falls with the mean exit pass — measured speed-up over
  always-last divided by the ideal N / mean exit pass is >= 0.8 at batch 32.

Writes ``<out>/<task>-s<seed>/results.{json,md}`` and ``<out>/summary.{json,md}``. Each run continues from
its own checkpoints (``--resume auto``), so a sweep stopped by SIGTERM/Ctrl-C picks up where it was::

    python eval/palbert_sweep.py --out runs/palbert_sweep            # defaults below: ~1 h on 2 CPU cores
    python eval/palbert_sweep.py --tasks sst2 --seeds 0 --set train.max_examples=1000   # a quick look

The defaults are the recipe measured in the report: a ``tiny`` core (d = 128, 2 layers, randomly
initialised unless ``--init`` names a checkpoint) with loop feedback, N = 4 exits, λ_p = 0.3 so that the
prior's Q-exit point lies inside the N passes (with λ_p = 0.1 and N = 4 the prior puts 73% on the last pass
and every example exits there), KL(p ‖ p_G) (the papers' direction; it let exits spread over passes 2–3
where KL(p_G ‖ p) kept every example at pass 2), β = 0.5, and the learning rates below. Timing uses one
thread, which is the stable setting on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from adaponder.palbert.pondernet import METHODS  # noqa: E402

# The recipe (on top of configs/glue/<task>.yaml); --set overrides any of it.
COMMON = [
    "model.core_mode=loop",
    "model.passes=4",
    "loss.lambda_p=0.3",
    "loss.beta=0.5",
    "loss.kl_direction=p_to_prior",
    "train.lr=5e-4",
    "train.lambda_lr=1e-3",
    "train.threads=1",
    "train.log_every=50",
    "timing.rules=[q, sample, pabee, last]",
    "timing.repeats=3",
    "timing.max_examples=256",
    "timing.threads=1",
]
PER_TASK = {
    "sst2": ["train.max_examples=4000", "train.epochs=3", "train.eval_every=63"],
    "rte": ["train.epochs=3", "train.eval_every=39"],
}


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _std(xs):
    xs = [x for x in xs if x is not None]
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def summarise(task: str, runs: list[dict]) -> dict:
    main = runs[0]["main_metric"]
    rules = list(runs[0]["dev"]["rules"])
    method = runs[0]["method"]
    out = {"task": task, "method": method, "main_metric": main, "seeds": [r["seed"] for r in runs], "rules": {},
           "timing": {}}
    for rule in rules:
        vals = [r["dev"]["rules"][rule]["main"] for r in runs]
        exits = [r["dev"]["rules"][rule]["mean_exit_pass"] for r in runs]
        out["rules"][rule] = {"main_mean": _mean(vals), "main_std": _std(vals), "per_seed": vals,
                              "mean_exit_pass": _mean(exits), "speedup": runs[0]["num_passes"] / _mean(exits),
                              "exit_histograms": [r["dev"]["rules"][rule]["exit_histogram"] for r in runs]}
    for bk in [k for k in (runs[0].get("timing") or {}) if k.startswith("batch_")]:
        out["timing"][bk] = {}
        for rule, t in runs[0]["timing"][bk].items():
            get = lambda key: [r["timing"][bk][rule][key] for r in runs]  # noqa: E731
            out["timing"][bk][rule] = {"sec_per_example": _mean(get("sec_per_example")),
                                       "mean_exit_pass": _mean(get("mean_exit_pass")),
                                       "measured_speedup": _mean(get("measured_speedup")),
                                       "ideal_speedup": _mean(get("ideal_speedup")),
                                       "ratio_to_ideal": _mean(get("ratio_to_ideal")),
                                       "ratio_to_ideal_per_seed": get("ratio_to_ideal")}
    maj = runs[0].get("majority_baseline")
    out["majority"] = maj[main] if maj else None
    expected = {"pabee", "last"} if method == "pabee" else {"q", "sample", "expectation", "last", "pabee"}
    checks = {"all_rules_listed": all(set(r["dev"]["rules"]) >= expected for r in runs)}
    first = "pabee" if method == "pabee" else "q"
    if maj:
        checks[f"{first}_above_majority_every_seed"] = all(r["dev"]["rules"][first]["main"] > maj[main]
                                                           for r in runs)
    if "q" in out["rules"] and "sample" in out["rules"]:
        checks["q_mean_ge_sampling_mean"] = out["rules"]["q"]["main_mean"] >= out["rules"]["sample"]["main_mean"]
    b32 = out["timing"].get("batch_32", {}).get(first)
    if b32:
        checks[f"{first}_ratio_to_ideal_ge_0.8_at_batch_32"] = b32["ratio_to_ideal"] >= 0.8
    out["checks"] = checks
    return out


def summary_markdown(summaries: list[dict]) -> str:
    names = {"q": "Q-exit", "sample": "sampling", "expectation": "expectation", "last": "always-last",
             "pabee": "PABEE"}
    lines = ["# PALBERT-mode sweep (eval/palbert_sweep.py)", ""]
    for s in summaries:
        lines += [f"## {s['task']} ({s['method']}) — dev {s['main_metric']}, mean ± std over seeds {s['seeds']}"
                  + (f" (majority class {s['majority']:.4f})" if s["majority"] is not None else ""), ""]
        bks = list(s["timing"])
        head = ["exit rule", s["main_metric"], "per seed", "mean exit pass", "speed-up N/mean"]
        for bk in bks:
            b = bk.split("_")[1]
            head += [f"ms/ex @{b}", f"measured speed-up @{b}", f"ratio to ideal @{b}"]
        lines += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
        for rule, st in s["rules"].items():
            row = [names[rule], f"{st['main_mean']:.4f} ± {st['main_std']:.4f}",
                   ", ".join(f"{v:.4f}" for v in st["per_seed"]), f"{st['mean_exit_pass']:.2f}",
                   f"{st['speedup']:.2f}"]
            for bk in bks:
                t = s["timing"][bk].get(rule)
                # a measured speed-up above the ideal N / mean exit pass is noise, said so next to it
                noise = " (above ideal: timing noise)" if t and t["measured_speedup"] > t["ideal_speedup"] else ""
                row += ["—"] * 3 if t is None else [f"{1000 * t['sec_per_example']:.3f}",
                                                    f"{t['measured_speedup']:.2f}{noise}", f"{t['ratio_to_ideal']:.2f}"]
            lines.append("| " + " | ".join(row) + " |")
        lines += ["", "checks: " + ", ".join(f"{k} = {v}" for k, v in s["checks"].items()), ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "runs" / "palbert_sweep"))
    ap.add_argument("--tasks", nargs="+", default=["sst2", "rte"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", default=["palbert"], choices=METHODS,
                    help="PALBERT and/or its baselines (PonderNet: Lambda on c_i only; PABEE: a head per pass)")
    ap.add_argument("--init", default="tiny-random")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--reuse", action="store_true", help="skip runs whose results.json is complete")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as finetune_glue: nothing tokenises in parallel

    from adaponder.palbert.config import load_finetune_config
    from adaponder.palbert.finetune import run_finetune
    from adaponder.train.stopping import TrainingStopped

    out = Path(args.out)
    summaries = []
    for task in args.tasks:
        for method in args.methods:
            runs = []
            for seed in args.seeds:
                run_dir = out / (f"{task}-s{seed}" if method == "palbert" else f"{task}-{method}-s{seed}")
                if args.reuse and (run_dir / "results.json").is_file():
                    done = json.loads((run_dir / "results.json").read_text())
                    if done.get("complete", True):
                        runs.append(done)
                        continue
                sets = [*COMMON, *PER_TASK.get(task, []), f"model.method={method}", f"train.seed={seed}",
                        *args.overrides]
                cfg = load_finetune_config(REPO / "configs" / "glue" / f"{task}.yaml", sets)
                try:
                    runs.append(run_finetune(cfg, init=args.init, data_dir=args.data_dir, output=run_dir,
                                             resume="auto"))
                except TrainingStopped as stop:
                    print(stop, file=sys.stderr)
                    return stop.exit_code
            summaries.append(summarise(task, runs))
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n", encoding="utf-8")
    md = summary_markdown(summaries)
    (out / "summary.md").write_text(md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
