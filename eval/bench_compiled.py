"""Decoding benchmark, eager against compiled: what the static-shape step (``RunSettings(compile=True)``,
``adaponder.generation.static_decoding``) buys over the eager cached decoding that ``generate()`` runs.

For each shape and gate setting (random weights, gates calibrated so that 0 / 25 / 50 % of token-passes are skipped
as in ``bench_inference.py``) it decodes greedily, side by side in one run:

  eager       ``model.generate(do_sample=False)``: the cached forward, halted tokens skipped (compaction, A16);
  static      the static-shape step run eagerly (on the CPU the faster of its two forms, measured as it decodes);
  compiled    ``RunSettings(compile=True)``: the same under ``torch.compile`` (inductor on the CPU, CUDA graphs on a
              GPU), as ``generate`` runs it;
  by-pass     compiled, pass by pass: one graph per pass, a pass no row needs skipped;
  whole-step  compiled, the whole step as one graph: every row through every pass, halting by masks only (the GPU's
              form: no host synchronisation inside a token).

and prints tokens/s, compiled / eager, the seconds the compilation took, the bytes one step reads (the weights of
every pass it runs, the gates and the pondering products, each row's K/V over the context) against a GEMV's
measured bandwidth, and the host synchronisations counted in one step. Times are the best of ``--repeats``.

    python eval/bench_compiled.py                                   # study shape and 70M, batch 1
    python eval/bench_compiled.py --shapes study --batches 1,8 --new-tokens 64
    python eval/bench_compiled.py --shapes tiny --context 32 --new-tokens 8 --repeats 1   # smoke
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM, pythia_config  # noqa: E402
from adaponder.modeling.run_settings import RunSettings  # noqa: E402
from adaponder.generation.static_decoding import StaticDecoder, decode_step, pass_buffers  # noqa: E402
from eval.bench_inference import (DTYPES, HostSyncCounter, _byte_sizes, _sync as _sync_on,  # noqa: E402
                                  calibrate, gemv_bandwidth, set_gates)

_device = torch.device("cpu")


def _sync() -> None:
    _sync_on(_device)

#: The text study's model (configs/study/cpu.yaml): width 128, 4 layers, vocabulary 4096, K = 4.
STUDY_SHAPE = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=2, intermediate_size=512,
                   vocab_size=4096, max_position_embeddings=1024, rotary_pct=0.25, use_parallel_residual=True,
                   tie_word_embeddings=False, passes=4, init="pythia")


def build(shape: str, device: str, dtype: torch.dtype) -> AdaPonderForCausalLM:
    torch.manual_seed(0)
    if shape == "study":
        cfg = AdaPonderConfig(mode="adaponder", **STUDY_SHAPE)
    else:
        cfg = pythia_config(shape, "adaponder")
    return AdaPonderForCausalLM(cfg).eval().to(device=device, dtype=dtype)


def step_bytes(model, batch: int, capacity: int, passes: float | None = None) -> float:
    """Bytes one static step reads when it runs ``passes`` passes (None: all K): each pass's layer weights and every
    row's K/V over the whole capacity, the gate and pondering products (W_out, W_E) after every pass but the last,
    and the head once."""
    cfg = model.config
    layers, head, gate, kv_row = _byte_sizes(model)
    p = cfg.num_passes if passes is None else passes
    return p * (layers + batch * kv_row * capacity) + (p - 1) * ((gate if cfg.gated else 0) + 2 * head) + head


def best(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        out = fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return min(times), out


@torch.no_grad()
def bench(shape: str, batch: int, args, bandwidth: float) -> list[dict]:
    model = build(shape, args.device, DTYPES[args.dtype])
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, model.config.vocab_size, (batch, args.context), generator=g).to(args.device)
    settings = RunSettings()
    rows = []
    biases = {s: calibrate(model, prompt[:, :64], s) for s in args.savings}
    model.generation_config.eos_token_id = None
    eager = lambda: model.generate(prompt, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,  # noqa: E731
                                   do_sample=False, settings=settings, pad_token_id=0)
    decoders = {"static": StaticDecoder(model, settings),
                "compiled": StaticDecoder(model, settings.replace(compile=True)),
                "by-pass": StaticDecoder(model, settings.replace(compile=True), per_pass=True),
                "whole-step": StaticDecoder(model, settings.replace(compile=True), per_pass=False)}
    compile_s = {}
    for name in ("by-pass", "whole-step"):
        t0 = time.perf_counter()
        for saving in args.savings:  # every pass index the step can stop at is compiled before timing
            set_gates(model, biases[saving])
            decoders[name].generate(prompt, max_new_tokens=args.new_tokens)
        compile_s[name] = time.perf_counter() - t0
    capacity = -(-(args.context + args.new_tokens) // 128) * 128
    for saving in args.savings:
        set_gates(model, biases[saving])
        prefill_s, _ = best(lambda: model(prompt, use_cache=True, logits_to_keep=1), args.repeats)
        times = {"eager": best(eager, args.repeats)[0]}
        for name, decoder in decoders.items():
            times[name], out = best(lambda: decoder.generate(prompt, max_new_tokens=args.new_tokens), args.repeats)
        steps = args.new_tokens - 1  # the first token comes from the prefill
        per = {k: (t - prefill_s) / steps for k, t in times.items()}
        kv = decoders["static"].new_cache(batch, capacity)
        key_ok = torch.ones(batch, capacity, dtype=torch.bool, device=args.device)
        with HostSyncCounter() as counter:
            decode_step(model, settings, pass_buffers(kv), key_ok, prompt[:, -1],
                        torch.tensor([args.context], device=args.device),
                        torch.full((batch,), args.context, device=args.device))
        mean_exit = float(out.exit_pass[:, 1:].float().mean())
        bytes_full = step_bytes(model, batch, capacity)
        bytes_run = step_bytes(model, batch, capacity, passes=mean_exit if batch == 1 else None)  # (by-pass)
        row = dict(shape=shape, batch=batch, context=args.context, skipped=saving, mean_exit=round(mean_exit, 3),
                   prefill_s=prefill_s, compile_s=compile_s, whole_step_host_syncs=counter.count,
                   step_mb=bytes_run / 2**20, whole_step_mb=bytes_full / 2**20,
                   **{f"{k}_tok_s": batch / t for k, t in per.items()},
                   compiled_over_eager=per["eager"] / per["compiled"],
                   whole_step_over_eager=per["eager"] / per["whole-step"],
                   by_pass_bandwidth_share=bytes_run / per["by-pass"] / bandwidth,
                   whole_step_bandwidth_share=bytes_full / per["whole-step"] / bandwidth)
        rows.append(row)
        print(f"{shape:>6} B={batch:<3} skipped {saving:4.0%} (mean exit {mean_exit:.2f})  tok/s: "
              + "  ".join(f"{k} {batch / t:8.1f}" for k, t in per.items())
              + f"  | compiled/eager {row['compiled_over_eager']:5.2f}×  whole-step/eager "
              f"{row['whole_step_over_eager']:5.2f}×  | {row['step_mb']:6.1f} MB/step = "
              f"{row['by_pass_bandwidth_share']:5.1%} of GEMV bandwidth by pass "
              f"(whole step {row['whole_step_mb']:6.1f} MB = "
              f"{row['whole_step_bandwidth_share']:5.1%}, {counter.count} host syncs)", flush=True)
    print(f"{shape:>6} B={batch:<3} compilation: " + ", ".join(f"{k} {v:.1f} s" for k, v in compile_s.items()))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--shapes", default="study,70m", help="'study' (the text study's model) and/or Pythia sizes")
    ap.add_argument("--batches", default="1", help="batch sizes, comma-separated")
    ap.add_argument("--context", type=int, default=128, help="prompt length")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens decoded per run")
    ap.add_argument("--savings", default="0,0.25,0.5", help="skipped token-pass shares the gates are calibrated to")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each decoding (best is kept)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    from adaponder.arg_checks import exit_on_usage_error
    from adaponder.modeling.presets import checked_size

    with exit_on_usage_error():
        for shape in args.shapes.split(","):
            checked_size(shape, "--shapes", also=("tiny", "study"))
    if args.threads:
        torch.set_num_threads(args.threads)
    global _device
    _device = torch.device(args.device)
    args.savings = [float(s) for s in args.savings.split(",")]
    if args.new_tokens < 2:
        ap.error("--new-tokens must be ≥ 2 (the first token comes from the prefill)")
    bandwidth = gemv_bandwidth(DTYPES[args.dtype], torch.device(args.device))
    print(f"torch {torch.__version__}, {args.device} {args.dtype}, {torch.get_num_threads()} threads, "
          f"GEMV bandwidth {bandwidth / 1e9:.1f} GB/s")
    rows = []
    for shape in args.shapes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            rows += bench(shape, batch, args, bandwidth)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
