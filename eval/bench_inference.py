"""Inference benchmark: does halting pay in wall-clock at every batch size? (A15–A17)

At a Pythia shape (random weights; CPU by default), with the gates calibrated so that 0 %, 25 % and 50 % of
token-passes are skipped, it measures side by side in one run, for every batch size and dtype:

  (a) ``cache+reuse``  — the AdaPonder cache: halted tokens reuse their exit-pass K/V, later passes compute only
                         still-active tokens (compaction, A15, A16). Decoding runs it two ways: depth-batched
                         (``DepthBatchedDecoder``: every row at its own pass, a halted row starts its next token
                         while others ponder) and lockstep (the cached ``forward``, one token per row per step);
  (b) ``halting off``  — the same weights with every gate open (all K passes, the same cached code paths);
                         (a) and (b) each decode with the faster of their two schedules, as a server would;
  (c) ``no-cache``     — batch 1 only: recompute the whole sequence K times for every new token, as PonderLM's
                         public code does.

For each row it prints prefill and decode tokens/s of (a) and (b), the FLOP saving of (a) over (b) from the
realised exit passes (``model.flops_per_token``) next to the wall-clock saving and their ratio, decode as a
fraction of the memory-bandwidth limit (bytes a decode step reads — the weights of every pass some token runs,
the K/V each active token attends to — over a GEMV's measured bandwidth), and the host synchronisations one
decode step makes (``.item()``/``bool()``/``nonzero``/boolean-mask indexing: the points where a GPU's queue
would drain). Every time is the best of ``--repeats`` runs (decodings: ``--decode-repeats``, default 4× as many:
they are short, and a decoding of 64 ticks lands in one fast or slow stretch of this machine as a whole), taken
round-robin over the gate settings.

    python eval/bench_inference.py                                  # the table of docs/benchmarks.md
    python eval/bench_inference.py --batches 1,8,32 --threads 4 --dtypes fp32
    python eval/bench_inference.py --context 64 --batches 1,2 --new-tokens 2 --repeats 1 --dtypes fp32  # smoke
    python eval/bench_inference.py --speculative --checkpoint CKPT ...   # self-speculative decoding: bench_speculative.py
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from adaponder.modeling import AdaPonderForCausalLM, pythia_config  # noqa: E402
from adaponder.generation.depth_batching import DepthBatchedDecoder  # noqa: E402
from adaponder.modeling.run_settings import DEFAULT_TAU  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# -- gate calibration -----------------------------------------------------------------------------------------
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
def calibrate(model: AdaPonderForCausalLM, ids: torch.Tensor, saving: float) -> list[torch.Tensor]:
    """Gate biases such that the token-pass saving on ``ids`` is ``saving`` (quantiles of the gate logits, gate
    by gate, since halting compounds). Returns the biases."""
    tau = DEFAULT_TAU  # the decoders below run with the default RunSettings
    target = math.log(tau / (1 - tau))
    share = per_gate_share(saving, model.config.passes)
    for gate in model.gates:
        if share == 0:
            gate.fc_out.bias.fill_(50.0)
            continue
        seen = []
        hook = gate.fc_out.register_forward_hook(lambda m, a, out: seen.append(out.squeeze(-1).reshape(-1)))
        model(ids, use_cache=False)
        hook.remove()
        pre = seen[0] - gate.fc_out.bias
        gate.fc_out.bias.fill_(float(target - torch.quantile(pre.float().cpu(), share)))
    return [g.fc_out.bias.detach().clone() for g in model.gates]


def set_gates(model, biases: list[torch.Tensor] | None) -> None:
    """Restore calibrated biases, or (None) open every gate: halting off."""
    for i, g in enumerate(model.gates):
        g.fc_out.bias.data.copy_(biases[i]) if biases is not None else g.fc_out.bias.data.fill_(50.0)


# -- measuring --------------------------------------------------------------------------------------------------
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


class HostSyncCounter(TorchDispatchMode):
    """Counts the ops that make the host wait for the device's values: scalar reads (``.item()``, ``bool()``,
    ``int()``), ``.tolist()``/``.numpy()``, device-to-host copies, ops with a data-dependent output shape, and
    indexing with a boolean mask (nonzero inside). Works on the CPU too, where none of them waits."""

    SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_consecutive", "unique_dim",
               "repeat_interleave", "masked_scatter"}

    def __init__(self):
        super().__init__()
        self.count = 0
        self._saved = {}

    def __enter__(self):
        for name in ("tolist", "numpy"):  # no dispatch on the CPU: count them at the Python level
            original = self._saved[name] = getattr(torch.Tensor, name)
            setattr(torch.Tensor, name, self._counting(original))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)

    def _counting(self, original):
        def wrapper(t, *args, **kwargs):
            self.count += 1
            return original(t, *args, **kwargs)
        return wrapper

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.SYNCING and not (name == "repeat_interleave" and kwargs and kwargs.get("output_size")):
            self.count += 1
        elif name in ("index", "index_put", "index_put_") and any(
                isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (args[1] or [])):
            self.count += 1
        elif name in ("_to_copy", "copy_") and self._to_host(name, args, kwargs or {}):
            self.count += 1
        return func(*args, **(kwargs or {}))

    @staticmethod
    def _to_host(name, args, kwargs) -> bool:
        """A device-to-host copy (``.cpu()``, ``.tolist()`` goes through ``_to_copy``)."""
        if name == "_to_copy":
            dst = kwargs.get("device")
            return dst is not None and torch.device(dst).type == "cpu" and args[0].device.type != "cpu"
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"


def gemv_bandwidth(dtype, device, mib: int = 256) -> float:
    """Bytes/s a matrix-vector product streams from memory: the best of five GEMVs over ``mib`` MiB of weights
    (larger than the caches)."""
    n = int(math.sqrt(mib * 2**20 / torch.finfo(dtype).bits * 8))
    w = torch.randn(n, n, device=device).to(dtype)
    x = torch.randn(n, device=device).to(dtype)
    torch.mv(w, x)
    best = float("inf")
    for _ in range(5):
        _sync(device)
        t0 = time.perf_counter()
        torch.mv(w, x)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return w.numel() * w.element_size() / best


def _byte_sizes(model) -> tuple[float, float, float, float]:
    """Bytes of the layer weights (one pass), of W_out (= of W_E), of one gate, and of one position's K/V in every
    layer."""
    cfg = model.config
    item = next(model.parameters()).element_size()
    counts = model.parameter_counts()
    return (counts["non_embedding"] * item, cfg.vocab_size * cfg.hidden_size * item,
            (counts["gates"] / max(len(model.gates), 1)) * item, cfg.num_hidden_layers * 2 * cfg.hidden_size * item)


def decode_bytes(model, exits: torch.Tensor, context: int) -> float:
    """Bytes read by the lockstep decode steps whose exit passes are ``exits`` [B, steps]: per step, the layer
    weights of every pass some row runs, the gates and the pondering product (W_out, W_E) wherever a row goes on,
    the head once, and each active row's K/V over the context."""
    cfg = model.config
    layers, head, gate, kv_row = _byte_sizes(model)
    total = 0.0
    for step in range(exits.shape[1]):
        d = exits[:, step]
        total += head  # the exit logits, once per step
        for i in range(1, cfg.num_passes + 1):
            rows = int((d >= i).sum())
            if rows == 0:
                break
            total += layers + rows * kv_row * (context + step + 1)
            if i < cfg.num_passes and cfg.gated:
                total += gate
            if i < cfg.num_passes and int((d > i).sum()):
                total += 2 * head  # z = W_out h and softmax(z)·W_E (A4)
    return total


def depth_bytes(model, out) -> float:
    """Bytes the ticks of a depth-batched decoding (``DepthBatchedOutput``) read: every tick the layer weights and
    W_out once (exit and pondering logits alike), W_E in the ticks that ran the pondering product, each gate run,
    and each row's K/V over the positions it attends."""
    layers, head, gate, kv_row = _byte_sizes(model)
    return out.ticks * (layers + head) + out.pondering_ticks * head + out.gate_runs * gate + out.attended * kv_row


def timed(fn, repeats: int, device) -> tuple[float, object]:
    """Best (fewest) seconds of ``repeats`` calls and the last result."""
    times, out = [], None
    for _ in range(repeats):
        out = None  # let the previous result go before the next call
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return min(times), out


@torch.no_grad()
def run_variants(model, prompt, variants: dict, new_tokens: int, repeats: int,
                 decode_repeats: int | None = None) -> dict:
    """Prefill ``prompt`` [B, T] and greedily decode ``new_tokens`` steps with the PonderCache, both schedules, for
    every gate setting in ``variants`` (name → biases for :func:`set_gates`; None = halting off). Every timing is the
    best of ``repeats`` runs taken round-robin: each repeat runs every variant once before the next begins, so that
    this machine's drift (identical work measured minutes apart has differed by up to 30 %) falls on all variants
    alike rather than on whichever ran in a slow minute; the order rotates from repeat to repeat. Decodings take
    ``decode_repeats`` (default ``repeats``) turns."""
    device = prompt.device
    warm = model(prompt[:, :8], use_cache=True)  # warm-up of both paths on a short prompt
    model(warm.logits[:, -1:].argmax(-1), cache=warm.cache, use_cache=True)
    # The prefill fills a cache in the depth-batched decoder's layout (keys transposed for its ticks included), with
    # room for both decodings below.
    decoder, K = DepthBatchedDecoder(model), model.config.num_passes
    capacity = prompt.shape[1] + new_tokens * K + 2
    best, res, pres = {}, {name: {} for name in variants}, {}

    def time_each(what: str, fns: dict, turn: int) -> dict:
        outs, names = {}, list(fns)
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            fn = fns[name]
            set_gates(model, variants[name])
            outs[name] = None  # let the previous result go before the next call
            t, outs[name] = timed(fn, 1, device)
            best[name, what] = min(best.get((name, what), float("inf")), t)
        return outs

    def prefill():
        pre = decoder.prefill(prompt, capacity)
        pre.output.logits = pre.output.logits[:, -1:].clone()  # the rest is not needed (and is B·T·V floats)
        return pre

    for turn in range(repeats):
        pres.clear()
        pres.update(time_each("prefill", {n: prefill for n in variants}, turn))
    for name, pre in pres.items():
        out = pre.output
        set_gates(model, variants[name])
        with HostSyncCounter() as counter:  # one lockstep step, counted (untimed) and taken back
            model(out.logits.argmax(-1), cache=out.cache, use_cache=True)
        out.cache.crop(-1)
        res[name].update(exit_prefill=out.exit_pass, syncs_per_step=counter.count)

    # Both decodings start from the prefill and write only positions after the prompt, each before reading them,
    # so they can take turns on one cache. Depth-batched decoding runs in steady state: as many ticks (stack runs) as
    # lockstep decoding with halting off makes in new_tokens steps (a server refills a finished row's slot; see
    # DepthBatchedDecoder.generate).
    def depth(name):
        return lambda: decoder.generate(prompt, new_tokens * K + 1, prefill=pres[name], max_ticks=new_tokens * K)

    def lockstep(name):
        def run():
            out = pres[name].output
            cache, nxt, exits = out.cache, out.logits.argmax(-1), []
            for _ in range(new_tokens):
                step = model(nxt, cache=cache, use_cache=True)
                nxt = step.logits[:, -1:].argmax(-1)
                exits.append(step.exit_pass)
            cache.crop(-new_tokens)  # back to where the next repeat starts
            return torch.cat(exits, 1)
        return run

    for turn in range(decode_repeats or repeats):
        depths = time_each("depth", {n: depth(n) for n in variants}, turn)
        locks = time_each("lockstep", {n: lockstep(n) for n in variants}, turn)
    for name, r in res.items():
        out = depths[name]
        exits = out.exit_pass[:, 1:]
        exits = exits[exits > 0]  # the tokens the ticks completed (the first came from the prefill)
        # What the window's work is worth in tokens: its token-passes over the mean exit pass of the tokens it
        # completed. Rows whose token is still in flight when the window ends (up to K-1 passes done) have done work
        # a server finishes in its next ticks; counting completed tokens only would charge it to the window (~D/2
        # passes a row: 2-3 % of 64 ticks at 25 % skipped; nothing with halting off, whose rows finish a token every
        # K ticks).
        r.update(prefill_s=best[name, "prefill"], decode_s=best[name, "lockstep"], exit_decode=locks[name],
                 depth_s=best[name, "depth"], exit_depth=exits, ticks=out.ticks,
                 depth_tokens=out.token_passes / exits.float().mean().item(), depth_bytes=depth_bytes(model, out))
    return res


@torch.no_grad()
def decode_recompute(model, prompt, new_tokens):
    """PonderLM-style: every new token re-runs the whole sequence through all K passes, no cache."""
    seq = prompt
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        nxt = model(seq, use_cache=False).logits[:, -1:].argmax(-1)
        seq = torch.cat([seq, nxt], 1)
    return (time.perf_counter() - t0) / new_tokens


def _saving(a: float, b: float) -> float:
    return 1 - a / b


@torch.no_grad()
def bench_dtype(args, dtype_name: str) -> list[dict]:
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = AdaPonderForCausalLM(pythia_config(args.size, mode="adaponder")).to(device, DTYPES[dtype_name]).eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    calib = torch.randint(2, vocab, (4, args.context), generator=gen).to(device)
    prompts = {b: torch.randint(2, vocab, (b, args.context), generator=gen).to(device) for b in args.batches}
    bandwidth = gemv_bandwidth(DTYPES[dtype_name], device)
    savings = [float(s) for s in args.savings.split(",")]
    biases = {s: calibrate(model, calib, s) for s in savings}
    f_off = model.flops_per_token(None, context=args.context)["total"]
    rows = []
    for batch in args.batches:
        res = run_variants(model, prompts[batch], {None: None, **biases}, args.new_tokens, args.repeats,
                           args.decode_repeats or 4 * args.repeats)
        off = res[None]
        rec = None
        if batch == 1 and args.recompute_tokens:
            set_gates(model, None)
            rec = decode_recompute(model, prompts[1], args.recompute_tokens)
        for s in savings:
            on = res[s]
            n_pre, n_dec = batch * args.context, batch * args.new_tokens
            f_pre = model.flops_per_token(on["exit_prefill"], context=args.context)["total"]
            f_dec = model.flops_per_token(on["exit_depth"], context=args.context)["total"]
            f_lock = model.flops_per_token(on["exit_decode"], context=args.context)["total"]
            bytes_on = decode_bytes(model, on["exit_decode"], args.context)
            bytes_off = decode_bytes(model, off["exit_decode"], args.context)
            limit, limit_off = n_dec * bandwidth / bytes_on, n_dec * bandwidth / bytes_off
            # per-token times: halting on and halting off each decode with the faster of their two schedules (a
            # server picks the one that suits its batch); the FLOP saving is that of the schedule picked
            t_depth, t_lock = on["depth_s"] / on["depth_tokens"], on["decode_s"] / n_dec
            t_on, f_on = (t_depth, f_dec) if t_depth <= t_lock else (t_lock, f_lock)
            best_off = min(off["decode_s"] / n_dec, off["depth_s"] / off["depth_tokens"])
            row = {
                "dtype": dtype_name, "batch": batch, "target_saving": s,
                "prefill_mean_D": on["exit_prefill"].float().mean().item(),
                "decode_mean_D": on["exit_depth"].float().mean().item(),
                "lockstep_mean_D": on["exit_decode"].float().mean().item(),
                "prefill_tok_s": {"cache+reuse": n_pre / on["prefill_s"], "halting off": n_pre / off["prefill_s"]},
                "decode_tok_s": {"depth-batched": on["depth_tokens"] / on["depth_s"],
                                 "lockstep": n_dec / on["decode_s"],
                                 "halting off": 1 / best_off, "halting off lockstep": n_dec / off["decode_s"],
                                 "halting off depth-batched": off["depth_tokens"] / off["depth_s"]},
                "decode_ticks": on["ticks"],
                "prefill_flop_saving": 1 - f_pre / f_off, "prefill_wall_saving": _saving(on["prefill_s"], off["prefill_s"]),
                "decode_schedule": "depth-batched" if t_depth <= t_lock else "lockstep",
                "decode_flop_saving": 1 - f_on / f_off, "decode_wall_saving": _saving(t_on, best_off),
                "depth_flop_saving": 1 - f_dec / f_off, "depth_wall_saving": _saving(t_depth, best_off),
                "lockstep_flop_saving": 1 - f_lock / f_off, "lockstep_wall_saving": _saving(on["decode_s"], off["decode_s"]),
                "decode_bytes_saving": 1 - bytes_on / bytes_off,
                "depth_bytes_saving": 1 - (on["depth_bytes"] / on["depth_tokens"]) / (off["depth_bytes"] / off["depth_tokens"]),
                "decode_bandwidth_fraction": {"lockstep": (n_dec / on["decode_s"]) / limit,
                                              "halting off": (n_dec / off["decode_s"]) / limit_off},
                "gemv_bandwidth_GBs": bandwidth / 1e9,
                "syncs_per_decode_step": {"lockstep": on["syncs_per_step"], "halting off": off["syncs_per_step"]},
            }
            if rec is not None:
                row["decode_tok_s"]["no-cache recompute"] = 1 / rec
                row["cached_vs_recompute"] = rec / t_on
            rows.append(row)
            print_row(row)
    return rows


def _ratio(wall: float, flop: float) -> float:
    return wall / flop if flop > 1e-3 else float("nan")


RATIO_TARGET, CACHE_TARGET = 0.8, 20.0


def target_summary(rows: list[dict]) -> list[str]:
    """A line per row against the targets: wall↓ ≥ 0.8 × FLOP↓ for prefill and decode where halting skips work, and
    cached decode ≥ 20× the no-cache reference at 0 % skipped. A decode short of the ratio also gets its bytes
    bound — bytes↓ / FLOP↓ of the schedule it used: below 0.8, no implementation of that schedule can reach the
    target where decoding is bandwidth-bound (wall↓ then follows bytes↓)."""
    lines = []
    for r in rows:
        where = f"{r['dtype']} batch {r['batch']:>2} {r['target_saving']:>4.0%}"
        if r["target_saving"] == 0:
            ac = r.get("cached_vs_recompute")
            if ac is not None:
                verdict = "meets" if ac >= CACHE_TARGET else "SHORT of"
                lines.append(f"{where}: cached decode {ac:.0f}× the no-cache reference ({verdict} {CACHE_TARGET:.0f}×)")
            continue
        parts = []
        for kind in ("prefill", "decode"):
            ratio = _ratio(r[f"{kind}_wall_saving"], r[f"{kind}_flop_saving"])
            part = f"{kind} {ratio:.2f} {'meets' if ratio >= RATIO_TARGET else 'SHORT'}"
            if kind == "decode" and not ratio >= RATIO_TARGET:
                saved = r["depth_bytes_saving" if r["decode_schedule"] == "depth-batched" else "decode_bytes_saving"]
                bound = _ratio(saved, r["decode_flop_saving"])
                part += f" (bytes bound {bound:.2f}" + (", out of reach where bandwidth-bound)"
                                                        if bound < RATIO_TARGET else ")")
            parts.append(part)
        lines.append(f"{where}: " + "; ".join(parts))
    return lines


HEADER = (f"{'dtype':>5} {'batch':>5} {'skip':>5} {'D pre':>5} {'D dec':>5} | {'prefill tok/s a':>15} {'b':>8} | "
          f"{'pre FLOP↓':>9} {'wall↓':>6} {'ratio':>5} | {'decode tok/s a':>14} {'lock':>7} {'b':>7} | "
          f"{'dec FLOP↓':>9} {'wall↓':>6} {'ratio':>5} {'by':>5} | {'ratio depth':>11} {'lock':>5} | {'bytes↓ depth':>12} {'lock':>6} | "
          f"{'BW% lock':>8} {'b':>4} | {'sync lock':>9} {'b':>2} | {'a/c':>5}")


def print_row(r: dict) -> None:
    bw, sy, dec = r["decode_bandwidth_fraction"], r["syncs_per_decode_step"], r["decode_tok_s"]
    ac = r.get("cached_vs_recompute")
    print(f"{r['dtype']:>5} {r['batch']:>5} {r['target_saving']:>5.0%} {r['prefill_mean_D']:>5.2f} "
          f"{r['decode_mean_D']:>5.2f} | {r['prefill_tok_s']['cache+reuse']:>15.1f} "
          f"{r['prefill_tok_s']['halting off']:>8.1f} | {r['prefill_flop_saving']:>9.1%} "
          f"{r['prefill_wall_saving']:>6.1%} {_ratio(r['prefill_wall_saving'], r['prefill_flop_saving']):>5.2f} | "
          f"{dec['depth-batched']:>14.1f} {dec['lockstep']:>7.1f} {dec['halting off']:>7.1f} | "
          f"{r['decode_flop_saving']:>9.1%} {r['decode_wall_saving']:>6.1%} "
          f"{_ratio(r['decode_wall_saving'], r['decode_flop_saving']):>5.2f} {'depth' if r['decode_schedule'] == 'depth-batched' else 'lock':>5} | "
          f"{_ratio(r['depth_wall_saving'], r['depth_flop_saving']):>11.2f} "
          f"{_ratio(r['lockstep_wall_saving'], r['lockstep_flop_saving']):>5.2f} "
          f"| {r['depth_bytes_saving']:>12.1%} {r['decode_bytes_saving']:>6.1%} | {bw['lockstep']:>8.0%} {bw['halting off']:>4.0%} | "
          f"{sy['lockstep']:>9} {sy['halting off']:>2} | " + (f"{ac:>4.0f}x" if ac else f"{'':>5}"), flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--speculative" in argv:  # self-speculative vs ordinary cached decoding (bench_speculative.py)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_speculative import main as speculative_main

        return speculative_main([a for a in argv if a != "--speculative"])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="70m", help="Pythia shape (70m, 160m, ..., tiny)")
    ap.add_argument("--context", type=int, default=512, help="prompt length (decoding context)")
    ap.add_argument("--batches", default="1,8,32", help="batch sizes, comma-separated")
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)  # older spelling: one batch size
    ap.add_argument("--new-tokens", type=int, default=16, help="decode steps timed per variant")
    ap.add_argument("--recompute-tokens", type=int, default=1, help="tokens timed for the no-cache reference (0: skip)")
    ap.add_argument("--savings", default="0,0.25,0.5", help="skipped token-pass shares the gates are calibrated to")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of each prefill and decoding (best is kept)")
    ap.add_argument("--decode-repeats", type=int, default=0,
                    help="timed runs of each decoding (0 = 4 × --repeats; a decoding is short and its time noisy)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--dtypes", "--dtype", default="fp32,bf16", help="fp32 and/or bf16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    _check_arguments(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"AdaPonder inference: Pythia-{args.size} shape, random weights, on {args.device}, "
          f"{torch.get_num_threads()} threads, context {args.context}, {args.new_tokens} decode steps, "
          f"batches {args.batches}")
    print(HEADER)
    print("-" * len(HEADER))
    rows = []
    for dtype_name in args.dtypes.split(","):
        rows += bench_dtype(args, dtype_name)
    print("\nprefill: (a) cache with KV reuse and compaction, (b) the same model with halting off.\n"
          "decode: a = depth-batched (every row at its own pass; a halted row starts its next token), lock = the cached\n"
          "forward in lockstep (every row at the same pass, halted rows idle); halting on (a) and off (b) each decode\n"
          "with the faster of the two schedules (by = the one (a) used; ratio depth / lock = each schedule's own ratio\n"
          "against (b)); (c) no-cache recompute (PonderLM-style, batch 1). ratio = wall-clock saving / FLOP saving\n"
          "(target ≥ 0.8); every time is the best of --repeats (decode: --decode-repeats) round-robin runs;\n"
          "bytes↓ = saving in bytes read per token (lock: weights\n"
          "of every pass any row runs + K/V of active rows; depth: weights and W_out every tick, W_E in ticks that ponder,\n"
          "the gates run, K/V of every row), the bound on wall↓ where decoding is bandwidth-bound; BW% = lockstep decode tokens/s as a share of the\n"
          "memory-bandwidth limit (bytes per step / measured GEMV bandwidth); sync = host synchronisations per lockstep\n"
          "step (depth-batched: one per tick); depth-batched tokens = the window's token-passes over the mean exit pass\n"
          "(tokens still in flight at its end count for the passes they ran);\n"
          "a/c = cached decode (a) over (c) (target ≥ 20× at 512 context, 0 % skipped).")
    print(f"\ntargets (ratio ≥ {RATIO_TARGET} where halting skips work; cached decode ≥ {CACHE_TARGET:.0f}× at 0 %):")
    for line in target_summary(rows):
        print("  " + line)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return rows


def _check_arguments(args) -> None:
    """Every list and count of the command line checked before any model is built: one ``error:`` line naming
    the argument, the value and what was expected, and exit code 2."""
    from adaponder.arg_checks import counts, exit_on_usage_error, name_list, number_list
    from adaponder.modeling.presets import checked_size

    with exit_on_usage_error():
        checked_size(args.size, "--size")
        args.batches = number_list(str(args.batch) if args.batch is not None else args.batches,
                                   "--batch" if args.batch is not None else "--batches", int, 1, "batch size")
        number_list(args.savings, "--savings", float, what="saving", check=lambda s: 0 <= s < 1,
                    expected="comma-separated shares in [0, 1), e.g. 0,0.25,0.5")
        counts(args, ("context", "new_tokens", "repeats"))
        name_list(args.dtypes, "--dtypes", DTYPES, "dtype")


if __name__ == "__main__":
    main()
