"""Every exit rule's dev metrics and timing for a fine-tuned PALBERT classifier (docs/method.md (b), B9).

:func:`forward_all` runs all N passes once (sharded over the ranks under ZeRO-3); :func:`evaluate_rules` derives
each rule's metrics, mean exit pass and exit histogram from that one forward (the offline rules equal online early
exit, see the tests); :func:`predict_all` runs the online path; :mod:`adaponder.palbert.timing` times online
inference with each rule against always-last. The fine-tuning recipe (:mod:`adaponder.palbert.finetune`) calls
these in its dev, online and timing phases.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from adaponder.modeling.exits import exit_counts
from adaponder.palbert.classifier import (
    AdaPonderForSequenceClassification,
    PalbertOutput,
    offline_exit,
    predictions_from_outputs,
)
from adaponder.palbert.glue import GlueTaskSpec, pad_batch
from adaponder.palbert.metrics import glue_metrics

__all__ = ["RULE_NAMES", "padded_batches", "forward_all", "evaluate_rules", "predict_all"]

RULE_NAMES = {"q": "Q-exit", "sample": "sampling", "expectation": "expectation", "last": "always-last",
              "pabee": "PABEE"}


def padded_batches(ids: Sequence[Sequence[int]], labels: Sequence, batch_size: int, pad_id: int, order=None):
    """Padded batches of ``batch_size`` examples, in ``order`` (indices; default: as given)."""
    idx = list(range(len(ids))) if order is None else list(order)
    for start in range(0, len(idx), batch_size):
        chunk = idx[start:start + batch_size]
        yield pad_batch([ids[i] for i in chunk], [labels[i] for i in chunk], pad_id=pad_id)


_OUTPUT_KEYS = ("pass_logits", "lambda_logits", "lambdas", "p")


@torch.no_grad()
def forward_all(model: AdaPonderForSequenceClassification, ids: Sequence[Sequence[int]], labels: Sequence,
                batch_size: int, pad_id: int, *, engine=None, shard: tuple[int, int] | None = None,
                progress: Callable[[int], None] | None = None) -> PalbertOutput:
    """All N passes for every example (eval mode, no early exit): per-pass outputs, λ, p, concatenated.

    ``engine``: run the forward through this DeepSpeed engine (wrapping ``model``). ``shard = (rank, world)``
    with ``world > 1`` is collective: each rank computes every ``world``-th example, padded to the same count
    so every rank runs the same module sequence (ZeRO-3 gathers parameters module by module), and every rank
    gets all outputs back in order. ``progress(1)`` after each batch.
    """
    rank, world = shard or (0, 1)
    n = len(ids)
    order = list(range(n))
    if world > 1:
        mine = order[rank::world]
        order = mine + [0] * (-(-n // world) - len(mine))
    runner = engine if engine is not None else model
    was = model.training
    runner.eval()
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in _OUTPUT_KEYS}
    device = _device_of(model) if engine is None else engine.device
    try:
        for batch in padded_batches(ids, labels, batch_size, pad_id, order):
            out = runner(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device))
            for key in parts:
                val = getattr(out, key)
                if val is not None:
                    parts[key].append(val.float().cpu())
            if progress is not None:
                progress(1)
    finally:
        runner.train(was)
    cat = {k: torch.cat(v) if v else None for k, v in parts.items()}
    if world > 1:
        boxes: list[Any] = [None] * world
        dist.all_gather_object(boxes, cat)
        for key in _OUTPUT_KEYS:
            if boxes[0][key] is None:
                continue
            full = boxes[0][key].new_empty((n, *boxes[0][key].shape[1:]))
            for r in range(world):
                full[r::world] = boxes[r][key][:len(range(r, n, world))]
            cat[key] = full
    return PalbertOutput(logits=cat["pass_logits"][:, -1], **cat)


def _rule_stats(task: str, outputs: torch.Tensor, exit_idx: torch.Tensor, labels: Sequence, n: int,
                regression: bool) -> dict[str, Any]:
    preds = predictions_from_outputs(outputs, regression)
    metrics = glue_metrics(task, preds.numpy(), list(labels))
    mean_exit = float((exit_idx + 1).float().mean())
    hist = exit_counts(exit_idx + 1, n).tolist()
    return {"metrics": metrics, "mean_exit_pass": mean_exit, "speedup": n / mean_exit, "exit_histogram": hist}


def evaluate_rules(model: AdaPonderForSequenceClassification, out: PalbertOutput, labels: Sequence,
                   spec: GlueTaskSpec, rules: Sequence[str], *, q: float, patience: int, sample_draws: int = 1,
                   seed: int = 0, progress: Callable[[int], None] | None = None) -> dict[str, dict[str, Any]]:
    """Every rule's dev metrics from one offline forward (identical to online early exit, see tests).

    ``sample`` is averaged over ``sample_draws`` seeded draws (metrics and exit passes; ``draws`` keeps each).
    ``progress(1)`` after each rule (each draw of ``sample``).
    """
    cfg = model.config
    n = cfg.palbert_passes
    main = spec.main_metric
    tick = progress or (lambda k: None)
    res: dict[str, dict[str, Any]] = {}
    for rule in rules:
        kw = dict(q=q, patience=patience, regression=cfg.is_regression,
                  regression_threshold=cfg.pabee_regression_threshold)
        if rule == "sample":
            draws = []
            for k in range(sample_draws):
                gen = _generator(out.pass_logits.device, seed * 1000 + k)
                outputs, idx = offline_exit(out, rule, generator=gen, **kw)
                draws.append(_rule_stats(spec.name, outputs, idx, labels, n, cfg.is_regression))
                tick(1)
            stats = {
                "metrics": {k: float(sum(d["metrics"][k] for d in draws) / len(draws)) for k in draws[0]["metrics"]},
                "mean_exit_pass": sum(d["mean_exit_pass"] for d in draws) / len(draws),
                "exit_histogram": [sum(d["exit_histogram"][i] for d in draws) / len(draws) for i in range(n)],
                "draws": [d["metrics"][main] for d in draws],
            }
            stats["speedup"] = n / stats["mean_exit_pass"]
        else:
            outputs, idx = offline_exit(out, rule, **kw)
            stats = _rule_stats(spec.name, outputs, idx, labels, n, cfg.is_regression)
            tick(1)
        stats["main"] = float(stats["metrics"][main])
        res[rule] = stats
    return res


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def predict_all(model, batches, rule, q, patience, seed=0, progress: Callable[[int], None] | None = None):
    device = _device_of(model)
    gen = _generator(device, seed)
    preds, exits = [], []
    for batch in batches:
        r = model.predict(batch["input_ids"].to(device), batch["attention_mask"].to(device), rule, q=q,
                          patience=patience, generator=gen)
        preds.append(r.outputs.float().cpu())
        exits.append(r.exit_pass.cpu())
        if progress is not None:
            progress(1)
    return torch.cat(preds), torch.cat(exits)
