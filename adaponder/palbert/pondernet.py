"""Model-independent PonderNet / PALBERT math for PALBERT mode (docs/method.md section (b), B3–B9).

Shapes: ``B`` examples, ``N`` passes (exit points), ``C`` classes. Pass ``i`` of the equations
(1-based) is index ``i - 1`` here; every exit rule returns a 0-based ``exit_idx`` ``[B]`` (int64),
meaning "predict ŷ at that pass; later passes are not needed", so examples run ``exit_idx + 1`` passes.

Training (B4–B7): ``λ = LambdaLayer(...)`` per pass -> ``p = exit_distribution(λ)`` ->
``pondernet_loss(logits_per_pass, labels, p)``. Inference (B9 and the comparison rules): the offline
functions (:func:`q_exit`, :func:`sample_exit`, :func:`pabee_exit`, :func:`last_exit`,
:func:`expected_prediction`) take all N passes; :class:`ExitController` makes the same decisions
online, one pass at a time, so exited examples can be dropped before the next pass is computed.
The online and offline forms share their per-pass arithmetic and give identical results.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "ExitRule",
    "EXIT_RULES",
    "LambdaMethod",
    "Method",
    "METHODS",
    "rules_for_method",
    "KLDirection",
    "KL_DIRECTIONS",
    "LambdaLayer",
    "exit_distribution",
    "log_exit_distribution",
    "geometric_prior",
    "kl_regulariser",
    "per_pass_loss",
    "reconstruction_loss",
    "pondernet_loss",
    "pabee_loss",
    "q_exit",
    "sample_exit",
    "pabee_exit",
    "last_exit",
    "expected_prediction",
    "gather_at_exit",
    "ExitController",
]

ExitRule = Literal["q", "sample", "expectation", "last", "pabee"]
#: Every exit rule (B9 and the comparison rules), in reporting order.
EXIT_RULES: tuple[str, ...] = get_args(ExitRule)
#: Methods with a Lambda layer (B3): ``palbert`` on [c_i ; c_{i−1}], ``pondernet`` a Linear on c_i.
LambdaMethod = Literal["palbert", "pondernet"]
#: The trained methods: PABEE has no Lambda layer (one head per pass).
Method = Literal[LambdaMethod, "pabee"]
METHODS: tuple[str, ...] = get_args(Method)
KLDirection = Literal["prior_to_p", "p_to_prior"]
KL_DIRECTIONS: tuple[str, ...] = get_args(KLDirection)


def rules_for_method(method: str) -> tuple[str, ...]:
    """Exit rules that apply to a trained ``method``: λ-based rules need a Lambda layer; PABEE's patience
    rule and always-last need only per-pass predictions (a PALBERT model applies PABEE to its shared head)."""
    return ("pabee", "last") if method == "pabee" else EXIT_RULES


# --------------------------------------------------------------------------------------- B3: lambda layer


class LambdaLayer(nn.Module):
    """Halting probability per pass (B3).

    * ``mode="palbert"``: ``λ_i = σ(w_o · φ(dropout([c_i ; c_{i−1}])) + b_o)``, ``c_0 = 0``,
      ``φ = num_layers × (Linear 2d→2d, tanh)`` (``num_layers = 3`` in B3).
    * ``mode="pondernet"`` (baseline): ``λ_i = σ(w_o · dropout(c_i) + b_o)``, a single Linear(d, 1);
      ``c_prev`` is ignored. Dropout on the input follows PALBERT's reference code for both modes
      (pass ``dropout=0`` for none).

    Args:
        d: width of the pooled vector ``c_i`` (B1).
        dropout: input dropout probability.
        mode: ``"palbert"`` or ``"pondernet"``.
        num_layers: depth of φ in palbert mode.
        init_bias: constant initial ``b_o``; ``None`` keeps PyTorch's default init (as PALBERT's code).
            ``log(λ_p / (1 − λ_p))`` starts every λ at the prior's rate (≈ −2.197 for λ_p = 0.1).

    B3 gives these parameters their own learning rate: put ``layer.parameters()`` in a separate
    optimizer param group.
    """

    def __init__(self, d: int, dropout: float = 0.1, mode: LambdaMethod = "palbert", *,
                 num_layers: int = 3, init_bias: float | None = None) -> None:
        super().__init__()
        if mode not in get_args(LambdaMethod):
            raise ValueError(f"mode must be one of {', '.join(get_args(LambdaMethod))}; got {mode!r}")
        if d < 1 or num_layers < 0:
            raise ValueError(f"need d >= 1 and num_layers >= 0, got d={d}, num_layers={num_layers}")
        self.d = d
        self.mode = mode
        self.dropout = nn.Dropout(dropout)
        if mode == "palbert":
            width = 2 * d
            self.phi: nn.Module = nn.Sequential(*[m for _ in range(num_layers)
                                                  for m in (nn.Linear(width, width), nn.Tanh())])
        else:
            width = d
            self.phi = nn.Identity()
        self.out = nn.Linear(width, 1)
        if init_bias is not None:
            nn.init.constant_(self.out.bias, init_bias)

    def logits(self, c: Tensor, c_prev: Tensor | None = None) -> Tensor:
        """Pre-sigmoid ``λ_i`` logits ``[...]`` for pooled ``c`` ``[..., d]``; ``c_prev = c_{i−1}`` (None = 0)."""
        if c.shape[-1] != self.d:
            raise ValueError(f"expected pooled vectors of width {self.d}, got shape {tuple(c.shape)}")
        if self.mode == "palbert":
            if c_prev is None:
                c_prev = torch.zeros_like(c)
            x = torch.cat([c, c_prev], dim=-1)
        else:
            x = c
        return self.out(self.phi(self.dropout(x))).squeeze(-1)

    def forward(self, c: Tensor, c_prev: Tensor | None = None) -> Tensor:
        """``λ_i`` in (0, 1), shape ``c.shape[:-1]`` (B3)."""
        return torch.sigmoid(self.logits(c, c_prev))


# ------------------------------------------------------------------------------- B4: exit distribution


def _check_bn(x: Tensor, name: str) -> tuple[int, int]:
    if x.dim() != 2 or x.shape[1] < 1:
        raise ValueError(f"{name} must be [B, N] with N >= 1, got shape {tuple(x.shape)}")
    return x.shape[0], x.shape[1]


def _halt_step(survive: Tensor, lam: Tensor) -> tuple[Tensor, Tensor]:
    """One pass of B4: ``(p_i, S_i) = (S_{i−1} λ_i, S_{i−1} (1 − λ_i))``. Shared by offline and online code
    so both round identically."""
    return survive * lam, survive * (1 - lam)


def exit_distribution(lambdas: Tensor) -> Tensor:
    """B4: ``p_i = λ_i ∏_{j<i}(1 − λ_j)`` for ``i < N`` and ``p_N = ∏_{j<N}(1 − λ_j)``.

    Args:
        lambdas: ``[B, N]`` halting probabilities in [0, 1]; ``λ_N`` is not used (the last pass takes
            the remaining mass).

    Returns:
        ``p`` ``[B, N]``, non-negative, rows summing to 1 up to rounding (the terms telescope).

    The running product is a loop over the (few) passes rather than ``cumprod``: no division appears in
    its gradient (λ = 1 exactly is fine) and :class:`ExitController` repeats the same operations, which
    makes online Q-exit bit-identical to ``q_exit(exit_distribution(λ))``.
    """
    _, n = _check_bn(lambdas, "lambdas")
    survive = torch.ones_like(lambdas[:, 0])
    cols = []
    for i in range(n - 1):
        p_i, survive = _halt_step(survive, lambdas[:, i])
        cols.append(p_i)
    cols.append(survive)
    return torch.stack(cols, dim=1)


def log_exit_distribution(lambda_logits: Tensor) -> Tensor:
    """``log p`` of B4 from λ logits ``[B, N]``, computed in log space.

    ``log p_i = Σ_{j<i} log σ(−z_j) + log σ(z_i)`` (``log p_N`` omits the last term). Finite for any
    finite logits, so KL terms (B6) keep a gradient where ``p`` itself would underflow to 0.
    """
    b, n = _check_bn(lambda_logits, "lambda_logits")
    log_cont = F.logsigmoid(-lambda_logits)
    zero = lambda_logits.new_zeros(b, 1)
    log_survive_before = torch.cat([zero, torch.cumsum(log_cont[:, :-1], dim=1)], dim=1)
    log_halt = torch.cat([F.logsigmoid(lambda_logits[:, :-1]), zero], dim=1)
    return log_survive_before + log_halt


# -------------------------------------------------------------------------------- B5–B7: training loss


def geometric_prior(num_passes: int, lambda_p: float = 0.1, *, dtype: torch.dtype = torch.float32,
                    device: torch.device | str | None = None) -> Tensor:
    """B6: ``p_G(i) = λ_p (1 − λ_p)^{i−1}`` for ``i < N``; the last entry takes the remainder
    ``(1 − λ_p)^{N−1}``.

    Computed in float64 then cast, so it sums to 1 to the precision of ``dtype``.
    """
    if num_passes < 1:
        raise ValueError(f"num_passes must be >= 1, got {num_passes}")
    if not 0.0 < lambda_p < 1.0:
        raise ValueError(f"lambda_p must be in (0, 1), got {lambda_p}")
    i = torch.arange(num_passes, dtype=torch.float64)
    prior = lambda_p * (1.0 - lambda_p) ** i
    prior[-1] = (1.0 - lambda_p) ** (num_passes - 1)
    return prior.to(dtype=dtype, device=device)


def kl_regulariser(p: Tensor, prior: Tensor, direction: KLDirection = "prior_to_p", *,
                   log_p: Tensor | None = None) -> Tensor:
    """B6: ``L_reg = mean_b KL(·‖·)`` between each row of ``p`` ``[B, N]`` and ``prior`` ``[N]`` (or ``[B, N]``).

    * ``direction="prior_to_p"`` (default, PALBERT's code): ``KL(p_G ‖ p_b) = Σ_i p_G(i) log(p_G(i) / p_{b,i})``.
    * ``direction="p_to_prior"`` (the PALBERT / PonderNet papers):
      ``KL(p_b ‖ p_G) = Σ_i p_{b,i} log(p_{b,i} / p_G(i))``.

    ``log_p`` (e.g. :func:`log_exit_distribution`) is used when given; otherwise ``log p`` is taken with
    ``p`` clamped to the dtype's smallest normal number, so an underflowed ``p_i = 0`` gives a large
    but finite penalty instead of ``inf``. Terms with zero weight contribute 0 (``0 log 0 = 0``).
    """
    _check_bn(p, "p")
    prior = prior.to(dtype=p.dtype, device=p.device).expand_as(p)
    if log_p is None:
        log_p = torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))
    if direction == "prior_to_p":
        kl = torch.xlogy(prior, prior) - prior * log_p
    elif direction == "p_to_prior":
        # p · (log p − log p_G): with p = 0 this is 0 and its gradient stays finite (unlike xlogy(p, p)).
        kl = p * (log_p - torch.log(prior))
    else:
        raise ValueError(f"direction must be one of {', '.join(KL_DIRECTIONS)}; got {direction!r}")
    return kl.sum(dim=1).mean()


def per_pass_loss(outputs: Tensor, labels: Tensor) -> Tensor:
    """``ℓ(ŷ_{b,i}, y_b)`` ``[B, N]``: cross-entropy for integer ``labels``, squared error for float ``labels``.

    Args:
        outputs: classification logits ``[B, N, C]``; regression predictions ``[B, N]`` or ``[B, N, 1]``.
        labels: ``[B]`` class ids (int) or targets (float; STS-B).
    """
    if labels.dim() != 1 or outputs.shape[0] != labels.shape[0]:
        raise ValueError(f"labels must be [B] matching outputs {tuple(outputs.shape)}, got {tuple(labels.shape)}")
    if labels.is_floating_point():
        preds = outputs[..., 0] if outputs.dim() == 3 and outputs.shape[-1] == 1 else outputs
        _check_bn(preds, "regression outputs")
        return (preds - labels.to(preds.dtype)[:, None]) ** 2
    if outputs.dim() != 3:
        raise ValueError(f"classification outputs must be [B, N, C], got shape {tuple(outputs.shape)}")
    b, n, c = outputs.shape
    ce = F.cross_entropy(outputs.reshape(b * n, c), labels[:, None].expand(b, n).reshape(-1), reduction="none")
    return ce.view(b, n)


def reconstruction_loss(outputs: Tensor, labels: Tensor, p: Tensor) -> Tensor:
    """B5: ``L_rec = mean_b Σ_i p_{b,i} ℓ(ŷ_{b,i}, y_b)`` (CE, or MSE for float labels; see :func:`per_pass_loss`).

    Gradients flow into both the predictions and ``p`` (hence into the λ layer).
    """
    losses = per_pass_loss(outputs, labels)
    if p.shape != losses.shape:
        raise ValueError(f"p {tuple(p.shape)} does not match per-pass losses {tuple(losses.shape)}")
    return (p * losses).sum(dim=1).mean()


def pondernet_loss(outputs: Tensor, labels: Tensor, p: Tensor, *, beta: float = 0.5, lambda_p: float = 0.1,
                   direction: KLDirection = "prior_to_p",
                   log_p: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """B7: ``L = L_rec + β · L_reg`` with B5's ``L_rec`` and B6's ``L_reg`` against ``geometric_prior(N, λ_p)``.

    Returns ``(total, {"rec": L_rec, "reg": L_reg})``; the parts are not detached.
    """
    rec = reconstruction_loss(outputs, labels, p)
    prior = geometric_prior(p.shape[1], lambda_p, dtype=p.dtype, device=p.device)
    reg = kl_regulariser(p, prior, direction, log_p=log_p)
    return rec + beta * reg, {"rec": rec, "reg": reg}


def pabee_loss(outputs: Tensor, labels: Tensor) -> Tensor:
    """PABEE's training loss (section (b), "other exit rules"): ``Σ_i i·L_i / Σ_i i``,
    ``L_i = mean_b ℓ(ŷ_{b,i}, y_b)``.

    ``i`` is 1-based, so deeper heads weigh more. ``outputs`` as in :func:`per_pass_loss` (one head per pass).
    """
    per_pass = per_pass_loss(outputs, labels).mean(dim=0)
    weights = torch.arange(1, per_pass.shape[0] + 1, dtype=per_pass.dtype, device=per_pass.device)
    return (weights * per_pass).sum() / weights.sum()


# ---------------------------------------------------------------------------- B9 and other exit rules


def q_exit(p: Tensor, q: float = 0.5) -> Tensor:
    """B9 Q-exit: first pass ``i`` with ``Σ_{j≤i} p_j > q`` (strictly), else the last pass.

    Args:
        p: ``[B, N]`` exit distribution (B4). Online agreement with :class:`ExitController` is exact
            for ``p = exit_distribution(λ)``.
        q: threshold (0.5 in B9); ``q >= 1`` never triggers, so every example runs all N passes.

    Returns:
        ``exit_idx`` ``[B]`` int64 in ``[0, N − 1]``.
    """
    b, n = _check_bn(p, "p")
    exit_idx = torch.full((b,), n - 1, dtype=torch.long, device=p.device)
    running = torch.ones(b, dtype=torch.bool, device=p.device)
    cdf = torch.zeros_like(p[:, 0])
    for i in range(n - 1):  # sequential sums: the online form adds in the same order
        cdf = cdf + p[:, i]
        now = running & (cdf > q)
        exit_idx[now] = i
        running &= ~now
    return exit_idx


def _uniform(n: int, generator: torch.Generator | None, device: torch.device) -> Tensor:
    # Always float32 so the draw does not depend on the λ dtype (bf16 uniforms would be coarse).
    return torch.rand(n, generator=generator, device=device, dtype=torch.float32)


def sample_exit(lambdas: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """PonderNet sampling: at pass ``i < N`` halt with probability ``λ_i`` (``u_i < λ_i``, ``u_i ~ U[0, 1)``);
    exit at the first success, else at pass N. ``P(exit at i) = p_i`` of B4.

    One ``torch.rand(B)`` is drawn per pass ``i < N`` (in order, float32, on ``lambdas.device``), which is
    the stream :class:`ExitController` consumes, so both agree for equally seeded generators.
    ``generator`` (None = the global RNG) must live on ``lambdas.device``.

    Returns:
        ``exit_idx`` ``[B]`` int64.
    """
    b, n = _check_bn(lambdas, "lambdas")
    exit_idx = torch.full((b,), n - 1, dtype=torch.long, device=lambdas.device)
    running = torch.ones(b, dtype=torch.bool, device=lambdas.device)
    for i in range(n - 1):
        now = running & (_uniform(b, generator, lambdas.device) < lambdas[:, i].float())
        exit_idx[now] = i
        running &= ~now
    return exit_idx


def _pabee_labels(preds: Tensor, regression_threshold: float | None, per_pass_dims: int) -> Tensor:
    """Reduce one pass's outputs to what PABEE compares: argmax class, given class id, or regression value.

    ``per_pass_dims`` is the rank of a plain label tensor: 2 offline (``[B, N]``), 1 online (``[n]``).
    """
    if regression_threshold is not None:
        if not preds.is_floating_point():
            raise ValueError("regression PABEE needs float predictions")
        if preds.dim() == per_pass_dims + 1 and preds.shape[-1] == 1:
            preds = preds[..., 0]
        if preds.dim() != per_pass_dims:
            raise ValueError(f"regression preds have shape {tuple(preds.shape)}")
        return preds
    if preds.is_floating_point():
        if preds.dim() != per_pass_dims + 1 or preds.shape[-1] < 2:
            raise ValueError(f"classification PABEE needs logits [..., C >= 2] or integer labels, got float "
                             f"shape {tuple(preds.shape)} (pass regression_threshold for regression)")
        return preds.argmax(dim=-1)
    if preds.dim() != per_pass_dims:
        raise ValueError(f"integer class predictions have shape {tuple(preds.shape)}")
    return preds


def _pabee_count(counter: Tensor, prev: Tensor | None, cur: Tensor, regression_threshold: float | None) -> Tensor:
    """PABEE patience counter after one pass: +1 if the prediction is unchanged (``|Δ| < threshold`` for
    regression), else reset to 0; 0 at the first pass."""
    if prev is None:
        return torch.zeros_like(counter)
    same = cur == prev if regression_threshold is None else (cur - prev).abs() < regression_threshold
    return torch.where(same, counter + 1, torch.zeros_like(counter))


def _check_patience(patience: int | None) -> int:
    if patience is None or int(patience) != patience or patience < 1:
        raise ValueError(f"PABEE patience must be an integer >= 1, got {patience!r}")
    return int(patience)


def pabee_exit(preds: Tensor, patience: int, *, regression_threshold: float | None = None) -> Tensor:
    """PABEE: exit once the prediction has been unchanged for ``patience`` consecutive passes, else at N.

    The counter rises by one at each pass whose prediction equals the previous pass's and resets
    otherwise (PABEE's reference code); the example exits at the first pass where it reaches
    ``patience`` — i.e. ``patience + 1`` equal predictions in a row.

    Args:
        preds: classification: logits ``[B, N, C]`` (argmax compared) or class ids ``[B, N]`` (int);
            regression: values ``[B, N]`` or ``[B, N, 1]`` together with ``regression_threshold``.
        patience: ``t >= 1``.
        regression_threshold: regression only: "unchanged" means ``|ŷ_i − ŷ_{i−1}| < threshold``
            (PABEE's code uses 0.2 for STS-B). ``None`` means classification.

    Returns:
        ``exit_idx`` ``[B]`` int64.
    """
    patience = _check_patience(patience)
    labels = _pabee_labels(preds, regression_threshold, per_pass_dims=2)
    b, n = labels.shape
    exit_idx = torch.full((b,), n - 1, dtype=torch.long, device=labels.device)
    running = torch.ones(b, dtype=torch.bool, device=labels.device)
    counter = torch.zeros(b, dtype=torch.long, device=labels.device)
    prev: Tensor | None = None
    for i in range(n):
        cur = labels[:, i]
        counter = _pabee_count(counter, prev, cur, regression_threshold)
        prev = cur
        now = running & (counter >= patience)
        exit_idx[now] = i
        running &= ~now
    return exit_idx


def last_exit(batch_size: int, num_passes: int, device: torch.device | str | None = None) -> Tensor:
    """Always-last baseline: every example runs all N passes (``exit_idx = N − 1``)."""
    return torch.full((batch_size,), num_passes - 1, dtype=torch.long, device=device)


def _expectation_term(p_i: Tensor, out_i: Tensor, regression: bool) -> Tensor:
    """One pass's share ``p_i ŷ_i`` of the expectation rule (probabilities for classification).
    Shared by offline and online code so both round identically."""
    if regression:
        return p_i.view(-1, *([1] * (out_i.dim() - 1))) * out_i
    return p_i[:, None] * torch.softmax(out_i, dim=-1)


def expected_prediction(outputs: Tensor, p: Tensor, *, regression: bool = False) -> Tensor:
    """Expectation rule: ``Σ_i p_i ŷ_i`` over all N passes (no early exit).

    Classification averages class *probabilities*: returns ``Σ_i p_{b,i} softmax(ŷ_{b,i})`` ``[B, C]``
    (as PALBERT's code; take ``.log()`` for logits, argmax is unchanged). Regression: ``outputs``
    ``[B, N]`` -> ``[B]`` (or ``[B, N, 1]`` -> ``[B, 1]``). Summed pass by pass, in the order
    :class:`ExitController` accumulates it.
    """
    b, n = _check_bn(p, "p")
    if outputs.shape[:2] != (b, n):
        raise ValueError(f"outputs {tuple(outputs.shape)} do not match p {tuple(p.shape)}")
    if not regression and outputs.dim() != 3:
        raise ValueError(f"classification outputs must be [B, N, C], got {tuple(outputs.shape)}")
    acc = _expectation_term(p[:, 0], outputs[:, 0], regression)
    for i in range(1, n):
        acc = acc + _expectation_term(p[:, i], outputs[:, i], regression)
    return acc


def gather_at_exit(outputs: Tensor, exit_idx: Tensor) -> Tensor:
    """``outputs[b, exit_idx[b]]``: the prediction each example exits with. ``[B, N, ...]`` -> ``[B, ...]``."""
    if outputs.dim() < 2 or exit_idx.shape != (outputs.shape[0],):
        raise ValueError(f"outputs {tuple(outputs.shape)} and exit_idx {tuple(exit_idx.shape)} do not match")
    return outputs[torch.arange(outputs.shape[0], device=outputs.device), exit_idx.to(outputs.device)]


# ------------------------------------------------------------------------------------------- online form


class ExitController:
    """Online form of the exit rules, fed one pass at a time for the still-running examples.

    At inference passes after the exit are not computed (B9), so the model shrinks its batch as
    examples exit. After computing pass ``pass_idx`` for the rows ``active`` (original batch indices,
    in the order the model holds them), call :meth:`step` with that pass's quantities for exactly
    those rows; it returns a bool mask over them, True = exits now (predict this pass's ŷ)::

        ctrl = ExitController("q", num_passes=N, batch_size=B, device=x.device)
        while not ctrl.done:
            rows = ctrl.active
            h = core_pass(h)                            # pass ctrl.pass_idx, running rows only
            c = pool(h); logits = head(c); lam = lambda_layer(c, c_prev)
            exits = ctrl.step(lambdas=lam, preds=logits)
            out[rows[exits]] = logits[exits]
            h, c_prev = h[~exits], c[~exits]
        # ctrl.exit_idx: [B] exit pass per example; ctrl.exit_idx + 1 passes were run

    Rules (state kept per running example):

    * ``"q"`` (B9): running survival ``∏(1 − λ_j)`` and CDF; needs ``lambdas`` ``[n]`` at passes < N.
      Equals ``q_exit(exit_distribution(λ), q)`` exactly.
    * ``"sample"``: one ``torch.rand(batch_size)`` draw per pass < N from ``generator`` (rows of exited
      examples are drawn and discarded); needs ``lambdas``. Equals ``sample_exit(λ, generator)`` for
      an equally seeded generator.
    * ``"pabee"``: previous prediction and patience counter; needs ``preds`` (logits ``[n, C]``, class ids
      ``[n]``, or regression values ``[n]``/``[n, 1]`` with ``regression_threshold``). Equals :func:`pabee_exit`.
    * ``"last"``: nothing; everyone exits at pass N (:func:`last_exit`).
    * ``"expectation"``: everyone runs N passes; accumulates ``Σ_i p_i ŷ_i`` into :attr:`expected`
      (``[B, C]`` probabilities, or ``[B]``/``[B, 1]`` with ``regression=True``). Needs ``lambdas`` at
      passes < N and ``preds`` at every pass. Equals ``expected_prediction(ŷ, exit_distribution(λ))``.

    At the last pass every running example exits and no inputs are needed (``λ_N`` is unused, B4).
    Exactness holds for identical per-row inputs; a model whose λ or logits change with the batch
    size (e.g. a different matmul blocking) must account for that itself.
    """

    def __init__(self, rule: ExitRule, num_passes: int, batch_size: int, *, q: float = 0.5,
                 patience: int | None = None, regression_threshold: float | None = None,
                 regression: bool = False, generator: torch.Generator | None = None,
                 device: torch.device | str | None = None) -> None:
        if rule not in EXIT_RULES:
            raise ValueError(f"rule must be one of {', '.join(EXIT_RULES)}; got {rule!r}")
        if num_passes < 1 or batch_size < 0:
            raise ValueError(f"need num_passes >= 1 and batch_size >= 0, got {num_passes}, {batch_size}")
        self.rule = rule
        self.num_passes = num_passes
        self.batch_size = batch_size
        self.q = q
        self.patience = _check_patience(patience) if rule == "pabee" else patience
        self.regression_threshold = regression_threshold
        self.regression = regression
        self.generator = generator
        device = torch.device("cpu") if device is None else torch.device(device)
        self.active = torch.arange(batch_size, device=device)
        self.exit_idx = torch.full((batch_size,), -1, dtype=torch.long, device=device)
        self.pass_idx = 0
        self._survive: Tensor | None = None  # q, expectation: ∏_{j<i}(1 − λ_j) of running rows
        self._cdf: Tensor | None = None  # q: Σ_{j<i} p_j of running rows
        self._acc: Tensor | None = None  # expectation: Σ_{j<i} p_j ŷ_j (nobody exits before N)
        self.expected: Tensor | None = None  # expectation: [B, ...] result, set at the last pass
        self._counter = torch.zeros(batch_size, dtype=torch.long, device=device)  # pabee
        self._prev: Tensor | None = None  # pabee: previous pass's prediction

    @property
    def done(self) -> bool:
        """True once every example has exited."""
        return self.active.numel() == 0 or self.pass_idx >= self.num_passes

    def _lambdas(self, lambdas: Tensor | None, n: int) -> Tensor:
        if lambdas is None:
            raise ValueError(f"rule {self.rule!r} needs lambdas at pass {self.pass_idx}")
        lam = lambdas.reshape(-1)
        if lam.shape[0] != n:
            raise ValueError(f"expected {n} lambdas (running examples), got shape {tuple(lambdas.shape)}")
        return lam

    def step(self, *, lambdas: Tensor | None = None, preds: Tensor | None = None) -> Tensor:
        """Advance one pass given ``lambdas``/``preds`` of the ``active`` rows, in order; returns exits ``[n]``."""
        if self.done:
            raise RuntimeError("all examples have already exited")
        n = self.active.numel()
        device = self.active.device
        last = self.pass_idx == self.num_passes - 1
        exits = torch.zeros(n, dtype=torch.bool, device=device)
        if self.rule == "q" and not last:
            lam = self._lambdas(lambdas, n)
            if self._survive is None or self._cdf is None:
                # Same starting values as exit_distribution / q_exit: ones/zeros in λ's dtype.
                self._survive, self._cdf = torch.ones_like(lam), torch.zeros_like(lam)
            p_i, self._survive = _halt_step(self._survive, lam)
            self._cdf = self._cdf + p_i
            exits = (self._cdf > self.q).to(device)
        elif self.rule == "sample" and not last:
            lam = self._lambdas(lambdas, n)
            u = _uniform(self.batch_size, self.generator, lam.device)
            exits = (u[self.active.to(lam.device)] < lam.float()).to(device)
        elif self.rule == "expectation":
            if preds is None or preds.shape[0] != n:
                raise ValueError(f"rule 'expectation' needs preds for the {n} running examples at pass "
                                 f"{self.pass_idx}, got {None if preds is None else tuple(preds.shape)}")
            if last:
                # p_N = ∏_{j<N}(1 − λ_j): the remaining mass (B4).
                p_i = self._survive if self._survive is not None else torch.ones(n, dtype=preds.dtype,
                                                                                 device=preds.device)
            else:
                lam = self._lambdas(lambdas, n)
                if self._survive is None:
                    self._survive = torch.ones_like(lam)
                p_i, self._survive = _halt_step(self._survive, lam)
            term = _expectation_term(p_i, preds, self.regression)
            self._acc = term if self._acc is None else self._acc + term
            if last:
                self.expected = self._acc.new_zeros((self.batch_size, *self._acc.shape[1:]))
                self.expected[self.active.to(self._acc.device)] = self._acc
        elif self.rule == "pabee":
            if preds is None:
                raise ValueError(f"rule 'pabee' needs preds at pass {self.pass_idx}")
            cur = _pabee_labels(preds, self.regression_threshold, per_pass_dims=1).to(device)
            if cur.shape[0] != n:
                raise ValueError(f"expected preds for {n} running examples, got shape {tuple(preds.shape)}")
            self._counter = _pabee_count(self._counter, self._prev, cur, self.regression_threshold)
            self._prev = cur
            assert self.patience is not None
            exits = self._counter >= self.patience
        if last:
            exits = torch.ones(n, dtype=torch.bool, device=device)

        self.exit_idx[self.active[exits]] = self.pass_idx
        keep = ~exits
        self.active = self.active[keep]
        self._counter = self._counter[keep]
        if self._prev is not None:
            self._prev = self._prev[keep]
        if self._survive is not None:
            self._survive = self._survive[keep.to(self._survive.device)]
        if self._cdf is not None:
            self._cdf = self._cdf[keep.to(self._cdf.device)]
        self.pass_idx += 1
        return exits
