"""Training a draft head on a frozen looped model (docs/method.md A24): every weight of the model stays as it is, so
its forward — and so its perplexity, its answers, its exits — is exactly the checkpoint's; only the head learns to
predict the full model's distribution from pass 1's state (and a re-draft head, where the model has one, from pass
K−1's).

Trained jointly with the model (``model.draft_head: true``), the head chases a teacher that changes under it and
learns while the learning rate decays; trained here, on the finished model, it sees its final teacher at a steady
rate. The command ``adaponder train-draft`` runs this and writes the checkpoint with its head.

A draft is read while the model decodes, on text the model wrote itself, which is not the corpus's: a small model's
greedy text repeats itself, and a head trained on the corpus alone drafts it worse than it drafts the corpus.
:func:`greedy_windows` makes such text (the model's greedy continuations of prompts from the training split) and
:func:`train_draft_head` can train on it beside the corpus; :func:`greedy_agreement` measures the drafts on it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from adaponder.modeling.exit_rules import NoHalting
from adaponder.modeling.pass_driver import run_passes
from adaponder.modeling.ponder_cache import KVAligner
from adaponder.modeling.run_settings import RunSettings


def pass_states_and_final(model, ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Every pass's final-LN states ``[N, d]`` and the full model's logits ``[N, V]`` of the windows ``ids``
    ``[B, T]``, without gradients (every token runs all K passes)."""
    with torch.no_grad():
        ctx = model.pass_context(ids)
        run = run_passes(model, ctx, KVAligner(model.config.num_hidden_layers, None),
                         settings=RunSettings(exit_rule=NoHalting(), compact=False), return_pass_states=True)
        states = [h.reshape(-1, h.shape[-1]) for h in run.pass_states]
        return states, model.lm_head(run.h_hat).reshape(-1, model.config.vocab_size)


def draft_heads(model) -> list[tuple[str, torch.nn.Module, int]]:
    """The model's draft heads as ``(name, head, index of the pass state it reads)``: pass 1's, then the re-draft
    heads' (``redraft_head`` on pass K−1, ``redraft_pass{p}`` on an earlier pass p)."""
    K = model.config.num_passes
    heads = [("draft_head", model.draft_head, 0)]
    heads += [("redraft_head" if p == K - 1 else f"redraft_pass{p}", head, p - 1)
              for p, head in (model.redraft_heads() if hasattr(model, "redraft_heads") else {}).items()]
    return [(name, head, i) for name, head, i in heads if head is not None]


@torch.no_grad()
def greedy_windows(model, stream: np.ndarray, count: int, prompt: int = 64, new: int = 64, batch: int = 64,
                   seed: int = 0, progress: bool = True) -> np.ndarray:
    """``[count, prompt + new]`` token windows: prompts of ``prompt`` tokens at random places of ``stream``, each
    followed by the ``new`` tokens the model decodes from it greedily (every row its full length: no EOS stop)."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(stream) - prompt, count)
    out = np.empty((count, prompt + new), dtype=np.int64)
    saved_eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None
    try:
        for i in tqdm(range(0, count, batch), desc="greedy text", unit="batch", disable=not progress):
            rows = starts[i:i + batch]
            ids = torch.from_numpy(np.stack([stream[s:s + prompt] for s in rows]).astype(np.int64))
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                                 pad_token_id=0)
            out[i:i + len(rows)] = seq.numpy()
    finally:
        model.generation_config.eos_token_id = saved_eos
    return out


def windows(stream: np.ndarray, window: int, batch: int, seed: int) -> Iterator[torch.Tensor]:
    """Batches of ``batch`` windows of ``window`` tokens from a token stream, in a seeded random order (repeated)."""
    starts = np.arange(0, len(stream) - window, window)
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(starts)
        for i in range(0, len(order) - batch + 1, batch):
            yield torch.from_numpy(np.stack([stream[s:s + window] for s in order[i:i + batch]]).astype(np.int64))


def train_draft_head(model, stream: np.ndarray, steps: int = 1500, window: int = 256, batch: int = 2,
                     lr: float = 1e-3, seed: int = 0, log: Path | None = None, progress: bool = True,
                     greedy: np.ndarray | None = None) -> dict:
    """Train ``model.draft_head`` (and the re-draft heads where it has them; every other weight frozen) for
    ``steps`` batches of the token ``stream``: cross-entropy against the full model's distribution, AdamW at ``lr``
    with a cosine decay to 0.1·lr. ``greedy``: windows of the model's own greedy text (:func:`greedy_windows`); every
    other step then takes as many tokens from them instead. Returns the final figures; ``log`` gets one JSON line
    per 50 steps."""
    if model.draft_head is None:
        raise ValueError("the model has no draft head: load it with draft_head=True")
    torch.manual_seed(seed)
    for p in model.parameters():
        p.requires_grad_(False)
    heads = draft_heads(model)
    params = [p for _, head, _ in heads for p in head.parameters()]
    for p in params:
        p.requires_grad_(True)
    model.eval()
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    w = model.lm_head.weight.detach()
    it = windows(stream, window, batch, seed)
    if greedy is not None:
        per = max(1, batch * window // greedy.shape[1])  # the corpus steps' token count
        flat = greedy.reshape(-1)
        own = windows(flat, greedy.shape[1], per, seed + 1)  # whole windows: they start at multiples of its length
    sink = open(log, "w", encoding="utf-8") if log else None
    agree = loss_value = float("nan")
    bar = tqdm(range(steps), desc="draft head", unit="step", disable=not progress)
    try:
        for step in bar:
            for g in opt.param_groups:
                g["lr"] = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / max(steps, 1))))
            states, final = pass_states_and_final(model, next(own if greedy is not None and step % 2 else it))
            teacher = F.softmax(final.float(), -1)
            all_logits = [F.linear(head(states[i]), w).float() for _, head, i in heads]
            loss = sum(-(teacher * F.log_softmax(logits, -1)).sum(-1).mean() for logits in all_logits)
            logits = all_logits[0]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if (step + 1) % 50 == 0 or step + 1 == steps:
                agree = float((logits.argmax(-1) == final.argmax(-1)).float().mean())
                loss_value = float(loss.detach())
                bar.set_postfix(loss=f"{loss_value:.3f}", agree=f"{agree:.3f}")
                if sink:
                    sink.write(json.dumps({"step": step + 1, "loss": loss_value, "agreement": agree}) + "\n")
                    sink.flush()
    finally:
        if sink:
            sink.close()
        for p in model.parameters():
            p.requires_grad_(False)
    return {"steps": steps, "loss": loss_value, "train_agreement": agree}


@torch.no_grad()
def draft_agreement(model, stream: np.ndarray, window: int = 256, max_windows: int = 32, skip: int = 0) -> dict:
    """Per position, how often the draft's greedy token (the draft head's, pass 1's own logits', and the re-draft
    heads' where the model has them) is the full model's, teacher-forced on windows of ``stream`` (past the first
    ``skip`` positions of each)."""
    heads = [(name, head, i) for name, head, i in draft_heads(model) if name != "draft_head"]
    hits, total = dict.fromkeys(["draft_head", "pass1_logits", *[name for name, _, _ in heads]], 0), 0
    for s in range(0, min(len(stream) - window + 1, max_windows * window), window):
        ids = torch.from_numpy(np.asarray(stream[s:s + window], dtype=np.int64))[None]
        states, final = pass_states_and_final(model, ids)
        states, final = [x[skip:] for x in states], final[skip:]
        target = final.argmax(-1)
        hits["draft_head"] += int((model.draft_logits(states[0]).argmax(-1) == target).sum())
        hits["pass1_logits"] += int((model.lm_head(states[0]).argmax(-1) == target).sum())
        for name, head, i in heads:
            hits[name] += int((model.lm_head(head(states[i])).argmax(-1) == target).sum())
        total += target.numel()
    return {**{name: n / max(total, 1) for name, n in hits.items()}, "positions": total}


def greedy_agreement(model, greedy: np.ndarray, prompt: int) -> dict:
    """:func:`draft_agreement` on the generated part of :func:`greedy_windows`' windows: the drafts on the model's own
    greedy text, which is what they draft while it decodes."""
    return draft_agreement(model, greedy.reshape(-1), greedy.shape[1], greedy.shape[0], skip=prompt)


__all__ = ["draft_agreement", "draft_heads", "greedy_agreement", "greedy_windows", "pass_states_and_final",
           "train_draft_head", "windows"]
