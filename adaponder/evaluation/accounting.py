"""Realised compute of an evaluation: mean exit pass and FLOPs per token (A17), relative to one pass.

"× one pass" divides by the cost of a plain one-pass model at the same context: one backbone pass plus the
output head (no pondering product, no gate), i.e. what vanilla Pythia of the same shape spends per token.
The papers' "×" metric is the mean exit pass (``mean_passes``); both are reported.
"""

from __future__ import annotations

import numpy as np
import torch

#: The FLOPs baseline of every evaluation output, printed with its numbers. (The training report,
#: :mod:`adaponder.train.report`, states "FLOPs saved" against all K passes instead.)
ONE_PASS_BASELINE = ("FLOPs baseline: \"× one pass\" = FLOPs per token / (one backbone pass + the output head "
                     "at the same context, what a vanilla model of this shape spends per token), not all K passes")


def flops_summary(model, exit_pass, context: float | None = None) -> dict[str, float]:
    """FLOPs per token from realised exit passes (``model.flops_per_token``, A17) plus the one-pass reference.

    ``context`` is the sequence length the tokens were processed in (attention cost; the model's convention,
    no causal discount); ``None`` uses ``max_position_embeddings``. Returns the model's parts (``total``,
    ``backbone``, ``head``, ``pondering``, ``gates``, ``mean_passes``) and ``one_pass`` (one backbone pass +
    head), ``x_one_pass`` (total / one_pass) and ``context``.
    """
    ctx = None if context is None else max(1, int(round(float(context))))
    ep = torch.as_tensor(np.asarray(exit_pass, dtype=np.int64).reshape(-1))
    if ep.numel() == 0:
        ep = torch.ones(1, dtype=torch.long)
    out = dict(model.flops_per_token(ep, context=ctx))
    one = model.flops_per_token(torch.ones(1, dtype=torch.long), context=ctx)
    out["one_pass"] = float(one["backbone"] + one["head"])
    out["x_one_pass"] = float(out["total"] / out["one_pass"])
    out["context"] = float(ctx if ctx is not None else model.config.max_position_embeddings)
    return {k: float(v) for k, v in out.items()}


__all__ = ["ONE_PASS_BASELINE", "flops_summary"]
