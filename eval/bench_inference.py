"""Inference benchmark: KV reuse turns the gates' FLOP saving into wall-clock (issue 5, A15–A17).

At Pythia-70M shape (random weights, fp32, CPU by default), with the gates calibrated so that 0%, 25% and
50% of token-passes are skipped, it measures side by side in one run:

  (a) ``cache+reuse``  — the AdaPonder cache: halted tokens reuse their exit-pass K/V, later passes compute
                         only active tokens (A15, A16);
  (b) ``halting off``  — the same weights with every gate open (all K passes, same cached code path);
  (c) ``no-cache``     — recompute the whole sequence K times for every new token, as PonderLM's public
                         code does (decode only; its prefill equals (b) without writing a cache).

and prints prefill and decode tokens/s, the FLOP saving of (a) over (b) from the realised exit passes
(``model.flops_per_token``) and the wall-clock saving, with their ratio.

    python eval/bench_inference.py                       # full run, ~3 min on 2 cores
    python eval/bench_inference.py --context 128 --quick # smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from adaponder.modeling import AdaPonderForCausalLM, pythia_config  # noqa: E402


def per_gate_share(saving: float, passes: int) -> float:
    """The share h of still-active tokens each gate halts so that mean D = K·(1 − saving)."""
    if saving <= 0:
        return 0.0
    target = passes * (1 - saving)

    def mean_d(h):
        return sum((1 - h) ** i for i in range(passes))  # E[D] = Σ_{i<K} P(D > i)

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_d(mid) > target else (lo, mid)
    return (lo + hi) / 2


@torch.no_grad()
def calibrate(model: AdaPonderForCausalLM, ids: torch.Tensor, saving: float) -> None:
    """Gate biases chosen so that the token-pass saving on ``ids`` is ``saving`` (quantiles of the gate
    logits, gate by gate, since halting compounds)."""
    tau = model.config.halting_threshold
    target = math.log(tau / (1 - tau))
    share = per_gate_share(saving, model.config.passes)
    for i, gate in enumerate(model.gates):
        if share == 0:
            gate.fc_out.bias.fill_(50.0)
            continue
        seen = []
        hook = gate.fc_out.register_forward_hook(lambda m, a, out: seen.append(out.squeeze(-1).reshape(-1)))
        model(ids, use_cache=False)
        hook.remove()
        pre = seen[0] - gate.fc_out.bias
        gate.fc_out.bias.fill_(float(target - torch.quantile(pre.float().cpu(), share)))


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.no_grad()
def decode_cached(model, prompt, new_tokens):
    """Greedy decoding with the PonderCache; returns (seconds for the decode steps only, exit passes)."""
    out = model(prompt[:, :8], use_cache=True)  # warm-up of the decode path
    for _ in range(2):
        out = model(out.logits[:, -1:].argmax(-1), cache=out.cache, use_cache=True)
    out = model(prompt, use_cache=True)
    cache, nxt = out.cache, out.logits[:, -1:].argmax(-1)
    exits = []
    _sync()
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        out = model(nxt, cache=cache, use_cache=True)
        cache, nxt = out.cache, out.logits[:, -1:].argmax(-1)
        exits.append(out.exit_pass)
    _sync()
    return time.perf_counter() - t0, torch.cat(exits, 1)


@torch.no_grad()
def decode_recompute(model, prompt, new_tokens):
    """PonderLM-style: every new token re-runs the whole sequence through all K passes, no cache."""
    seq = prompt
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        nxt = model(seq, use_cache=False).logits[:, -1:].argmax(-1)
        seq = torch.cat([seq, nxt], 1)
    return time.perf_counter() - t0


@torch.no_grad()
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="70m")
    ap.add_argument("--context", type=int, default=512, help="prompt length (decoding context)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--recompute-tokens", type=int, default=3, help="tokens timed for the no-cache reference")
    ap.add_argument("--savings", default="0,0.25,0.5")
    ap.add_argument("--batch", type=int, default=1, help="decode batch size")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    ap.add_argument("--quick", action="store_true", help="fewer tokens and repeats (smoke test)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.new_tokens, args.recompute_tokens, args.repeats = 8, 1, 1
    torch.manual_seed(0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model = AdaPonderForCausalLM(pythia_config(args.size, mode="adaponder")).to(args.device, dtype).eval()
    K = model.config.passes
    gen = torch.Generator().manual_seed(0)
    calib = torch.randint(2, model.config.vocab_size, (4, args.context), generator=gen).to(args.device)
    prompt = torch.randint(2, model.config.vocab_size, (args.batch, args.context), generator=gen).to(args.device)
    prefill_ids = prompt[:1]
    print(f"AdaPonder inference benchmark: Pythia-{args.size} shape, K={K}, {args.dtype} on {args.device}, "
          f"{torch.get_num_threads()} threads, "
          f"context {args.context}, decode batch {args.batch}, {args.new_tokens} new tokens")

    off_state = None
    rows = []
    for saving in [float(s) for s in args.savings.split(",")]:
        calibrate(model, calib, saving)
        # (a) cache + reuse
        t_pre_a = timed(lambda: model(prefill_ids, use_cache=True), args.repeats)
        exit_pre = model(prefill_ids, use_cache=True).exit_pass
        t_dec_a, exit_dec = decode_cached(model, prompt, args.new_tokens)
        # (b) the same weights, halting off
        gates = [g.fc_out.bias.clone() for g in model.gates]
        for g in model.gates:
            g.fc_out.bias.data.fill_(50.0)
        if off_state is None:
            t_pre_b = timed(lambda: model(prefill_ids, use_cache=True), args.repeats)
            t_dec_b, _ = decode_cached(model, prompt, args.new_tokens)
            t_rec = decode_recompute(model, prompt[:1], args.recompute_tokens) / args.recompute_tokens
            off_state = (t_pre_b, t_dec_b, t_rec)
        t_pre_b, t_dec_b, t_rec = off_state
        for g, b in zip(model.gates, gates):
            g.fc_out.bias.data.copy_(b)

        f_pre_a = model.flops_per_token(exit_pre, context=args.context)["total"]
        f_pre_b = model.flops_per_token(None, context=args.context)["total"]
        f_dec_a = model.flops_per_token(exit_dec, context=args.context)["total"]
        n_pre, n_dec = args.context, args.new_tokens * args.batch
        row = {
            "target_saving": saving,
            "prefill_mean_D": exit_pre.float().mean().item(),
            "decode_mean_D": exit_dec.float().mean().item(),
            "prefill_tok_s": {"cache+reuse": n_pre / t_pre_a, "halting off": n_pre / t_pre_b},
            "decode_tok_s": {"cache+reuse": n_dec / t_dec_a, "halting off": n_dec / t_dec_b,
                             "no-cache recompute": 1 / t_rec},
            "prefill_flop_saving": 1 - f_pre_a / f_pre_b,
            "prefill_wall_saving": 1 - t_pre_a / t_pre_b,
            "decode_flop_saving": 1 - f_dec_a / f_pre_b,
            "decode_wall_saving": 1 - t_dec_a / t_dec_b,
            "cached_vs_recompute": (n_dec / t_dec_a) / (args.batch / t_rec) if args.batch == 1 else None,
        }
        rows.append(row)

    print()
    hdr = (f"{'saving':>7} {'D pre':>6} {'D dec':>6} | {'prefill tok/s a':>15} {'b':>8} | {'decode tok/s a':>14} "
           f"{'b':>8} {'c':>8} | {'a/c':>6} | {'pre FLOP↓':>9} {'wall↓':>6} {'ratio':>5} | "
           f"{'dec FLOP↓':>9} {'wall↓':>6} {'ratio':>5}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        pr = r["prefill_wall_saving"] / r["prefill_flop_saving"] if r["prefill_flop_saving"] > 1e-3 else float("nan")
        dr = r["decode_wall_saving"] / r["decode_flop_saving"] if r["decode_flop_saving"] > 1e-3 else float("nan")
        ac = r["cached_vs_recompute"]
        print(f"{r['target_saving']:>7.2f} {r['prefill_mean_D']:>6.2f} {r['decode_mean_D']:>6.2f} | "
              f"{r['prefill_tok_s']['cache+reuse']:>15.1f} {r['prefill_tok_s']['halting off']:>8.1f} | "
              f"{r['decode_tok_s']['cache+reuse']:>14.1f} {r['decode_tok_s']['halting off']:>8.1f} "
              f"{r['decode_tok_s']['no-cache recompute']:>8.2f} | {(ac or float('nan')):>5.0f}x | "
              f"{r['prefill_flop_saving']:>9.1%} {r['prefill_wall_saving']:>6.1%} {pr:>5.2f} | "
              f"{r['decode_flop_saving']:>9.1%} {r['decode_wall_saving']:>6.1%} {dr:>5.2f}")
    print("\n(a) cache with KV reuse, (b) same model with halting off, (c) no-cache recompute (PonderLM-style);"
          "\nratio = wall-clock saving / FLOP saving (target ≥ 0.8); a/c = cached decode speed-up over (c)"
          " (target ≥ 20x at 512 context).")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
