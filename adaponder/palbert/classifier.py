"""PALBERT mode (docs/method.md (b)): the recurrent core as a sequence classifier that learns when to stop.

Exit points are the passes i = 1..N of the core (``palbert_passes``, independent of the LM's K). After
pass i the pooled vector ``c_i`` (B1) feeds one shared head (B2) and the Lambda layer (B3); training
minimises the PonderNet loss (B4–B7). At inference :meth:`AdaPonderForSequenceClassification.predict`
runs pass by pass and drops examples from the batch as they exit (B9): passes after the exit are never
computed, for any rule.

Feedback between passes is the core's: ``E ← E + softmax(W_out h)·Ẽ`` (A4, A7 with s = 1) for the
pondering modes (and ``vanilla``, whose Ẽ = W_E), ``E ← pre-norm hidden`` for ``loop``. Gates (A5) are
not used: every token of a classified sequence runs every pass it reaches, so a checkpoint in mode
``adaponder`` is loaded as ``ponderlm`` (same feedback and scaling, no gates).

Methods (``palbert_method``; one switch, one code path — STYLE 8):

* ``palbert``: Lambda layer on ``[c_i ; c_{i−1}]`` (B3), PonderNet loss.
* ``pondernet``: baseline, Lambda = Linear on ``c_i`` only, PonderNet loss.
* ``pabee``: baseline, one head per pass, PABEE loss ``Σ i·L_i / Σ i``, no Lambda layer.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

import torch
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForSequenceClassification
from transformers import initialization as hf_init
from transformers.utils import ModelOutput

from adaponder.core_modes import CLASSIFIER_CORE_MODES, classifier_core_mode
from adaponder.hub import checkpoint_source
from adaponder.modeling import AdaPonderConfig, AdaPonderConfigError, AdaPonderForCausalLM
from adaponder.modeling.exit_rules import ExitRule, NoHalting, PassView, check_rule
from adaponder.modeling.modeling_adaponder import AdaPonderPreTrainedModel, PassContext
from adaponder.modeling.pass_driver import drive
from adaponder.palbert.pondernet import (
    EXIT_RULES,
    KL_DIRECTIONS,
    METHODS,
    ExitController,
    LambdaLayer,
    exit_distribution,
    expected_prediction,
    gather_at_exit,
    last_exit,
    log_exit_distribution,
    pabee_exit,
    pabee_loss,
    pondernet_loss,
    q_exit,
    rules_for_method,
    sample_exit,
)

__all__ = [
    "PalbertConfig",
    "PalbertOutput",
    "PalbertPrediction",
    "AdaPonderForSequenceClassification",
    "ControllerExit",
    "PooledLayout",
    "last_token_index",
    "offline_exit",
    "predictions_from_outputs",
]


@strict
class PalbertConfig(AdaPonderConfig):
    r"""The core's configuration plus the classifier of section (b).

    Fields (besides the core's and ``num_labels``/``classifier_dropout`` from ``PretrainedConfig``/GPT-NeoX):
        palbert_passes: N, exit points = passes of the core (B1).
        palbert_method: ``palbert`` | ``pondernet`` | ``pabee`` (module docstring).
        pooler: apply ``tanh(Linear(d, d))`` to the pooled vector (B1, optional).
        lambda_layers / lambda_dropout / lambda_init_bias: the Lambda layer (B3); ``lambda_init_bias``
            (``None`` = PyTorch default) sets the initial ``b_o``.
        ponder_beta / ponder_lambda_p / kl_direction: the loss (B6, B7): β, the geometric prior's λ_p and
            ``prior_to_p`` = KL(p_G ‖ p) (PALBERT's code) or ``p_to_prior`` = KL(p ‖ p_G) (the papers).
        pabee_regression_threshold: PABEE's "unchanged" tolerance for regression (STS-B).
    ``num_labels == 1`` means regression (MSE, STS-B).
    """

    model_type = "adaponder_palbert"

    mode: str = "ponderlm"
    palbert_passes: int = 4
    palbert_method: str = "palbert"
    pooler: bool = False
    lambda_layers: int = 3
    lambda_dropout: float = 0.1
    lambda_init_bias: float | None = None
    ponder_beta: float = 0.5
    ponder_lambda_p: float = 0.1
    kl_direction: str = "prior_to_p"
    pabee_regression_threshold: float = 0.2

    @property
    def is_regression(self) -> bool:
        return self.num_labels == 1

    def validate_architecture(self):
        problems: list[str] = []
        try:
            super().validate_architecture()
        except AdaPonderConfigError as err:
            problems += err.problems
        problems += palbert_problems(self)
        if problems:
            raise AdaPonderConfigError(problems)


PalbertConfig._auto_class = None  # not remote-code loadable: it imports adaponder.palbert


def palbert_problems(cfg) -> list[str]:
    """Every inconsistency among the classifier fields of ``cfg`` (a :class:`PalbertConfig` or namespace)."""
    problems = []
    if cfg.mode not in CLASSIFIER_CORE_MODES:
        core = classifier_core_mode(cfg.mode)
        hint = f" (load a '{cfg.mode}' checkpoint with from_backbone: it becomes '{core}')" if core != cfg.mode else ""
        problems.append(f"'mode' of a classifier core must be one of {', '.join(CLASSIFIER_CORE_MODES)}; "
                        f"got {cfg.mode!r}{hint}")
    if not isinstance(cfg.palbert_passes, int) or cfg.palbert_passes < 1:
        problems.append(f"'palbert_passes' (N) must be an integer >= 1, got {cfg.palbert_passes!r}")
    if cfg.palbert_method not in METHODS:
        problems.append(f"'palbert_method' must be one of {', '.join(METHODS)}; got {cfg.palbert_method!r}")
    if cfg.lambda_layers < 0:
        problems.append(f"'lambda_layers' must be >= 0, got {cfg.lambda_layers}")
    for key in ("lambda_dropout", "classifier_dropout"):
        val = getattr(cfg, key, 0.0)
        if val is not None and not 0.0 <= val < 1.0:
            problems.append(f"'{key}' must lie in [0, 1), got {val}")
    if cfg.ponder_beta < 0:
        problems.append(f"'ponder_beta' (β) must be >= 0, got {cfg.ponder_beta}")
    if not 0.0 < cfg.ponder_lambda_p < 1.0:
        problems.append(f"'ponder_lambda_p' (λ_p) must lie in (0, 1), got {cfg.ponder_lambda_p}")
    if cfg.kl_direction not in KL_DIRECTIONS:
        problems.append(f"'kl_direction' must be one of {', '.join(KL_DIRECTIONS)}; got {cfg.kl_direction!r}")
    if cfg.pabee_regression_threshold <= 0:
        problems.append(f"'pabee_regression_threshold' must be > 0, got {cfg.pabee_regression_threshold}")
    return problems


# ------------------------------------------------------------------------------------------------ outputs


@dataclass
class PalbertOutput(ModelOutput):
    """Training/offline forward of all N passes.

    loss: B7 (PonderNet) or PABEE's loss, when labels are given.
    logits: the last pass's outputs ``[B, C]`` (HF convention; ``C = 1`` for regression).
    pass_logits: outputs of every pass ``[B, N, C]``.
    lambda_logits / lambdas: ``[B, N]`` (λ_N is unused by B4: logit 0 / λ 1 there); None for PABEE.
    p: exit distribution ``[B, N]`` (B4); None for PABEE.
    rec / reg: the parts of the PonderNet loss (B5, B6), detached.
    """

    loss: Tensor | None = None
    logits: Tensor | None = None
    pass_logits: Tensor | None = None
    lambda_logits: Tensor | None = None
    lambdas: Tensor | None = None
    p: Tensor | None = None
    rec: Tensor | None = None
    reg: Tensor | None = None


@dataclass
class PalbertPrediction:
    """Online inference result (:meth:`AdaPonderForSequenceClassification.predict`).

    outputs: ``[B, C]`` — the exit pass's logits (classification) or value ``[B, 1]`` (regression); for
        ``expectation`` the expected class probabilities ``Σ p_i softmax(ŷ_i)`` (or expected value).
    preds: ``[B]`` class ids (argmax) or float values.
    exit_pass: ``[B]`` 1-based pass each example exited at (it ran that many passes).
    pass_rows: Σ over passes of the examples computed in that pass (= exit_pass.sum()).
    token_rows: Σ over passes of the (examples × sequence length) positions computed (padding included).
    """

    outputs: Tensor
    preds: Tensor
    exit_pass: Tensor
    pass_rows: int
    token_rows: int


def last_token_index(attention_mask: Tensor | None, batch: int, length: int, device=None) -> Tensor:
    """B1: index of the last non-padding token of each row ``[B]`` (works for left or right padding)."""
    if attention_mask is None:
        return torch.full((batch,), length - 1, dtype=torch.long, device=device)
    mask = attention_mask[:, -length:].bool()
    if not bool(mask.any(dim=1).all()):
        raise ValueError("every row needs at least one non-padding token")
    pos = torch.arange(length, device=mask.device).expand_as(mask)
    return torch.where(mask, pos, torch.full_like(pos, -1)).amax(dim=1)


# ------------------------------------------------------------------------------------------------- model


class AdaPonderForSequenceClassification(AdaPonderPreTrainedModel):
    """Sequence classification / regression on the recurrent core with learned early exit (section (b))."""

    config_class = PalbertConfig
    config: PalbertConfig
    base_model_prefix = "core"
    _auto_class = None

    def __init__(self, config: PalbertConfig):
        super().__init__(config)
        self.core = AdaPonderForCausalLM(config)
        d, n = config.hidden_size, config.palbert_passes
        self.pooler = nn.Sequential(nn.Linear(d, d), nn.Tanh()) if config.pooler else None
        self.dropout = nn.Dropout(config.classifier_dropout or 0.0)
        n_heads = n if config.palbert_method == "pabee" else 1  # B2: one shared head; PABEE: a head per pass
        self.heads = nn.ModuleList([nn.Linear(d, config.num_labels) for _ in range(n_heads)])
        self.lambda_layer = None
        if config.palbert_method != "pabee":
            self.lambda_layer = LambdaLayer(d, config.lambda_dropout, config.palbert_method,
                                            num_layers=config.lambda_layers, init_bias=config.lambda_init_bias)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if self.lambda_layer is not None and module is self.lambda_layer.out \
                and self.config.lambda_init_bias is not None:
            hf_init.constant_(module.bias, self.config.lambda_init_bias)

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_backbone(cls, source, *, num_labels: int = 2, palbert_method: str = "palbert",
                      palbert_passes: int = 4, mode: str | None = None, dtype: torch.dtype | None = None,
                      attn_implementation: str | None = None, revision: str | None = None,
                      **overrides) -> "AdaPonderForSequenceClassification":
        """A fresh classifier on the backbone of a GPT-NeoX/Pythia or AdaPonder checkpoint (a local directory, a
        hub id ``org/name`` at ``revision`` resolved as ``--init`` is, or a model object). The core's weights are
        copied; heads and the Lambda layer are new.

        ``mode`` (default: the checkpoint's; ``vanilla`` for GPT-NeoX; ``adaponder`` → ``ponderlm``) picks
        the feedback between passes. ``attn_implementation`` (default: the backbone's) is fixed at construction.
        ``overrides`` set :class:`PalbertConfig` fields.
        """
        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(checkpoint_source(source, revision))
            source = path
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise FileNotFoundError(f"{path}: not a Hugging Face checkpoint directory (no config.json)")
            with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
                meta = json.load(fh)
            if meta.get("model_type") == PalbertConfig.model_type:
                source = cls.from_pretrained(path, dtype=dtype).core
                meta = source.config.to_dict()
            src_mode = meta.get("mode", "vanilla") if meta.get("model_type") != "gpt_neox" else "vanilla"
        else:
            src_mode = getattr(source.config, "mode", "vanilla")
        mode = classifier_core_mode(mode or src_mode)
        core_kw = {} if mode == "vanilla" else {"passes": 1}  # the LM's K is not used by the classifier
        core = AdaPonderForCausalLM.from_backbone(source, mode=mode, dtype=dtype, **core_kw)
        fields = {f.name for f in dataclasses.fields(AdaPonderConfig)}
        fields -= {"id2label", "label2id", "num_labels", "transformers_version", "architectures"}
        values = {k: v for k, v in core.config.to_dict().items() if k in fields}
        values.update(mode=mode, num_labels=num_labels, palbert_method=palbert_method,
                      palbert_passes=palbert_passes, **overrides)
        config = PalbertConfig(**values)
        config._attn_implementation = attn_implementation or core.config._attn_implementation
        model = cls(config)
        model.core.load_state_dict(core.state_dict())
        return model.to(dtype) if dtype is not None else model

    # -- parameters ------------------------------------------------------------------------------
    def lambda_parameters(self) -> list[nn.Parameter]:
        return [] if self.lambda_layer is None else list(self.lambda_layer.parameters())

    def param_groups(self, lr: float, lambda_lr: float, weight_decay: float = 0.0) -> list[dict]:
        """Optimizer groups of B8: backbone + pooler + heads at ``lr``, the Lambda layer at ``lambda_lr``.
        Parameters that never receive a gradient (the LM head in loop mode) are left out."""
        lam = {id(p) for p in self.lambda_parameters()}
        unused = set()
        if self.config.mode == "loop":
            unused = {id(self.core.lm_head.weight)} - {id(self.core.gpt_neox.embed_in.weight)}
        main = [p for p in self.parameters() if id(p) not in lam and id(p) not in unused and p.requires_grad]
        groups = [{"params": main, "lr": lr, "weight_decay": weight_decay, "name": "main"}]
        if lam:
            groups.append({"params": self.lambda_parameters(), "lr": lambda_lr, "weight_decay": weight_decay,
                           "name": "lambda"})
        return groups

    def external_parameters(self) -> list[nn.Parameter]:
        """Parameters read outside their own module's ``forward``: the pondering feedback (A4) uses the core's
        ``W_out`` and ``W_E`` directly; loop feedback reads none. DeepSpeed ZeRO-3 gathers them for the whole
        forward once registered (``adaponder.train.distributed.create_engine``)."""
        return [] if self.config.mode == "loop" else self.core.external_parameters()

    # -- pieces of a pass ------------------------------------------------------------------------
    def _pool(self, h_flat: Tensor, batch: int, length: int, last: Tensor) -> Tensor:
        """B1: final-LN hidden state of each row's last real token (then the optional tanh pooler)."""
        h = h_flat.view(batch, length, -1)
        c = h[torch.arange(batch, device=h.device), last]
        return self.pooler(c) if self.pooler is not None else c

    def _head(self, pass_idx: int, c: Tensor) -> Tensor:
        """B2: ``ŷ_i = W_c · dropout(c_i) + b_c`` (PABEE: the head of pass i)."""
        head = self.heads[pass_idx - 1] if len(self.heads) > 1 else self.heads[0]
        return head(self.dropout(c))

    # -- training / offline forward --------------------------------------------------------------
    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                labels: Tensor | None = None, inputs_embeds: Tensor | None = None, **kwargs) -> PalbertOutput:
        """All N passes for every example: per-pass outputs, λ, p (B1–B4) and, with ``labels``, the loss
        (B5–B7, or PABEE's). Evaluation applies the exit rules to this offline (:func:`offline_exit`)."""
        cfg = self.config
        core = self.core
        ctx = core.pass_context(input_ids, attention_mask, inputs_embeds=inputs_embeds)
        batch, length = ctx.batch, ctx.length
        last = last_token_index(attention_mask, batch, length, ctx.x0.device)
        passes = drive(core, PooledLayout(self, ctx, last, training=True), NoHalting())  # all N passes (B1–B4)
        outs, lam_logits = passes.outs, passes.lam_logits
        pass_logits = torch.stack(outs, dim=1).float()
        out = PalbertOutput(logits=pass_logits[:, -1], pass_logits=pass_logits)
        if self.lambda_layer is not None:
            z = torch.stack(lam_logits + [pass_logits.new_zeros(batch)], dim=1).float()  # λ_N unused (B4)
            lambdas = torch.sigmoid(z)
            lambdas = torch.cat([lambdas[:, :-1], torch.ones_like(lambdas[:, -1:])], dim=1)
            out.lambda_logits, out.lambdas, out.p = z, lambdas, exit_distribution(lambdas)
        if labels is not None:
            labels = labels.to(pass_logits.device)
            labels = labels.float() if cfg.is_regression else labels.long()
            if self.lambda_layer is None:
                out.loss = pabee_loss(pass_logits, labels)
            else:
                loss, parts = pondernet_loss(pass_logits, labels, out.p, beta=cfg.ponder_beta,
                                             lambda_p=cfg.ponder_lambda_p, direction=cfg.kl_direction,
                                             log_p=log_exit_distribution(out.lambda_logits))
                out.loss, out.rec, out.reg = loss, parts["rec"].detach(), parts["reg"].detach()
        return out

    # -- online inference with early exit (B9) ---------------------------------------------------
    @torch.no_grad()
    def predict(self, input_ids: Tensor, attention_mask: Tensor | None = None, rule: str | ExitRule = "q", *,
                q: float = 0.5, patience: int | None = None, generator: torch.Generator | None = None,
                trim: bool = True) -> PalbertPrediction:
        """Run pass by pass; examples that exit leave the batch, so later passes run only for the rest.

        ``rule``: ``q`` (B9, threshold ``q``), ``sample`` (PonderNet: Bernoulli(λ_i), ``generator``),
        ``expectation`` (Σ p_i ŷ_i, all passes), ``last``, ``pabee`` (``patience`` t), or an
        :class:`~adaponder.modeling.exit_rules.ExitRule` applied per example (its view: ``logits`` the pass's head
        outputs, ``hidden`` the pooled vector, ``lambda`` λ_i, ``token_ids`` the pooled token's id). With ``trim``,
        trailing sequence positions that are padding for every remaining row are dropped too (exact:
        attention is causal). The model is put in eval mode for the call.
        """
        cfg = self.config
        if isinstance(rule, ExitRule):
            check_rule(rule)  # its needs name known fields (ExitRuleError naming the rule's class)
            if "lambda" in rule.needs and self.lambda_layer is None:
                raise ValueError(f"{rule!r} needs λ; a '{cfg.palbert_method}' model has no Lambda layer")
        elif rule not in EXIT_RULES:
            raise ValueError(f"rule must be one of {', '.join(EXIT_RULES)}; got {rule!r}")
        elif rule not in rules_for_method(cfg.palbert_method):
            raise ValueError(f"rule {rule!r} needs a Lambda layer; a '{cfg.palbert_method}' model supports "
                             f"{', '.join(rules_for_method(cfg.palbert_method))}")
        if rule == "pabee" and patience is None:
            raise ValueError("rule 'pabee' needs patience")
        was_training = self.training
        self.eval()
        try:
            return self._predict(input_ids, attention_mask, rule, q, patience, generator, trim)
        finally:
            self.train(was_training)

    def _predict(self, input_ids, attention_mask, rule, q, patience, generator, trim) -> PalbertPrediction:
        cfg, core = self.config, self.core
        n = cfg.palbert_passes
        ctx = core.pass_context(input_ids, attention_mask)
        batch = ctx.batch
        last = last_token_index(attention_mask, batch, ctx.length, ctx.x0.device)
        if trim:
            ctx = _trim_context(ctx, int(last.max()) + 1)
        ctrl = None
        if isinstance(rule, ExitRule):
            ids = input_ids[torch.arange(batch, device=last.device), last] if input_ids is not None else None
        else:
            ids = None
            ctrl = ExitController(rule, n, batch, q=q, patience=patience, regression=cfg.is_regression,
                                  regression_threshold=cfg.pabee_regression_threshold if cfg.is_regression else None,
                                  generator=generator, device=ctx.x0.device)
            rule = ControllerExit(ctrl)
        passes = drive(core, PooledLayout(self, ctx, last, training=False, trim=trim, token_ids=ids,
                                          keep_outputs=ctrl is None or ctrl.rule != "expectation",
                                          decides_last=ctrl is not None), rule)
        outputs = passes.outputs
        if ctrl is not None and ctrl.rule == "expectation":
            outputs = ctrl.expected.reshape(batch, -1)
        preds = outputs[:, 0] if cfg.is_regression else outputs.argmax(dim=-1)
        return PalbertPrediction(outputs, preds, passes.exit_idx + 1, passes.pass_rows, passes.token_rows)


class ControllerExit:
    """The evaluation rules of :class:`~adaponder.palbert.pondernet.ExitController` (``q``, ``sample``, ``pabee``,
    ``last``, ``expectation``) as an exit rule for the pass driver: the controller keeps its per-example state and
    decides the last pass itself (``expectation`` reads the last pass's outputs), so the layout does not force it."""

    needs = frozenset({"lambda", "logits"})
    carries = False
    decides_last = True

    def __init__(self, ctrl: ExitController):
        self.ctrl = ctrl

    def stops(self, view: PassView) -> Tensor:
        return self.ctrl.step(lambdas=view.lam, preds=view.logits)

    def __repr__(self) -> str:
        return f"ControllerExit({self.ctrl.rule!r})"


class PooledLayout:
    """The classifier's layout for the pass driver: one pooled vector per example (B1) over the rows of the examples
    still running. ``training``: every pass's head outputs and λ logits are kept for the loss (the rule used there
    stops nobody early); otherwise each example's output is that of its exit pass, and examples that exit leave the
    batch before the feedback is formed, so later passes run only for the rest (B9; with ``trim``, trailing positions
    that are padding for every remaining row are dropped too — exact: attention is causal)."""

    def __init__(self, model: "AdaPonderForSequenceClassification", ctx: PassContext, last: Tensor, *,
                 training: bool, trim: bool = False, token_ids: Tensor | None = None, keep_outputs: bool = True,
                 decides_last: bool = False):
        self.model, self.ctx, self.last = model, ctx, last
        self.n = model.config.palbert_passes
        self.training, self.trim, self.token_ids, self.keep_outputs = training, trim, token_ids, keep_outputs
        self.decides_last = decides_last  # the rule decides the last pass itself (:class:`ControllerExit`)
        device = ctx.x0.device
        self.rows = torch.arange(ctx.batch, device=device)  # the examples still running, as batch indices
        self.exit_idx = torch.full((ctx.batch,), -1, dtype=torch.long, device=device)
        self.outputs = torch.zeros(ctx.batch, model.config.num_labels, device=device)
        self.outs, self.lam_logits = [], []
        self.E, self.c_prev, self.i, self.carry = ctx.E0, None, 0, None
        self.pass_rows = self.token_rows = 0

    def running(self) -> bool:
        return self.i < self.n and self.rows.numel() > 0

    def run_pass(self):
        self.i += 1
        self.pass_rows += self.ctx.batch
        self.token_rows += self.ctx.batch * self.ctx.length
        return self.model.core.run_pass(self.E, self.ctx, self.i)

    def exit_view(self, h_flat, needs):
        model, i, n, ctx = self.model, self.i, self.n, self.ctx
        c = model._pool(h_flat, ctx.batch, ctx.length, self.last)
        out = model._head(i, c)
        lam = None
        if model.lambda_layer is not None and i < n:
            if self.training:
                self.lam_logits.append(model.lambda_layer.logits(c, self.c_prev))
            else:
                lam = model.lambda_layer(c, self.c_prev).float()
        if self.training:
            self.outs.append(out)
        else:
            out = out.float()
        self.c, self.out = c, out
        view = PassView(pass_idx=i, num_passes=n, active=torch.ones(ctx.batch, dtype=torch.bool, device=c.device),
                        logits=out if "logits" in needs else None, hidden=c if "hidden" in needs else None, lam=lam,
                        token_ids=None if self.token_ids is None else self.token_ids[self.rows], carry=self.carry)
        return view, i == n and not self.decides_last

    def feedback(self, h_flat, pre_flat, going):
        """Exits recorded; the next pass's input for the rows that go on: the pondering embedding added (A4, A7 with
        s = 1) or, in loop mode, the pre-norm hidden state. Padding positions keep their input (nothing real attends
        to them)."""
        i, ctx = self.i, self.ctx
        if self.training:
            if i == self.n:
                return None
            self.c_prev = self.c
        else:
            exits = ~going
            if self.keep_outputs:
                self.outputs[self.rows[exits]] = self.out[exits]
            self.exit_idx[self.rows[exits]] = i - 1
            self.rows = self.rows[going]
            if self.carry is not None:
                self.carry = self.carry[going]
            if i == self.n or self.rows.numel() == 0:
                return None
            if bool(exits.any()):  # exited rows leave the batch before the feedback is formed
                keep = going.nonzero().squeeze(1)
                h_flat = h_flat.view(ctx.batch, ctx.length, -1).index_select(0, keep)
                pre_flat = pre_flat.view(ctx.batch, ctx.length, -1).index_select(0, keep)
                self.E, self.c_prev, self.last = (x.index_select(0, keep) for x in (self.E, self.c, self.last))
                ctx = ctx.select_rows(keep)
                length = int(self.last.max()) + 1 if self.trim else ctx.length
                if length < ctx.length:
                    self.E, h_flat, pre_flat = self.E[:, :length], h_flat[:, :length], pre_flat[:, :length]
                    ctx = _trim_context(ctx, length)
                self.ctx = ctx
                h_flat = h_flat.reshape(-1, h_flat.shape[-1])
                pre_flat = pre_flat.reshape(-1, pre_flat.shape[-1])
            else:
                self.c_prev = self.c
        flat = self.E.reshape(-1, self.E.shape[-1])
        if self.model.config.mode == "loop" or bool(ctx.valid.all()):
            return dict(E=flat, hidden=h_flat, state=pre_flat)
        idx = ctx.valid.reshape(-1).nonzero().squeeze(1)
        return dict(E=flat, dest=idx, hidden=h_flat.index_select(0, idx))

    def advance(self, E, going):
        if E is not None:
            self.E = E.view(self.E.shape)


def _trim_context(ctx: PassContext, length: int) -> PassContext:
    """The context restricted to the first ``length`` positions (no-op when already that short)."""
    if length >= ctx.length:
        return ctx
    cut = lambda t: None if t is None else t[:, :length]  # noqa: E731
    mask = ctx.full_mask[..., :length, :ctx.past + length] if ctx.full_mask is not None else None
    kp = ctx.key_padding[:, :ctx.past + length] if ctx.key_padding is not None else None
    return dataclasses.replace(ctx, x0=cut(ctx.x0), E0=cut(ctx.E0), length=length, valid=cut(ctx.valid),
                               key_padding=kp, full_mask=mask, rope=tuple(t[:, :length] for t in ctx.rope),
                               ids=cut(ctx.ids))


# ----------------------------------------------------------------------------------- offline exit rules


def offline_exit(out: PalbertOutput, rule: str, *, q: float = 0.5, patience: int | None = None,
                 regression: bool = False, regression_threshold: float | None = None,
                 generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Apply an exit rule to a full N-pass forward: returns ``(outputs [B, C], exit_idx [B] 0-based)``,
    identical to what :meth:`~AdaPonderForSequenceClassification.predict` computes online."""
    pl = out.pass_logits
    b, n = pl.shape[:2]
    if rule == "q":
        idx = q_exit(out.p, q)
    elif rule == "sample":
        idx = sample_exit(out.lambdas, generator)
    elif rule == "last":
        idx = last_exit(b, n, pl.device)
    elif rule == "pabee":
        idx = pabee_exit(pl, patience, regression_threshold=regression_threshold if regression else None)
    elif rule == "expectation":
        return expected_prediction(pl, out.p, regression=regression), last_exit(b, n, pl.device)
    else:
        raise ValueError(f"rule must be one of {', '.join(EXIT_RULES)}; got {rule!r}")
    return gather_at_exit(pl, idx), idx


def predictions_from_outputs(outputs: Tensor, regression: bool) -> Tensor:
    """Class ids (argmax) or regression values ``[B]`` from ``[B, C]`` outputs."""
    return outputs[:, 0] if regression else outputs.argmax(dim=-1)


AutoConfig.register(PalbertConfig.model_type, PalbertConfig, exist_ok=True)
AutoModelForSequenceClassification.register(PalbertConfig, AdaPonderForSequenceClassification, exist_ok=True)
