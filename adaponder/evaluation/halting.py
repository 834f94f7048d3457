"""Halting analysis: where do the gates spend compute?

* :func:`write_token_dump` (from :mod:`.token_dump`) — one row per scored token: document, position, token id,
  token text, exit pass (D_t of A8, the passes spent on the position that predicts this token) and NLL (nats).
  ``.jsonl`` or ``.tsv``.
* :func:`~.accounting.exit_histogram` — tokens per exit pass.
* :func:`nll_by_exit_pass` — mean NLL (and perplexity) of the tokens of each exit pass: if the gates spend
  compute on hard tokens, tokens that ran more passes have higher NLL.

Command line: ``adaponder-halting`` (:mod:`adaponder.cli.halting`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .exit_calibration import windows_of

from .perplexity import TokenScores
from .token_dump import token_texts


def nll_by_exit_pass(scores: TokenScores) -> list[dict]:
    """Rows ``{exit_pass, tokens, fraction, mean_nll, ppl}`` for exit passes 1..K (empty passes have NaN NLL)."""
    rows = []
    n = max(len(scores), 1)
    for k in range(1, scores.passes + 1):
        sel = scores.exit_pass == k
        count = int(sel.sum())
        mean = float(scores.nll[sel].mean()) if count else float("nan")
        rows.append({"exit_pass": k, "tokens": count, "fraction": count / n, "mean_nll": mean,
                     "ppl": math.exp(mean) if count else float("nan")})
    return rows


def greedy_changed_share(model, docs, window: int, batch_size: int, eod_id: int) -> float:
    """The share of held-out positions whose greedy token under the model's output (each token's exit-pass
    logits) differs from pass 1's: how often passes 2..K change a choice, not just its probability. Each document
    is read as ``[EOD] + tokens`` in windows of ``window`` inputs that do not overlap."""
    windows = windows_of(docs, window, eod_id)
    changed = total = 0
    by_length: dict[int, list] = {}
    for w in windows:
        by_length.setdefault(len(w), []).append(w)
    with torch.no_grad():
        for rows in by_length.values():
            for i in range(0, len(rows), batch_size):
                ids = torch.stack(rows[i:i + batch_size]).to(model.device)
                out = model(input_ids=ids, use_cache=False, return_pass_logits=True)
                changed += int((out.logits.argmax(-1) != out.pass_logits[0].argmax(-1)).sum())
                total += ids.numel()
    return changed / max(total, 1)


def hardest_tokens(scores: TokenScores, tokenizer, k: int = 10) -> list[dict]:
    """The ``k`` most frequent token ids among those that ran all K passes, with their mean NLL."""
    sel = scores.exit_pass == scores.passes
    ids, counts = np.unique(scores.token[sel], return_counts=True)
    top = np.argsort(-counts)[:k]
    texts = token_texts(tokenizer, ids[top]) if len(top) else {}
    return [{"token": texts[int(ids[i])], "count": int(counts[i]),
             "mean_nll": float(scores.nll[sel][scores.token[sel] == ids[i]].mean())} for i in top]


__all__ = ["greedy_changed_share", "hardest_tokens", "nll_by_exit_pass"]


if __name__ == "__main__":  # the command line lives in adaponder.cli; say so rather than exit silently
    raise SystemExit("this module has no command line: run `adaponder-halting` (or `python -m adaponder.cli.halting`)")
