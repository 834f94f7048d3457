"""Validation loss/perplexity and the halting report (mean exit pass, exit-pass histogram, compute saved).

``adaponder-train-report --model HF_DIR --data PREPARED_DIR [--seq-len 256] [--out DIR]``
(:mod:`adaponder.cli.train_report`) evaluates any exported model on the val split and writes ``report.md`` +
``exit_pass_hist.png``; the trainer writes the same report into its run folder at the end of training.
"""

from __future__ import annotations

import math
import json
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from adaponder.modeling.exits import exit_counts
from adaponder.modeling.run_settings import RunSettings

from .gate_watch import gate_curves_png

#: The FLOPs baseline of the training reports, printed with their numbers. (The evaluation reports,
#: :mod:`adaponder.evaluation`, state FLOPs as "× one pass" instead.)
ALL_PASSES_BASELINE = ("FLOPs baseline: \"FLOPs saved\" = 1 − inference FLOPs per token at the realised exit "
                       "passes / the same model running all K passes (no halting), not one pass")

# Evaluation vector: [CE summed over tokens, tokens, exit-pass sum, exit-pass histogram (K)].
_CE, _TOK, _EXIT, _HIST = 0, 1, 2, 3


def eval_vector(k_passes: int, device="cpu") -> torch.Tensor:
    return torch.zeros(_HIST + k_passes, dtype=torch.float64, device=device)


@torch.no_grad()
def eval_batch(call: Callable, x: torch.Tensor, vec: torch.Tensor, k_passes: int,
               settings: RunSettings | None = None) -> None:
    """Run ``call(input_ids=..., shift_labels=..., use_cache=False, return_logits=False, settings=settings)`` (an
    :class:`AdaPonderForCausalLM` or its DeepSpeed engine) on one packed batch ``x`` [B, T+1] and accumulate
    token-weighted CE and the exit passes into ``vec``."""
    out = call(input_ids=x[:, :-1], shift_labels=x[:, 1:], use_cache=False, return_logits=False, settings=settings)
    n = x[:, 1:].numel()
    vec[_CE] += out.loss.double() * n
    vec[_TOK] += n
    d = out.exit_pass.reshape(-1) if out.exit_pass is not None else torch.ones(n, dtype=torch.long, device=x.device)
    vec[_EXIT] += d.sum().double()
    vec[_HIST:_HIST + k_passes] += exit_counts(d, k_passes).double()


def eval_summary(vec: torch.Tensor, k_passes: int) -> dict[str, Any]:
    v = vec.double().cpu()
    tokens = max(float(v[_TOK]), 1.0)
    loss = float(v[_CE]) / tokens
    hist = [int(x) for x in v[_HIST:_HIST + k_passes].tolist()]
    return {"val_loss": loss, "val_ppl": math.exp(min(loss, 80.0)), "val_tokens": int(v[_TOK]),
            "mean_exit_pass": float(v[_EXIT]) / tokens, "exit_hist": hist}


def evaluate_model(model, batches: Iterable[torch.Tensor]) -> dict[str, Any]:
    """Single-process evaluation of an :class:`AdaPonderForCausalLM` (e.g. an exported checkpoint)."""
    k = model.config.num_passes
    device = next(model.parameters()).device
    vec = eval_vector(k)
    was_training = model.training
    model.eval()
    for x in batches:
        eval_batch(model, x.to(device), vec, k)
    model.train(was_training)
    return eval_summary(vec, k)


def compute_saved(model_or_config, exit_hist: list[int], context: int) -> dict[str, float]:
    """Inference FLOPs per token at the realised exit passes vs all K passes (A17; :data:`ALL_PASSES_BASELINE`)."""
    model = model_or_config
    k = len(exit_hist)
    passes = torch.repeat_interleave(torch.arange(1, k + 1), torch.tensor(exit_hist, dtype=torch.long))
    if passes.numel() == 0:
        return {}
    real = model.flops_per_token(passes, context=context, training=False)["total"]
    full = model.flops_per_token(None, context=context, training=False)["total"]
    return {"flops_per_token": real, "flops_per_token_all_passes": full, "flops_saved": 1.0 - real / full}


def text_histogram(hist: list[int], width: int = 40) -> str:
    total = max(sum(hist), 1)
    top = max(max(hist), 1)
    lines = ["exit pass | tokens      | share"]
    for i, n in enumerate(hist, start=1):
        bar = "#" * int(round(width * n / top))
        lines.append(f"{i:>9} | {n:>11,} | {100.0 * n / total:5.1f}% {bar}")
    return "\n".join(lines)


def draw_histogram(hist: list[int], title: str):
    """Share of validation tokens per exit pass (the Figure ``save_histogram_png`` saves)."""
    from adaponder.plotting import figure  # imports matplotlib (a second): only drawing the curves needs it

    total = max(sum(hist), 1)
    fig = figure(5, 3.2, dpi=120)
    ax = fig.add_subplot()
    passes = list(range(1, len(hist) + 1))
    ax.bar(passes, [100.0 * n / total for n in hist], color="#4477aa")
    ax.set_xticks(passes)
    ax.set_xlabel("exit pass D (passes a token used)")
    ax.set_ylabel("share of validation tokens (%)")
    ax.set_title(title, fontsize=9)
    return fig


def save_histogram_png(hist: list[int], path: Path, title: str) -> Path:
    from adaponder.plotting import save  # matplotlib, as above

    return save(draw_histogram(hist, title), path, dpi=120)


def write_report(out_dir: str | Path, summary: dict[str, Any], *, title: str = "AdaPonder run report",
                 details: dict[str, Any] | None = None) -> str:
    """Write ``report.md`` and ``exit_pass_hist.png`` into ``out_dir``; return the report text."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hist = summary["exit_hist"]
    k = len(hist)
    png = save_histogram_png(hist, out / "exit_pass_hist.png",
                             f"mean exit pass {summary['mean_exit_pass']:.3f} of K={k}")
    lines = [f"# {title}", ""]
    rows = [("validation loss", f"{summary['val_loss']:.4f}"), ("validation perplexity", f"{summary['val_ppl']:.2f}"),
            ("validation tokens", f"{summary['val_tokens']:,}"),
            ("mean exit pass", f"{summary['mean_exit_pass']:.3f} of K = {k}")]
    if "flops_saved" in summary:
        rows.append(("inference FLOPs saved by halting (vs all K passes)", f"{100 * summary['flops_saved']:.1f}%"))
    for key, value in (details or {}).items():
        rows.append((key, value if isinstance(value, str) else f"{value:,}" if isinstance(value, int) else f"{value:.4g}"))
    lines += ["| | |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    if "flops_saved" in summary:
        lines += ["", ALL_PASSES_BASELINE + "."]
    lines += ["", "Exit-pass histogram (validation tokens):", "", "```", text_histogram(hist), "```", "",
              f"![exit-pass histogram]({png.name})", ""]
    text = "\n".join(lines)
    (out / "report.md").write_text(text, encoding="utf-8")
    return text


def console_report(summary: dict[str, Any]) -> str:
    k = len(summary["exit_hist"])
    lines = [f"validation loss {summary['val_loss']:.4f} | perplexity {summary['val_ppl']:.2f} | "
             f"mean exit pass {summary['mean_exit_pass']:.3f} of K={k}"
             + (f" | inference FLOPs saved {100 * summary['flops_saved']:.1f}% vs all K={k} passes"
                if "flops_saved" in summary else ""),
             text_histogram(summary["exit_hist"])]
    return "\n".join(lines)


if __name__ == "__main__":  # the command line lives in adaponder.cli; say so rather than exit silently
    raise SystemExit("this module has no command line: run `adaponder-train-report` (or `python -m adaponder.cli.train_report`)")


def append_gate_section(out_dir: Path, gate_warmup: str) -> None:
    """Append the per-gate curves (``gates.png``) and the collapse alarms a run raised (its ``metrics.jsonl``)
    to its ``report.md``."""
    path = out_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] \
        if path.is_file() else []
    png = gate_curves_png(records, out_dir / "gates.png", f"Gates during training (warm-up: {gate_warmup})")
    alarms = [r for r in records if r.get("kind") == "event" and r.get("event") in ("gate_collapse", "dead_pass")]
    lines = ["", "## Gates", ""]
    lines += [f"- **alarm** (step {a['step']}): {a['message']}" for a in alarms] or \
        ["No collapse alarm: every gate stayed above τ before the ponder loss started, and every pass ran for at "
         "least 1 % of the tokens."]
    if png is not None:
        lines += ["", f"![per-gate median value and active share]({png.name})", ""]
    with open(out_dir / "report.md", "a", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
