"""Training-step benchmark: AdaPonder vs PonderLM mode vs the naive PonderLM-style reference.

At Pythia-70M shape (random weights, seq 512 by default) it measures, side by side in one run, the
time, tokens/s and peak memory of a full training step (forward, backward, AdamW step) for

  naive       HF ``GPTNeoXForCausalLM`` run K times with the pondering feedback (what PonderLM's public
              code does: logits and softmax of every pass kept for backward);
  hf-1pass    plain HF GPT-NeoX, one pass (the MFU reference);
  ponderlm    ``AdaPonderForCausalLM`` in ``ponderlm`` mode;
  adaponder   ``AdaPonderForCausalLM`` in ``adaponder`` mode (gates open, λ·ponder loss included);
  ponderlm-keep, adaponder-keep  the same with ``RunSettings(recompute=False)`` (probabilities kept for backward
              instead of recomputed, as the naive code does: one head-sized product less per pondering
              pass, B×T×V memory per pass);

plus the matmul peak FLOP/s of this machine measured in the same run (before and after; the higher is
the MFU denominator), and prints ratios. For speed, all variants of a (dtype, batch) live in one process
and their steps are interleaved, so a shared machine's load changes hit every variant alike; the median
step after one warm-up round is reported. For memory, each variant runs alone in its own process, so the
peak is that process's high-water mark (RSS, or CUDA's max allocated) above the model + optimizer state.

    python eval/bench_train.py                          # the acceptance run (~25 min on 2 cores)
    python eval/bench_train.py --batches 1 --steps 1 --memory-batch 0   # quick look
    python eval/bench_train.py --compile                # adds torch.compile variants
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def sync(device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_peak(dtype: torch.dtype, device: str = "cpu", seconds: float = 3.0) -> float:
    """Sustained FLOP/s of a square matmul (the denominator of MFU on this machine): the best of three
    windows after a warm-up, so a momentary slowdown of a shared machine does not lower the peak and
    flatter the MFU."""
    n = 8192 if device.startswith("cuda") else 2048
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    best = 0.0
    for window in range(4):  # window 0 is the warm-up
        sync(device)
        count, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 3:
            a @ b
            count += 1
        sync(device)
        rate = 2 * n**3 * count / (time.perf_counter() - t0)
        if window:
            best = max(best, rate)
    return best


def build(variant: str, size: str, dtype: torch.dtype):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from adaponder.modeling import AdaPonderForCausalLM, ponder_loss, pythia_config, pythia_shape
    from adaponder.modeling.run_settings import RunSettings

    torch.manual_seed(0)
    if variant in ("naive", "hf-1pass"):
        shape = pythia_shape(size)
        cfg = GPTNeoXConfig(**{k: v for k, v in shape.items() if k not in ("rotary_pct", "rotary_emb_base")},
                            rope_parameters={"rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                             "rope_type": "default"})
        cfg._attn_implementation = "sdpa"
        model = GPTNeoXForCausalLM(cfg).to(dtype)
        K = pythia_config(size, mode="ponderlm").passes if variant == "naive" else 1
        alpha = pythia_config(size, mode="ponderlm").embedding_scale

        def step_loss(x, y):
            w_tilde = alpha * model.gpt_neox.embed_in.weight
            if K == 1:
                return model(input_ids=x).logits.float().flatten(0, 1), y
            E = w_tilde[x]
            for i in range(K):  # PonderLM's public code: the whole HF model, K times
                logits = model(inputs_embeds=E).logits
                if i < K - 1:
                    E = E + torch.softmax(logits.float(), -1).to(dtype) @ w_tilde
            return logits.float().flatten(0, 1), y

        def loss_fn(x, y):
            logits, y = step_loss(x, y)
            return torch.nn.functional.cross_entropy(logits, y.flatten())

        flops_model = AdaPonderForCausalLM(pythia_config(size, mode="ponderlm" if K > 1 else "vanilla",
                                                         **({} if K > 1 else {"passes": 1})))
        return model, loss_fn, flops_model
    mode = variant.split("+")[0]
    keep = mode.endswith("-keep")  # recompute=False: probabilities kept for backward
    model = AdaPonderForCausalLM(pythia_config(size, mode=mode.removesuffix("-keep"))).to(dtype)
    settings = RunSettings(recompute=not keep)

    def loss_fn(x, y):
        out = model(input_ids=x, shift_labels=y, use_cache=False, return_logits=False, settings=settings)
        loss = out.loss
        if out.gate_values is not None:
            loss = loss + 0.1 * ponder_loss(out.gate_values, out.gate_mask, 0.1)
        return loss

    return model, loss_fn, model


class _Setup:
    """One variant ready to train: model, optimizer (state materialised), a fixed batch, FLOPs per step."""

    def __init__(self, variant: str, size: str, dtype_name: str, batch: int, seq: int, compile_: bool, device: str):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        self.variant, self.dtype_name, self.batch, self.seq, self.device = variant, dtype_name, batch, seq, device
        self.model, loss_fn, flops_model = build(variant, size, dtype)
        self.model.to(device).train()
        self.loss_fn = torch.compile(loss_fn) if compile_ else loss_fn
        self.name = variant + ("+compile" if compile_ else "")
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01)
        for p in self.model.parameters():  # materialise grads and Adam state before measuring
            p.grad = torch.zeros_like(p)
        self.opt.step()
        g = torch.Generator().manual_seed(1)
        x = torch.randint(0, self.model.config.vocab_size, (batch, seq + 1), generator=g).to(device)
        self.inp, self.tgt = x[:, :-1], x[:, 1:]
        self.flops = flops_model.flops_per_token(None, context=seq, training=True)["total"] * batch * seq
        self.times: list[float] = []
        self.loss = float("nan")

    def step(self) -> float:
        t0 = time.perf_counter()
        loss = self.loss_fn(self.inp, self.tgt)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)
        sync(self.device)
        self.times.append(time.perf_counter() - t0)
        self.loss = float(loss.detach())
        return self.times[-1]

    def result(self, peak_bytes: float | None = None) -> dict:
        step = statistics.median(self.times[1:])  # the first step is a warm-up
        return {"variant": self.name, "dtype": self.dtype_name, "batch": self.batch, "seq": self.seq,
                "step_s": step, "step_times": self.times, "tokens_s": self.batch * self.seq / step,
                "flops_s": self.flops / step, "peak_mem_gb": None if peak_bytes is None else max(peak_bytes, 0) / 1e9,
                "loss": self.loss}


def worker(variant: str, size: str, dtype_name: str, batch: int, seq: int, steps: int, compile_: bool,
           device: str = "cpu") -> dict:
    """One variant alone in this process: its step time and peak memory (the process's high-water mark)."""
    setup = _Setup(variant, size, dtype_name, batch, seq, compile_, device)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else rss_bytes()
    for _ in range(steps + 1):
        setup.step()
    if cuda:
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return setup.result(peak)


def group_worker(variants: list[str], size: str, dtype_name: str, batch: int, seq: int, steps: int,
                 device: str = "cpu") -> list[dict]:
    """Several variants in one process, their steps interleaved (round r starts at variant r mod n), so a
    shared machine's slow and fast moments fall on every variant alike: the speed ratios compare like
    with like. (Peak memory needs one process per variant: :func:`worker`.)"""
    setups = [_Setup(v, size, dtype_name, batch, seq, False, device) for v in variants]
    for r in range(steps + 1):
        for i in range(len(setups)):
            setups[(r + i) % len(setups)].step()
    return [s.result() for s in setups]


def run_one(args, variant, dtype, batch, compile_=False) -> dict | None:
    cmd = [sys.executable, __file__, "--worker", variant, "--size", args.size, "--dtype", dtype, "--batch",
           str(batch), "--seq", str(args.seq), "--steps", str(args.steps), "--device", args.device]
    cmd += ["--compile"] if compile_ else []
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(f"  {variant} {dtype} b={batch}: FAILED\n{res.stderr[-2000:]}", file=sys.stderr)
        return None
    out = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"  {out['variant']:<18} {dtype} batch {batch}: {out['step_s']:.2f} s/step, {out['tokens_s']:.0f} tok/s, "
          f"peak +{out['peak_mem_gb']:.2f} GB", flush=True)
    return out


def run_group(args, variants, dtype, batch) -> list[dict]:
    cmd = [sys.executable, __file__, "--group", ",".join(variants), "--size", args.size, "--dtype", dtype,
           "--batch", str(batch), "--seq", str(args.seq), "--steps", str(args.steps), "--device", args.device]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        print(f"  {variants} {dtype} b={batch}: FAILED\n{res.stderr[-2000:]}", file=sys.stderr)
        return []
    outs = json.loads(res.stdout.strip().splitlines()[-1])
    for out in outs:
        print(f"  {out['variant']:<18} {dtype} batch {batch}: {out['step_s']:.2f} s/step, {out['tokens_s']:.0f} tok/s"
              f"  (steps {', '.join(f'{t:.2f}' for t in out['step_times'][1:])})", flush=True)
    return outs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="70m")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batches", default="1,4", help="batch sizes for the speed comparison")
    ap.add_argument("--memory-batch", type=int, default=8, help="batch for the memory comparison (0 = skip)")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--steps", type=int, default=3, help="measured steps (rounds) after one warm-up")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile'd adaponder/ponderlm steps")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--variants", default="naive,hf-1pass,ponderlm,adaponder,ponderlm-keep,adaponder-keep")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--group", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from adaponder.arg_checks import exit_on_usage_error
    from adaponder.modeling.presets import checked_size

    with exit_on_usage_error():
        checked_size(args.size, "--size")
    if args.group:
        print(json.dumps(group_worker(args.group.split(","), args.size, args.dtype, args.batch, args.seq, args.steps,
                                      args.device)))
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.size, args.dtype, args.batch, args.seq, args.steps, args.compile,
                                args.device)))
        return

    print(f"Training-step benchmark: Pythia-{args.size} shape, seq {args.seq}, {torch.get_num_threads()} threads")
    peaks = {d: matmul_peak({"fp32": torch.float32, "bf16": torch.bfloat16}[d], args.device)
             for d in args.dtypes.split(",")}
    for d, p in peaks.items():
        print(f"  matmul peak {d}: {p / 1e9:.1f} GFLOP/s")
    results = []
    for dtype in args.dtypes.split(","):
        for batch in [int(b) for b in args.batches.split(",")]:
            results += run_group(args, args.variants.split(","), dtype, batch)
            if args.compile:
                for variant in ("ponderlm", "adaponder"):
                    results.append(run_one(args, variant, dtype, batch, compile_=True))
    mem = []
    if args.memory_batch:
        for variant in ("naive", "ponderlm", "adaponder"):
            mem.append(run_one(args, variant, args.dtypes.split(",")[0], args.memory_batch))
    results = [r for r in results if r]
    # The peak again after the runs; the higher of the two is the MFU denominator (conservative).
    for d in peaks:
        again = matmul_peak({"fp32": torch.float32, "bf16": torch.bfloat16}[d], args.device)
        print(f"  matmul peak {d} after the runs: {again / 1e9:.1f} GFLOP/s")
        peaks[d] = max(peaks[d], again)

    print("\n== speed (step time ratios; targets: adaponder ≤ 1.10 × ponderlm, ponderlm ≤ 1.00 × naive) ==")
    print(f"{'dtype':<5} {'batch':>5} | {'naive s':>8} {'ponderlm s':>10} {'adaponder s':>11} | "
          f"{'ponderlm/naive':>14} {'adaponder/ponderlm':>18} | {'keep: ponderlm/naive':>20} "
          f"{'adaponder/ponderlm':>18} | {'MFU hf-1pass':>12} {'MFU adaponder':>13}")
    by = {(r["variant"], r["dtype"], r["batch"]): r for r in results}
    for dtype in args.dtypes.split(","):
        for batch in [int(b) for b in args.batches.split(",")]:
            n, p, a, h, k, ak = (by.get((v, dtype, batch)) for v in ("naive", "ponderlm", "adaponder", "hf-1pass",
                                                                     "ponderlm-keep", "adaponder-keep"))
            if not a:
                continue
            ratio = lambda x, y: f"{x['step_s'] / y['step_s']:.3f}" if x and y else "-"  # noqa: E731
            secs = lambda x: f"{x['step_s']:.2f}" if x else "-"  # noqa: E731
            mfu_h = f"{h['flops_s'] / peaks[dtype]:.1%}" if h else "-"
            print(f"{dtype:<5} {batch:>5} | {secs(n):>8} {secs(p):>10} {secs(a):>11} | "
                  f"{ratio(p, n):>14} {ratio(a, p):>18} | {ratio(k, n):>20} {ratio(ak, k):>18} | {mfu_h:>12} "
                  f"{a['flops_s'] / peaks[dtype]:>13.1%}")
            for v in ("ponderlm", "adaponder"):
                c = by.get((v + "+compile", dtype, batch))
                if c:
                    print(f"      {v}+compile: {c['step_s']:.2f} s/step ({c['step_s'] / by[(v, dtype, batch)]['step_s']:.3f}"
                          f" × eager)")
    mem = [m for m in mem if m]
    if mem:
        print(f"\n== peak memory of a training step, fp32, batch {args.memory_batch} × {args.seq}, no activation "
              f"checkpointing (target: adaponder ≤ 0.6 × naive) ==")
        ref = next((m for m in mem if m["variant"] == "naive"), None)
        for m in mem:
            ratio = f"{m['peak_mem_gb'] / ref['peak_mem_gb']:.2f} × naive" if ref else ""
            print(f"  {m['variant']:<10} +{m['peak_mem_gb']:.2f} GB  {ratio}  ({m['step_s']:.1f} s/step)")
    if args.json:
        args.json.write_text(json.dumps({"peaks": peaks, "speed": results, "memory": mem}, indent=2))


if __name__ == "__main__":
    main()
