"""Self-speculative decoding against ordinary cached decoding, side by side in one run (``bench_inference.py
--speculative`` runs this).

For every model (trained checkpoints given with ``--checkpoint``, and random-weight Pythia shapes with
``--shapes``), batch size and dtype it decodes the same prompts greedily with

  (o) ordinary cached decoding — the faster of ``model.generate`` and a plain loop of cached forward calls;
  (s) ``model.generate(..., decoding=DecodingConfig(draft=SpeculativeConfig(draft_passes, γ)))`` for every γ of ``--gammas``,
  (p) with ``--pipelined``, ``model.generate(..., decoding=DecodingConfig(schedule="pipelined"))``: the passes as a pipeline, token t + 1
      (drafted from token t's first pass) running its passes while token t runs its later ones (row γ = P; its
      tok/cyc is tokens per tick, its bytes a tick's: the layers, W_out and W_E once, every entry's K/V),

checks that (s) returns the tokens (o) returns, and prints tokens/s, the
speed-up (s)/(o) (tokens/s of the whole call, prefill included: the same prefill in both), the acceptance rate (accepted drafts / drafted), tokens per cycle, the ordinary decoding steps an adaptive
schedule chose instead of drafting (``plain``), and the bandwidth model: the
bytes of weights and K/V a decode reads per token, ordinary (each token's passes) vs speculative (per cycle: γ draft
steps of P passes, one verification of K − P passes for the block), whose ratio is the speed-up a bandwidth-bound
decoder would see. Every time is the best of ``--repeats`` round-robin runs.

    python eval/bench_inference.py --speculative --checkpoint runs/study/cpu/adaponder-paper-s1234/hf \\
        --checkpoint runs/study/cpu/ponderlm-s1234/hf --prompt-text README.md
    python eval/bench_inference.py --speculative --shapes tiny --batches 1 --dtypes fp32 --new-tokens 8  # smoke
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from adaponder.modeling import AdaPonderForCausalLM, PonderCache, pythia_config  # noqa: E402
from adaponder.generation.pass_pipeline import PipelinedSpeculativeDecoder  # noqa: E402
from adaponder.generation import DecodingConfig  # noqa: E402
from adaponder.generation.speculative import SelfSpeculativeDecoder, SpeculativeConfig  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def load_model(spec: str, dtype: torch.dtype):
    """A checkpoint folder, or ``shape:MODE`` (random weights, e.g. ``70m:adaponder``)."""
    if Path(spec).is_dir():
        model, name = AdaPonderForCausalLM.from_pretrained(spec, dtype=dtype).eval(), spec
    else:
        shape, _, mode = spec.partition(":")
        torch.manual_seed(0)
        model = AdaPonderForCausalLM(pythia_config(shape, mode=mode or "adaponder", passes=4)).to(dtype).eval()
        name = f"Pythia-{shape} {mode or 'adaponder'} (random)"
    model.generation_config.eos_token_id = None  # every row decodes the same number of tokens
    return model, name


def prompts(model, spec: str, text: Path | None, batch: int, length: int, data: Path | None = None) -> torch.Tensor:
    """``[batch, length]`` prompts: consecutive windows of a prepared data folder's held-out tokens (``data``, the
    checkpoint's own tokenizer), of ``text`` encoded with the checkpoint's tokenizer, or random ids."""
    if data is not None and Path(spec).is_dir():
        import json

        import numpy as np

        meta = json.loads((data / "meta.json").read_text())
        ids = np.memmap(data / "val-00000.bin", dtype=meta["dtype"], mode="r")
        start = 4096  # past a book's front matter
        if ids.shape[0] < start + batch * length:
            raise SystemExit(f"{data}: {ids.shape[0]} held-out tokens, too few for {batch} prompts × {length}")
        return torch.from_numpy(np.asarray(ids[start:start + batch * length], dtype=np.int64)).reshape(batch, length)
    tok = Path(spec) / "tokenizer.json"
    if text is not None and tok.is_file():
        from tokenizers import Tokenizer

        ids = Tokenizer.from_file(str(tok)).encode(text.read_text(encoding="utf-8")).ids
        if len(ids) < batch * length:
            raise SystemExit(f"{text}: {len(ids)} tokens, fewer than {batch} prompts × {length}")
        return torch.tensor(ids[:batch * length]).reshape(batch, length)
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=g)


def plain_decode(model, prompt, new_tokens: int) -> torch.Tensor:
    """Greedy cached decoding without ``generate``'s machinery: one cached forward per token."""
    cache = PonderCache(model.config.num_passes, model.config.num_hidden_layers)
    out = model(prompt, cache=cache, use_cache=True)
    tokens = [out.logits[:, -1].float().argmax(-1, keepdim=True)]
    for _ in range(new_tokens - 1):
        out = model(tokens[-1], cache=cache, use_cache=True)
        tokens.append(out.logits[:, -1].float().argmax(-1, keepdim=True))
    return torch.cat([prompt, *tokens], dim=1)


def byte_sizes(model) -> tuple[float, float, float]:
    """Bytes of one pass's layer weights, of W_out (= W_E), and of one position's K/V in every layer."""
    cfg = model.config
    item = next(model.parameters()).element_size()
    return (model.parameter_counts()["non_embedding"] * item, cfg.vocab_size * cfg.hidden_size * item,
            cfg.num_hidden_layers * 2 * cfg.hidden_size * item)


def ordinary_bytes(model, mean_exit: float, context: float) -> float:
    """Per token: its passes' weights and K/V, the pondering product between passes (W_out and W_E), the head."""
    layers, head, kv = byte_sizes(model)
    return mean_exit * (layers + kv * context) + 2 * head * (mean_exit - 1) + head


def speculative_bytes(model, config: SpeculativeConfig, gamma_run: float, context: float) -> float:
    """Per cycle of ``gamma_run`` drafted tokens: each draft step reads P passes, their pondering products and the
    draft logits; the verification reads K − P passes once for the block (weights and K/V), their pondering
    products and the head."""
    layers, head, kv = byte_sizes(model)
    P, K = config.draft_passes, model.config.num_passes
    draft = gamma_run * (P * (layers + kv * context) + 2 * head * P)
    verify = (K - P) * (layers + kv * context) + 2 * head * (K - P - 1) + head
    return draft + verify


def pipelined_bytes(model, stats, context: float) -> float:
    """What the ticks of a pipelined decoding read: each tick the layer weights once, the K/V of every entry, W_out
    once (every entry's logits and the draft in one product) and W_E once (the pondering product)."""
    layers, head, kv = byte_sizes(model)
    return stats.ticks * (layers + 2 * head) + stats.token_passes * kv * context


def timed(fn, repeats: int):
    best, out = float("inf"), None
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best, out


@torch.no_grad()
def bench_one(model, name: str, prompt: torch.Tensor, args, dtype_name: str) -> list[dict]:
    K, new = model.config.num_passes, args.new_tokens
    batch, length = prompt.shape
    model(prompt[:, :4], use_cache=True)  # warm-up
    t_prefill, _ = timed(lambda: model(prompt, cache=PonderCache(K, model.config.num_hidden_layers),
                                      use_cache=True), args.repeats)
    t_gen, ref = timed(lambda: model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                              do_sample=False, pad_token_id=0), args.repeats)
    t_plain, plain = timed(lambda: plain_decode(model, prompt, new), args.repeats)
    t_ord = min(t_gen, t_plain)
    exits = model(torch.cat([prompt, ref[:, length:]], 1), use_cache=False).exit_pass[:, length:]
    mean_exit = float(exits.float().mean())
    context = length + new / 2
    rows = []
    configs = [SpeculativeConfig(args.draft_passes, g) for g in args.gammas]
    if args.adaptive:  # γ adapted from --adaptive-from up to --adaptive-max (SpeculativeConfig's defaults)
        configs.append(SpeculativeConfig(args.draft_passes, args.adaptive_from, adaptive=True,
                                         max_draft_tokens=args.adaptive_max))
    compiled = DecodingConfig(compile=True)
    if args.compiled:  # ordinary decoding on the compiled static step (the first call compiles, untimed)
        model.generate(prompt, max_new_tokens=new, decoding=compiled)
        t_cord, cref = timed(lambda: model.generate(prompt, max_new_tokens=new, decoding=compiled).sequences,
                             args.repeats)
    if args.pipelined:  # the passes as a pipeline (docs/method.md, "Pipelined decoding"), same ordinary decoding
        decoder = PipelinedSpeculativeDecoder(model)
        t_pipe, out = timed(lambda: decoder.generate(prompt, new).sequences, args.repeats)
        st = decoder.stats
        ticks_per_token = st.ticks / max(new - 1, 1)
        ord_b = ordinary_bytes(model, mean_exit, context)
        pipe_b = pipelined_bytes(model, st, context) / (batch * max(new - 1, 1))
        rows.append(dict(model=name, dtype=dtype_name, batch=batch, K=K, gamma="P", draft_passes=1,
                         ordinary_tok_s=batch * new / t_ord, speculative_tok_s=batch * new / t_pipe,
                         speedup=t_ord / t_pipe, same_tokens=bool(torch.equal(out, ref) and torch.equal(plain, ref)),
                         acceptance=st.acceptance_rate, tokens_per_cycle=1 / ticks_per_token, mean_exit=mean_exit,
                         bytes_per_token_ordinary=ord_b, bytes_per_token_speculative=pipe_b,
                         bandwidth_speedup=ord_b / pipe_b, generate_s=t_gen, plain_s=t_plain, prefill_s=t_prefill,
                         plain_steps=0, ticks=st.ticks, wasted_passes=st.wasted))
        print_row(rows[-1])
    for cfg in configs:
        gamma = f"a{cfg.max_draft_tokens}" if cfg.adaptive else cfg.draft_tokens
        decoder = SelfSpeculativeDecoder(model, cfg)
        t_spec, out = timed(lambda: decoder.generate(prompt, max_new_tokens=new), args.repeats)
        st = decoder.stats
        tokens = batch * new
        per_cycle = st.mean_advance
        drafted_per_cycle = st.drafted / max(st.cycles, 1) / batch
        ord_b = ordinary_bytes(model, mean_exit, context)
        spec_b = speculative_bytes(model, cfg, drafted_per_cycle, context) / max(per_cycle, 1e-9)
        rows.append(dict(model=name, dtype=dtype_name, batch=batch, K=K, gamma=gamma, draft_passes=cfg.draft_passes,
                         ordinary_tok_s=tokens / t_ord, speculative_tok_s=tokens / t_spec,
                         speedup=t_ord / t_spec, same_tokens=bool(torch.equal(out, ref) and torch.equal(plain, ref)),
                         acceptance=st.acceptance_rate, tokens_per_cycle=per_cycle, mean_exit=mean_exit,
                         bytes_per_token_ordinary=ord_b, bytes_per_token_speculative=spec_b,
                         bandwidth_speedup=ord_b / spec_b, generate_s=t_gen, plain_s=t_plain, prefill_s=t_prefill,
                         plain_steps=st.plain_steps))
        if args.compiled:  # the same speculation with compiled draft and verify steps (γ fixed when compiled)
            run = lambda: model.generate(prompt, max_new_tokens=new,  # noqa: E731
                                         decoding=DecodingConfig(draft=cfg, compile=True))
            t0 = time.perf_counter()
            run()
            compile_s = time.perf_counter() - t0
            t_cspec, cout = timed(lambda: run().sequences, args.repeats)
            last = run()
            rows[-1].update(compiled_ordinary_tok_s=tokens / t_cord, compiled_speculative_tok_s=tokens / t_cspec,
                            compiled_speedup=t_cord / t_cspec, compiled_over_eager_ordinary=t_ord / t_cspec,
                            compiled_same=bool(torch.equal(cout, ref) and torch.equal(cref, ref)),
                            compiled_first_call_s=compile_s, compiled_plain_steps=last.stats.plain_steps)
        print_row(rows[-1])
    return rows


HEADER = (f"{'model':<34} {'dtype':>5} {'B':>3} {'γ':>2} {'ord tok/s':>9} {'spec tok/s':>10} {'×':>6} "
          f"{'same':>4} {'accept':>6} {'tok/cyc':>7} {'D̄':>5} {'bytes×':>6} {'plain':>5}")


def print_row(r: dict) -> None:
    print(f"{r['model'][-34:]:<34} {r['dtype']:>5} {r['batch']:>3} {r['gamma']:>2} {r['ordinary_tok_s']:>9.1f} "
          f"{r['speculative_tok_s']:>10.1f} {r['speedup']:>6.2f} {'yes' if r['same_tokens'] else 'NO':>4} "
          f"{r['acceptance']:>6.3f} {r['tokens_per_cycle']:>7.2f} {r['mean_exit']:>5.2f} "
          f"{r['bandwidth_speedup']:>6.2f} {r['plain_steps']:>5}" + (
              f" | compiled: ord {r['compiled_ordinary_tok_s']:.1f} spec {r['compiled_speculative_tok_s']:.1f} tok/s "
              f"× {r['compiled_speedup']:.2f} (over eager ordinary × {r['compiled_over_eager_ordinary']:.2f}) "
              f"same {'yes' if r['compiled_same'] else 'NO'} plain {r['compiled_plain_steps']}"
              if "compiled_speedup" in r else ""), flush=True)


def print_medians(rows: list[dict]) -> None:
    """Per model, dtype, batch and γ: the median × over the prompts, its range, and whether every prompt gave
    ordinary decoding's tokens."""
    import statistics

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["dtype"], r["batch"], str(r["gamma"])), []).append(r)
    print(f"\nover {len({r['prompt'] for r in rows})} prompts: median × (range), median tok/cyc, all same")
    for (model, dtype, batch, gamma), rs in groups.items():
        x = [r["speedup"] for r in rs]
        print(f"{model[-34:]:<34} {dtype:>5} {batch:>3} {gamma:>3}  × {statistics.median(x):.2f} "
              f"({min(x):.2f}–{max(x):.2f})  tok/cyc {statistics.median(r['tokens_per_cycle'] for r in rs):.2f}  "
              f"same {'yes' if all(r['same_tokens'] for r in rs) else 'NO'}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", action="append", default=[], help="a trained checkpoint folder (repeatable)")
    ap.add_argument("--shapes", default="", help="random-weight models SHAPE:MODE, comma-separated (e.g. 70m:adaponder)")
    ap.add_argument("--prompt-text", type=Path, help="text the prompts are taken from (checkpoints with a tokenizer)")
    ap.add_argument("--prompt-data", type=Path, help="a prepared data folder whose held-out tokens give the prompts "
                    "(the checkpoint's own data: e.g. the study's runs/study/cpu/data-*)")
    ap.add_argument("--context", type=int, default=64, help="prompt length")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens decoded per row")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--gammas", default="2,3,4,6,8", help="draft lengths γ, comma-separated")
    ap.add_argument("--draft-passes", type=int, default=1)
    ap.add_argument("--adaptive", action="store_true", help="also a row with γ adapted to the acceptance (aN: up to N)")
    ap.add_argument("--adaptive-from", type=int, default=SpeculativeConfig.draft_tokens,
                    help="the adaptive row's first γ (default: SpeculativeConfig's, %(default)s)")
    ap.add_argument("--adaptive-max", type=int, default=SpeculativeConfig.max_draft_tokens,
                    help="the adaptive row's largest γ (default: SpeculativeConfig's, %(default)s)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=1,
                    help="decode this many different prompts (batches of them) per row and print each row's median "
                         "and range of × over them: one prompt's figure depends on how predictable its text is")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--compiled", action="store_true",
                    help="also compiled: ordinary decoding on the compiled static step against speculation with "
                         "compiled draft and verify steps (DecodingConfig(draft=..., compile=True))")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (timings synchronise with the device)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    rows = ap.add_argument_group("rows beside the default ones (each measures one choice against the plain row)")
    rows.add_argument("--pipelined", action="store_true",
                      help="also a row decoding with the passes as a pipeline (γ column 'P'; tok/cyc = tokens per "
                           "tick)")
    rows.add_argument("--without-draft-head", action="store_true",
                      help="checkpoints with a draft head (docs/method.md A24): also a row drafting from pass 1's "
                           "own logits (the head removed), the same weights otherwise")
    rows.add_argument("--no-packed", action="store_true",
                      help="products of several rows with vocabulary-sized weights on MKL's GEMM, not on copies "
                           "packed once for oneDNN (adaponder.modeling.pondering.use_packed_weights): what they gain")
    args = ap.parse_args(argv)
    batches = _checked_arguments(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.no_packed:
        from adaponder.modeling.pondering import use_packed_weights

        use_packed_weights(False)
    specs = args.checkpoint + [s for s in args.shapes.split(",") if s]
    if not specs:
        ap.error("give --checkpoint and/or --shapes")
    print(f"self-speculative decoding vs ordinary cached decoding: {torch.get_num_threads()} threads, context "
          f"{args.context}, {args.new_tokens} new tokens, draft passes {args.draft_passes}")
    print(HEADER)
    print("-" * len(HEADER))
    rows = []
    for spec in specs:
        for dtype_name in args.dtypes.split(","):
            model, name = load_model(spec, DTYPES[dtype_name])
            model = model.to(args.device)
            variants = [(model, name)]
            if args.without_draft_head and getattr(model, "draft_head", None) is not None:
                bare, _ = load_model(spec, DTYPES[dtype_name])
                bare.draft_head = None  # drafts from pass 1's own logits; the forward is unchanged
                variants.append((bare.to(args.device), name + " (no draft head)"))
            for batch in batches:
                every = prompts(model, spec, args.prompt_text, batch * args.prompts, args.context,
                                args.prompt_data).to(args.device)
                for k in range(args.prompts):
                    ids = every[k * batch:(k + 1) * batch]
                    for m, label in variants:
                        rows += [dict(r, prompt=k) for r in bench_one(m, label, ids, args, dtype_name)]
    if args.prompts > 1:
        print_medians(rows)
    print("\nord = ordinary cached decoding (the faster of generate and a plain loop), spec = speculative; tok/s of the\n"
          "whole call (the same prefill in both; prefill alone: prefill_s in --json); × = spec/ord; same = identical greedy tokens; accept = accepted\n"
          "drafts / drafted; tok/cyc = tokens each row gains per cycle; D̄ = mean exit pass of the decoded tokens;\n"
          "bytes× = ordinary / speculative bytes read per token (weights and K/V), the speed-up of a bandwidth-bound\n"
          "decoder.")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return rows


def _checked_arguments(args) -> list[int]:
    """Every list and count of the command line checked before any model is built: one ``error:`` line naming
    the argument, the value and what was expected, and exit code 2. Returns the batch sizes."""
    from adaponder.errors import require_checkpoint
    from adaponder.arg_checks import counts, exit_on_usage_error, name_list, number_list
    from adaponder.modeling.presets import checked_size

    with exit_on_usage_error():
        for path in args.checkpoint:  # (a missing folder would be looked up as a Pythia size)
            require_checkpoint(path, "--checkpoint")
        for spec in filter(None, args.shapes.split(",")):
            if not Path(spec).is_dir():  # (load_model takes a folder given here as a checkpoint)
                checked_size(spec.partition(":")[0], "--shapes")
        args.gammas = number_list(args.gammas, "--gammas", int, 1, "γ")
        batches = number_list(args.batches, "--batches", int, 1, "batch size")
        counts(args, ("context", "new_tokens", "draft_passes", "repeats", "prompts"))
        name_list(args.dtypes, "--dtypes", DTYPES, "dtype")
    return batches


if __name__ == "__main__":
    main()
