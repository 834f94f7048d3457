"""lm-eval scoring throughput with halting on vs off, side by side in one run.

One checkpoint scores the same local lm-eval tasks (``eval/tasks``, data under ``ADAPONDER_EVAL_DATA``) through
the ``adaponder`` lm-eval model (what ``adaponder-eval`` runs) twice:

  on   the checkpoint's own τ: the gates halt tokens, compaction computes only active ones (A16);
  off  τ = 1e-30: no gate value falls below it, so every token runs all K passes — same weights, same code.

and once more through lm-eval's stock ``hf`` model (``lm_eval --model hf``, ``trust_remote_code``) with the
checkpoint's τ. It prints the wall time of each run (all of lm-eval included, and the model's forward calls
alone), the realised FLOPs per scored-request token of on and off (A17, from the exit passes the ``adaponder``
model counts), the FLOP saving against the wall-clock saving, and whether the ``adaponder`` run's metrics are
exactly those of ``hf``.

Without ``--checkpoint`` the script builds one: a Pythia shape (``--size``) with random weights whose gates are
calibrated to skip ``--skip`` of the token-passes on the bundled corpus, saved with the bundled tokenizer.

    ADAPONDER_EVAL_DATA=/path/to/eval python eval/bench_lm_eval.py                  # 70M shape, 50 % skipped
    ADAPONDER_EVAL_DATA=/path/to/eval python eval/bench_lm_eval.py --checkpoint runs/demo/hf
    ADAPONDER_EVAL_DATA=/path/to/eval python eval/bench_lm_eval.py --size tiny --limit 8 --tasks \\
        adaponder_arc_easy --batch-size 4                                                 # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "eval"))

OFF_TAU = 1e-30


def build_checkpoint(size: str, skip: float, out: Path, context: int = 256, seed: int = 0) -> Path:
    """A random-weight Pythia-shape checkpoint whose gates skip ``skip`` of the token-passes on the bundled
    corpus, with the bundled tokenizer."""
    from bench_inference import calibrate

    from adaponder.data import bundled_corpus_files
    from adaponder.data.tokenizer import load_tokenizer
    from adaponder.modeling import AdaPonderForCausalLM, pythia_config
    from adaponder.train.export import save_hf

    torch.manual_seed(seed)
    model = AdaPonderForCausalLM(pythia_config(size, mode="adaponder")).eval()
    tok = load_tokenizer(None)
    import gzip

    text = gzip.decompress(bundled_corpus_files()[0].read_bytes()).decode("utf-8")[20_000:200_000]
    ids = torch.tensor(tok.encode(text)[: 8 * context]).reshape(8, context)
    calibrate(model, ids, skip)
    save_hf(model, None, out)
    return out


def _metrics(results: dict) -> dict[str, dict[str, float]]:
    return {task: {k: v for k, v in r.items()
                   if isinstance(v, (int, float)) and "stderr" not in k and k not in ("alias", "sample_len")}
            for task, r in results["results"].items()}


class ForwardTimer:
    """Wall time spent inside the model's forward calls (lm-eval's own work excluded)."""

    def __init__(self, model):
        self.seconds = 0.0
        self._t0 = None
        model.register_forward_pre_hook(self._start)
        model.register_forward_hook(self._stop)

    def _start(self, module, args):
        self._t0 = time.perf_counter()

    def _stop(self, module, args, output):
        self.seconds += time.perf_counter() - self._t0


def run(model_name: str, model_args: str | None, lm, args, task_manager) -> tuple[dict, float]:
    from lm_eval import simple_evaluate

    t0 = time.perf_counter()
    res = simple_evaluate(model=lm if lm is not None else model_name, model_args=model_args, tasks=args.tasks,
                          limit=args.limit, num_fewshot=args.num_fewshot, batch_size=args.batch_size,
                          device=args.device, task_manager=task_manager, random_seed=0, numpy_random_seed=0,
                          torch_random_seed=0, fewshot_random_seed=0, bootstrap_iters=0)
    return res, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, help="a saved AdaPonder checkpoint (default: build one)")
    ap.add_argument("--size", default="70m", help="shape of the built checkpoint (70m, 160m, ..., tiny)")
    ap.add_argument("--skip", type=float, default=0.5, help="share of token-passes its gates skip (built one)")
    ap.add_argument("--tasks", default="adaponder_arc_easy,adaponder_piqa,adaponder_lambada_openai",
                    help="comma-separated lm-eval tasks (local adaponder_* tasks)")
    ap.add_argument("--limit", type=int, default=100, help="documents per task")
    ap.add_argument("--num-fewshot", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=1, help="on/off runs, interleaved; the fastest of each counts")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    from adaponder.errors import require_checkpoint
    from adaponder.arg_checks import exit_on_usage_error
    from adaponder.modeling.presets import checked_size

    with exit_on_usage_error():  # before lm-eval loads
        require_checkpoint(args.checkpoint, "--checkpoint") if args.checkpoint else checked_size(args.size, "--size")
    if args.threads:
        torch.set_num_threads(args.threads)
    if not os.environ.get("ADAPONDER_EVAL_DATA"):
        print("error: set ADAPONDER_EVAL_DATA to the local lm-eval data folder (e.g. ../shared/data/eval)",
              file=sys.stderr)
        return 2
    args.tasks = args.tasks.split(",")
    from lm_eval.tasks import TaskManager

    from adaponder.evaluation.lm_eval_model import AdaPonderLM

    task_manager = TaskManager(include_path=str(REPO / "eval" / "tasks"))
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.checkpoint or build_checkpoint(args.size, args.skip, Path(tmp) / "ckpt")
        print(f"lm-eval scoring benchmark: {ckpt}, tasks {','.join(args.tasks)}, limit {args.limit}, "
              f"{args.num_fewshot}-shot, batch {args.batch_size}, {torch.get_num_threads()} threads", flush=True)
        runs: dict[str, list] = {"on": [], "off": []}
        for _ in range(args.repeats):
            for name in ("on", "off"):
                lm = AdaPonderLM(checkpoint=str(ckpt), batch_size=args.batch_size, device=args.device,
                                 **({"tau": OFF_TAU} if name == "off" else {}))
                timer = ForwardTimer(lm.model)
                res, wall = run("adaponder", None, lm, args, task_manager)
                runs[name].append((wall, timer.seconds, res))
        hf, hf_wall = run("hf", f"pretrained={ckpt},trust_remote_code=True", None, args, task_manager)

    best = {k: min(v, key=lambda r: r[0]) for k, v in runs.items()}
    info = {k: best[k][2]["config"]["adaponder"]["input"] for k in best}
    flops = {k: info[k]["flops_per_token"]["total"] for k in info}
    flop_saving = 1 - flops["on"] / flops["off"]
    wall_saving = 1 - best["on"][0] / best["off"][0]
    fwd_saving = 1 - best["on"][1] / best["off"][1]
    on_metrics, hf_metrics = _metrics(best["on"][2]), _metrics(hf)
    identical = on_metrics == hf_metrics
    print()
    print(f"{'':>11} | {'wall s':>8} | {'forward s':>9} | {'tokens':>8} | {'mean D':>6} | {'GFLOP/token':>11}")
    for k in ("on", "off"):
        print(f"{'halting ' + k:>11} | {best[k][0]:>8.1f} | {best[k][1]:>9.1f} | {info[k]['tokens']:>8} | "
              f"{info[k]['mean_exit_pass']:>6.2f} | {flops[k] / 1e9:>11.3f}")
    print(f"{'hf':>11} | {hf_wall:>8.1f} |")
    print(f"\nFLOP saving {flop_saving:.1%}; wall-clock saving {wall_saving:.1%} (ratio "
          f"{wall_saving / flop_saving if flop_saving > 1e-3 else float('nan'):.2f}, target ≥ 0.8); forward-time "
          f"saving {fwd_saving:.1%} (ratio {fwd_saving / flop_saving if flop_saving > 1e-3 else float('nan'):.2f})")
    print(f"metrics of halting on (adaponder) == lm_eval --model hf: {'yes' if identical else 'NO'}")
    for task in sorted(on_metrics):
        for metric, value in sorted(on_metrics[task].items()):
            other = hf_metrics.get(task, {}).get(metric)
            off = _metrics(best["off"][2]).get(task, {}).get(metric)
            print(f"  {task} {metric}: on {value:.6g}  hf {other if other is None else f'{other:.6g}'}  "
                  f"off {off if off is None else f'{off:.6g}'}")
    if args.json:
        args.json.write_text(json.dumps({
            "checkpoint": str(args.checkpoint or f"built: {args.size}, skip {args.skip}"), "tasks": args.tasks,
            "limit": args.limit, "batch_size": args.batch_size, "threads": torch.get_num_threads(),
            "wall_s": {k: best[k][0] for k in best} | {"hf": hf_wall},
            "forward_s": {k: best[k][1] for k in best}, "input": info, "flop_saving": flop_saving,
            "wall_saving": wall_saving, "forward_saving": fwd_saving, "metrics": {"on": on_metrics, "hf": hf_metrics},
            "identical_to_hf": identical}, indent=2, default=float))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
