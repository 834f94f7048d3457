"""AdaPonderLM and its baselines on one code path, composed around transformers' GPT-NeoX layers.

Equations are those of ``docs/method.md`` (part a), cited as A1–A20. The model owns a
``GPTNeoXModel`` only as the container of the Pythia backbone (embedding, layers, final layer norm,
rotary embedding), so parameter names equal ``GPTNeoXForCausalLM``'s and a Pythia checkpoint maps 1:1.
The pass loop drives the layers itself; the only hook into them is the public ``layer_past.update``.

This file travels with saved checkpoints (``auto_map``): standard library, torch and transformers only.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AttentionInterface, GenerationMixin, GPTNeoXModel, PreTrainedModel
from transformers import initialization as hf_init
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.gpt_neox.modeling_gpt_neox import eager_attention_forward

from .configuration_adaponder import AdaPonderConfig
from .input_checks import (ModelInputError, TokenIdError, check_generation_length, check_input_kind, check_positions,
                           check_token_ids)
from .ponder_cache import KVAligner, PonderCache, TokenSubset
from .pondering import linear_cross_entropy, pondering_from_hidden, skinny_linear

_GATE_ACTS = {"gelu": nn.GELU, "relu": nn.ReLU, "silu": nn.SiLU, "tanh": nn.Tanh}


@dataclass
class PassContext:
    """Per-call inputs shared by all passes (see ``AdaPonderForCausalLM.pass_context``)."""

    x0: torch.Tensor  # W_E[x], [B, T, d]
    E0: torch.Tensor  # first-pass input, c·Ẽ[x] (A1)
    batch: int
    length: int
    past: int  # tokens already in the cache
    valid: torch.Tensor  # [B, T] non-padding
    key_padding: torch.Tensor | None  # [B, past + T], None when nothing is padded
    full_mask: torch.Tensor | None  # the attention mask when every token is computed
    rope: tuple[torch.Tensor, torch.Tensor]
    impl: str

    def select_rows(self, rows: torch.Tensor) -> "PassContext":
        """The same context for a subset of the batch (examples that have not exited yet)."""
        pick = lambda t: None if t is None else t.index_select(0, rows)  # noqa: E731
        rope = tuple(t.index_select(0, rows) if t.shape[0] > 1 else t for t in self.rope)
        return PassContext(pick(self.x0), pick(self.E0), int(rows.numel()), self.length, self.past,
                           pick(self.valid), pick(self.key_padding), pick(self.full_mask), rope, self.impl)


@dataclass
class AdaPonderCausalLMOutput(CausalLMOutputWithPast):
    """``CausalLMOutputWithPast`` plus halting statistics.

    lm_loss: A10 (equal to ``loss``; the trainer adds the ponder loss itself).
    exit_pass: ``[B, T]`` long, D_t of A8 (1..K).
    gate_values: ``[B, T, K-1]`` gate outputs s^i_t (A5); 0 where the gate was not evaluated.
    gate_mask: ``[B, T, K-1]`` bool, the gates of the pool G of A11 (active, not padding).
    active_fraction: ``[K]`` fraction of non-padding tokens active in each pass.
    pass_logits: the logits z^i of every pass (only with ``return_pass_logits=True``).
    """

    lm_loss: torch.Tensor | None = None
    exit_pass: torch.Tensor | None = None
    gate_values: torch.Tensor | None = None
    gate_mask: torch.Tensor | None = None
    active_fraction: torch.Tensor | None = None
    pass_logits: tuple[torch.Tensor, ...] | None = None


class SkinnyLinear(nn.Linear):
    """``nn.Linear`` (same parameters and state dict) whose products of a few rows — a decode step at small batch —
    run by blocks of the weight on the CPU, where MKL's own GEMV is slow (:func:`~.pondering.skinny`). Used for the
    output head, the gates' input layers and, retyped in place, the backbone layers' linear maps."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return skinny_linear(x, self.weight, self.bias)


class GateOutput(nn.Linear):
    """The gate's last layer, a type of its own so weight init can start it at s ≈ 1 (A5)."""


class PauseEmbeddings(nn.Module):
    """The P learnable pause vectors of A19, one per pause slot, shared by every position."""

    def __init__(self, num_pauses: int, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_pauses, hidden_size))

    def interleave(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, d]`` token embeddings → ``[B, T·(P+1), d]``: each token followed by the P pauses."""
        batch, length, d = x.shape
        pauses = self.weight.to(x.dtype)[None, None].expand(batch, length, -1, -1)
        return torch.cat([x[:, :, None], pauses], dim=2).reshape(batch, -1, d)


@dataclass(frozen=True)
class GateWarmup:
    """How the gates act in a training step of the warm-up (A13 **[choice]**, ``schedule.gate_warmup``); the
    trainer passes one to :meth:`AdaPonderForCausalLM.forward` while the warm-up lasts, None afterwards.

    bypass: the PonderLM regime, s ≡ 1 and m ≡ 1: the gates are not run (and receive no gradient).
    halting: False keeps every token active (m ≡ 1) while the gates still scale the update (A7).
    logit_floor: the gates' logit is clamped from below (s ≥ σ(floor)), so cross-entropy cannot push a gate
        into the flat tail of the sigmoid where its gradient (σ' ≈ s) is gone.
    """

    bypass: bool = False
    halting: bool = True
    logit_floor: float | None = None


class PonderGate(nn.Module):
    """Iteration-specific halting gate (A5): ``s = σ(Linear(d, m·d) → act → Linear(m·d, 1))``."""

    def __init__(self, config: AdaPonderConfig):
        super().__init__()
        width = config.gate_hidden_mult * config.hidden_size
        self.fc_in = SkinnyLinear(config.hidden_size, width)
        self.act = _GATE_ACTS[config.gate_activation]()
        self.fc_out = GateOutput(width, 1)

    def forward(self, hidden: torch.Tensor, logit_floor: float | None = None) -> torch.Tensor:
        logit = self.fc_out(self.act(self.fc_in(hidden))).squeeze(-1).float()
        if logit_floor is not None:
            logit = logit.clamp(min=logit_floor)
        return torch.sigmoid(logit)


def ponder_loss(gate_values: torch.Tensor, gate_mask: torch.Tensor, k: float) -> torch.Tensor:
    """Bottom-k ponder loss (A11–A12): the mean of the ⌈k·|G|⌉ smallest gate values of the pool G.

    ``gate_mask`` selects G (gates of active, non-padding tokens). Returns 0 (with a graph) when G is
    empty or k = 0, so the trainer can always add ``λ·ponder_loss``.

    |G| stays on the device: gates outside G sort last (+inf) and a prefix mask keeps the n smallest, so the
    training step does not wait for the device to learn n (a boolean-mask gather or ``topk(n)`` would).
    """
    if k <= 0:
        return gate_values.sum() * 0.0
    flat, mask = gate_values.reshape(-1), gate_mask.reshape(-1)
    ordered = torch.where(mask, flat, torch.full_like(flat, math.inf)).sort().values
    n = torch.ceil(mask.sum().double() * k)  # ⌈k·|G|⌉, in double precision as the host would compute it
    keep = torch.arange(flat.numel(), device=flat.device) < n
    return torch.where(keep, ordered, torch.zeros_like(ordered)).sum() / n.clamp(min=1).to(flat.dtype)


def _model_type(path: str) -> str | None:
    import json
    import os

    with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
        return json.load(fh).get("model_type")


def _attention_mask(
    q_slot: torch.Tensor, kv_len: int, key_padding: torch.Tensor | None, impl: str, dtype: torch.dtype
) -> torch.Tensor | None:
    """Causal mask over cache slots for queries at cache positions ``q_slot`` ``[B', Tq]``.

    A query may attend to keys at slots ≤ its own that are not padding. Padded queries still see
    themselves, so no row is empty (no NaN that a 0-weight could carry into the loss).
    """
    if impl == "flash_attention_2":
        return key_padding.long() if key_padding is not None else None
    kpos = torch.arange(kv_len, device=q_slot.device)
    q = q_slot[:, None, :, None]
    allowed = kpos <= q
    if key_padding is not None:
        allowed = allowed & key_padding[:, None, None, :]
    allowed = allowed | (kpos == q)
    if impl == "eager":
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )
    return allowed


PACKED_ATTENTION = "adaponder_packed"


def packed_attention(module, query, key, value, attention_mask, ponder_subset: TokenSubset, ponder_impl: str,
                     **kwargs):
    """Attention of a compacted pass, whose projections ran on its N active tokens flat (``query``
    ``[1, heads, N, hd]``): the queries go to their rows' packed layout ``[R, heads, Tq, hd]`` (zeros in the padding
    slots), attend to those rows' K/V (``key``/``value`` ``[R, heads, S, hd]``, from :class:`KVAligner`) under the
    pass's mask with the model's own attention implementation ``ponder_impl``, and come back flat,
    ``[1, N, heads, hd]``. Routed here through ``AttentionInterface`` while the pass runs."""
    s, heads, hd = ponder_subset, query.shape[1], query.shape[3]
    q = s.pad(query[0].transpose(0, 1)).transpose(1, 2)  # [N, heads, hd] → [R, Tq, heads, hd] → [R, heads, Tq, hd]
    inner = ALL_ATTENTION_FUNCTIONS.get_interface(ponder_impl, eager_attention_forward)
    out, _ = inner(module, q, key, value, attention_mask, **kwargs)  # [R, Tq, heads, hd]
    return s.unpad(out.reshape(*s.token.shape, heads, hd))[None], None


AttentionInterface.register(PACKED_ATTENTION, packed_attention)


@contextlib.contextmanager
def _attention_implementation(config, name: str):
    """Route the layers' attention to ``name`` for the duration (transformers looks it up in the config per call)."""
    previous = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = previous


class AdaPonderPreTrainedModel(PreTrainedModel):
    config_class = AdaPonderConfig
    config: AdaPonderConfig
    base_model_prefix = "gpt_neox"
    supports_gradient_checkpointing = True
    _no_split_modules = ["GPTNeoXLayer"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_attention_backend = False
    _keys_to_ignore_on_load_unexpected = [r"attention.bias", r"attention.masked_bias"]

    @torch.no_grad()
    def _init_weights(self, module):
        cfg = self.config
        if isinstance(module, GateOutput):
            # s ≈ 1 at start (A5): gates begin by letting every token ponder. (``hf_init`` skips
            # tensors loaded from a checkpoint.)
            hf_init.normal_(module.weight, mean=0.0, std=cfg.initializer_range)
            hf_init.constant_(module.bias, cfg.gate_init_bias)
            return
        if cfg.init == "pythia" and isinstance(module, (nn.Linear, nn.Embedding, PauseEmbeddings)):
            init_pythia_(module, *init_std(cfg, "input"))  # head, gate input layers, pause vectors
            return
        if isinstance(module, PauseEmbeddings):
            hf_init.normal_(module.weight, mean=0.0, std=cfg.initializer_range)
            return
        super()._init_weights(module)


@torch.no_grad()
def init_pythia_(module: nn.Module, std: float, truncated: bool) -> None:
    """Weight ~ N(0, std²) (truncated at ±3σ when asked), bias 0 (A20)."""
    if truncated:
        hf_init.trunc_normal_(module.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)
    else:
        hf_init.normal_(module.weight, mean=0.0, std=std)
    if getattr(module, "bias", None) is not None:
        hf_init.zeros_(module.bias)


class PythiaBackbone(GPTNeoXModel):
    """transformers' ``GPTNeoXModel`` (same modules, names and forward) whose weight initialisation
    follows ``config.init`` (A20): the backbone initialises itself when constructed, so its scheme
    has to live here rather than in the outer model."""

    config_class = AdaPonderConfig

    def __init__(self, config: AdaPonderConfig):
        super().__init__(config)
        # The layers' nn.Linear instances become SkinnyLinear (a subclass: same parameters, names and state dict)
        # so that a decode step's few-row products run blocked. The instances are retyped (as
        # torch.nn.utils.parametrize does) rather than replaced by new modules: under ZeRO-3 the layers are built
        # inside deepspeed.zero.Init, which hooks every module constructed there; building replacements inside it
        # left the process with partitioned parameters in the next model it built (a ZeRO-1 run after a ZeRO-3 one).
        for module in self.layers.modules():
            if type(module) is nn.Linear:
                module.__class__ = SkinnyLinear

    @torch.no_grad()
    def _init_weights(self, module):
        if self.config.init == "pythia" and isinstance(module, (nn.Linear, nn.Embedding)):
            residual_out = any(module is layer.attention.dense or module is layer.mlp.dense_4h_to_h
                               for layer in self.layers)
            init_pythia_(module, *init_std(self.config, "output" if residual_out else "input"))
            return
        super()._init_weights(module)


def init_std(cfg: AdaPonderConfig, role: str) -> tuple[float, bool]:
    """Standard deviation of a weight under ``init: pythia`` (A20) and whether it is truncated at ±3σ.

    ``role`` is ``"input"`` (embedding, QKV, MLP up-projection, head, pause vectors, gate input layer) or
    ``"output"`` (attention and MLP output projections, which feed the residual stream).
    Vanilla/loop/pause: GPT-NeoX's ``small_init`` σ = sqrt(2/(5d)) and ``wang_init`` σ = 2/(L·sqrt(d)),
    plain normal, as the Pythia configs use them. Pondering modes: PonderLM's truncated normal with
    σ = sqrt(2/(5d)), output projections divided by sqrt(2·L·K).
    """
    d, L, K = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_passes
    small = math.sqrt(2.0 / (5.0 * d))
    if cfg.ponders:
        return (small / math.sqrt(2.0 * L * K) if role == "output" else small), True
    return (2.0 / (L * math.sqrt(d)) if role == "output" else small), False


class AdaPonderForCausalLM(AdaPonderPreTrainedModel, GenerationMixin):
    """Looped Pythia: K passes of the whole GPT-NeoX stack with pondering feedback and halting gates.

    ``config.mode`` selects the method or a baseline on this one code path:
    ``vanilla`` (K = 1), ``ponderlm`` (no gates), ``loop`` (hidden-state feedback), ``adaponder``.
    """

    _tied_weights_keys = {"lm_head.weight": "gpt_neox.embed_in.weight"}

    def __init__(self, config: AdaPonderConfig):
        super().__init__(config)
        self.gpt_neox = PythiaBackbone(config)
        self.lm_head = SkinnyLinear(config.hidden_size, config.vocab_size, bias=False)
        n_gates = config.num_passes - 1 if config.gated else 0
        self.gates = nn.ModuleList([PonderGate(config) for _ in range(n_gates)])
        self.pause_embeddings = PauseEmbeddings(config.num_pauses, config.hidden_size) if config.num_pauses else None
        self.pass_checkpointing = False
        self.post_init()

    # -- building from a backbone -------------------------------------------------------------------
    @classmethod
    def from_backbone(cls, source, mode: str = "adaponder", dtype: torch.dtype | None = None, **overrides):
        """Load a local GPT-NeoX/Pythia (or AdaPonder) checkpoint — a directory or a model object — into
        any mode, for continued pretraining (A14).

        The backbone (embedding, layers, final norm, output head) is copied unchanged; gates that the
        source lacks are freshly initialised with s ≈ 1 (``gate_init_bias``). ``overrides`` set
        recurrence fields (``passes``, ``input_scale``, ``halting_threshold``, …).
        """
        import os

        from transformers import GPTNeoXForCausalLM

        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            if not os.path.isfile(os.path.join(path, "config.json")):
                raise FileNotFoundError(
                    f"{path}: not a Hugging Face checkpoint directory (expected {path}/config.json)"
                )
            src_type = _model_type(path)
            if src_type == "adaponder":
                source = cls.from_pretrained(path, dtype=dtype)
            elif src_type == "gpt_neox":
                source = GPTNeoXForCausalLM.from_pretrained(path, dtype=dtype)
            else:
                raise ValueError(f"{path}: model_type {src_type!r} is not GPT-NeoX/Pythia or AdaPonder")
        if not isinstance(source, (GPTNeoXForCausalLM, AdaPonderForCausalLM)):
            raise TypeError(f"expected a GPTNeoXForCausalLM or AdaPonderForCausalLM, got {type(source).__name__}")
        src_cfg = source.config.to_dict()
        shape_keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                      "max_position_embeddings", "rope_parameters", "use_parallel_residual", "layer_norm_eps",
                      "tie_word_embeddings", "hidden_act", "attention_bias", "initializer_range", "bos_token_id",
                      "eos_token_id", "pad_token_id", "hidden_dropout", "attention_dropout")
        values = {k: src_cfg[k] for k in shape_keys if k in src_cfg}
        if isinstance(source, AdaPonderForCausalLM):
            values.update({k: src_cfg[k] for k in ("input_scale", "embedding_multiplier", "gate_hidden_mult",
                                                      "gate_activation", "gate_init_bias", "halting_threshold")})
            if mode == src_cfg["mode"]:
                values["passes"] = src_cfg["passes"]
        values["mode"] = mode
        values.update(overrides)
        config = AdaPonderConfig(**values)
        model = cls(config)
        state = source.state_dict()
        own = model.state_dict()
        kept = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
        missing = [k for k in own if k not in kept and not k.startswith("gates.")]
        if missing:
            raise ValueError(f"backbone weights missing from the source checkpoint: {missing[:5]}")
        model.load_state_dict(kept, strict=False)
        return model.to(dtype) if dtype is not None else model

    # -- HF plumbing ------------------------------------------------------------------------------
    def get_input_embeddings(self):
        return self.gpt_neox.embed_in

    def set_input_embeddings(self, value):
        self.gpt_neox.embed_in = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        """Checkpoint whole passes. transformers' per-layer checkpointing would drop ``layer_past`` and
        with it the K/V alignment (A3), so we checkpoint around each pass instead."""
        self.pass_checkpointing = True

    def gradient_checkpointing_disable(self):
        self.pass_checkpointing = False

    @property
    def is_gradient_checkpointing(self) -> bool:
        return self.pass_checkpointing

    # -- the forward (A1–A10) ---------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: Cache | None = None,
        labels: torch.LongTensor | None = None,
        shift_labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        return_pass_logits: bool = False,
        return_logits: bool = True,
        halting_policy=None,
        gate_warmup: GateWarmup | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> AdaPonderCausalLMOutput:
        r"""Run K passes (A1–A9) and, with ``labels`` (HF convention: shifted inside) or ``shift_labels``
        (already aligned with the inputs), the LM loss on the exit-pass logits (A10).

        With ``use_cache`` a :class:`PonderCache` is filled (prefill, A16) or extended (decoding, A15);
        an empty cache of another type (e.g. the ``DynamicCache`` that ``generate`` makes) is replaced.
        ``return_logits=False`` (training) computes the loss in chunks without the ``[B, T, V]`` logits.
        ``halting_policy(pass_idx, active, s, valid) -> bool [B, T]`` replaces the threshold rule of A6
        (which tokens stay active after this pass); the mask stays monotone whatever it returns.
        ``gate_warmup`` (:class:`GateWarmup`, training's warm-up only) bypasses, floors or stops the gates' halting.
        """
        cfg = self.config
        cache = cache if cache is not None else past_key_values
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if use_cache is None:
            use_cache = cache is not None or (cfg.use_cache and not self.training)
        cache = self._ponder_cache(cache) if use_cache else None
        self._check_inputs(input_ids, inputs_embeds, labels, shift_labels, cache.get_seq_length() if cache is not None else 0)
        stride = cfg.num_pauses + 1  # backbone positions per real token (A19; 1 outside pause mode)
        if stride > 1:
            inputs_embeds, attention_mask, position_ids = self._insert_pauses(
                input_ids, inputs_embeds, attention_mask, position_ids)
            input_ids = None
        ctx = self.pass_context(input_ids, attention_mask, position_ids, inputs_embeds, cache)
        x0, batch, length, valid = ctx.x0, ctx.batch, ctx.length, ctx.valid
        device = x0.device
        compact_ok = cfg.compact_inference and ctx.impl != "flash_attention_2" and not torch.is_grad_enabled()

        K = cfg.num_passes
        E = ctx.E0
        aligner = KVAligner(cfg.num_hidden_layers, cache)
        active = torch.ones(batch, length, dtype=torch.bool, device=device)  # m¹ = 1 (A2)
        exit_pass = torch.ones(batch, length, dtype=torch.long, device=device)
        h_hat = None  # final-LN hidden state of each token's exit pass; ẑ = W_out ĥ (A9)
        gate_values, gate_masks, active_fraction, pass_logits = [], [], [], []
        n_valid = valid.sum().clamp(min=1)
        grad = torch.is_grad_enabled()

        subset = None  # the tokens pass i computes when compacting (A16); None: all of them
        for i in range(1, K + 1):
            active_fraction.append((active & valid).sum() / n_valid)
            if subset is not None and subset.num_tokens == 0:  # every token halted: later passes only carry K/V (A15)
                for j in range(i, K + 1):
                    aligner.carry_forward(j)
                break
            h_flat, state_flat = self.run_pass(E, ctx, i, aligner, active if i > 1 else None, subset)
            # A9 on hidden states: the head runs once, on each token's exit-pass state, instead of
            # keeping a B×T×V logits tensor per pass.
            if subset is not None:  # no gradients here: overwrite the active tokens' rows in place
                h_hat[subset.b_idx, subset.t_idx] = h_flat
            else:
                h_i = h_flat.reshape(batch, length, -1)
                h_hat = h_i if h_hat is None else torch.where(active[..., None], h_i, h_hat)
            if return_pass_logits:
                pass_logits.append(self.lm_head(self._unflatten(h_flat, subset, batch, length)))
            if i == K:
                break
            if cfg.mode == "loop":  # Loop Transformer: the hidden state (pre final-LN) feeds the next pass
                E = self._unflatten(state_flat, subset, batch, length)
                exit_pass = exit_pass + 1
                continue
            if not cfg.ponders:
                break
            s = None
            if cfg.gated and not (gate_warmup is not None and gate_warmup.bypass):
                s_flat = self.gates[i - 1](h_flat, None if gate_warmup is None else gate_warmup.logit_floor)  # A5
                s = self._unflatten(s_flat, subset, batch, length)
                gate_values.append(torch.where(active, s, torch.zeros_like(s)))
                gate_masks.append(active & valid)
                if gate_warmup is not None and not gate_warmup.halting:
                    next_active = active
                elif halting_policy is None:
                    next_active = active & (s >= cfg.halting_threshold).detach()  # A6 (no gradient through 1[·])
                else:  # e.g. fixed pruning at equal FLOPs (iso-FLOPs control); kept monotone
                    next_active = active & halting_policy(i, active, s.detach(), valid).bool()
            else:
                next_active = active
            # Without gradients, the tokens that go on — pondered now, computed by the next pass — are found
            # once, with the pass's only host synchronisation (none while no gate can halt a token).
            going_on = None if grad or next_active is active else TokenSubset.from_mask(next_active)
            E = self._ponder_update(E, h_flat, s, next_active, subset, going_on, grad)  # A4, A7
            exit_pass = exit_pass + next_active.long()  # A8: D_t counts the passes a token was active in
            active = next_active
            compact = compact_ok and going_on is not None and going_on.num_tokens < batch * length
            subset = going_on if compact else None

        while len(active_fraction) < K:
            active_fraction.append(active_fraction[-1] * 0)
        if stride > 1:  # A19: x_{t+1} is predicted at the last pause after x_t; no other position is scored
            h_hat, exit_pass = h_hat[:, stride - 1::stride], exit_pass[:, stride - 1::stride]
            pass_logits = [z[:, stride - 1::stride] for z in pass_logits]
            length = length // stride
        targets = self._targets(labels, shift_labels)
        if not return_logits:  # training: A10 chunked, the [B, T, V] logits never exist
            logits = None
            lm_loss = None if targets is None else linear_cross_entropy(
                h_hat.reshape(-1, h_hat.shape[-1]), self.lm_head.weight, targets.reshape(-1).to(device),
                cfg.ponder_chunk_size)
        else:
            if logits_to_keep and targets is None:  # generate(): only the last logits are needed
                h_hat = h_hat[:, -logits_to_keep:] if isinstance(logits_to_keep, int) else h_hat[:, logits_to_keep]
            logits = self.lm_head(h_hat)
            lm_loss = None if targets is None else F.cross_entropy(
                logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1).to(device), ignore_index=-100)
            if logits_to_keep and logits.shape[1] == length:
                logits = logits[:, -logits_to_keep:] if isinstance(logits_to_keep, int) else logits[:, logits_to_keep]

        gv = gm = None
        if gate_values:
            gv = torch.stack(gate_values, dim=-1)
            gm = torch.stack(gate_masks, dim=-1)
            if gv.shape[-1] < K - 1:  # stopped early: the remaining gates were never evaluated
                pad = K - 1 - gv.shape[-1]
                gv = F.pad(gv, (0, pad))
                gm = F.pad(gm, (0, pad))
        return AdaPonderCausalLMOutput(
            loss=lm_loss,
            logits=logits,
            cache=cache,
            lm_loss=lm_loss,
            exit_pass=exit_pass,
            gate_values=gv,
            gate_mask=gm,
            active_fraction=torch.stack(active_fraction),
            pass_logits=tuple(pass_logits) if return_pass_logits else None,
        )

    def generate(self, inputs: torch.Tensor | None = None, *args, **kwargs):
        """``GenerationMixin.generate`` after :meth:`forward`'s input checks, and a check that the prompt plus
        the tokens asked for fit the positions: transformers' own code would index an empty prompt, or embed an
        id outside the vocabulary, before any forward runs, and would decode past the positions silently."""
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        if isinstance(ids, torch.Tensor):
            self._check_inputs(ids, None, None, None)
            gen = kwargs.get("generation_config") or self.generation_config
            check_generation_length(self.config.max_position_embeddings, ids.shape[-1],
                                    kwargs.get("max_new_tokens", gen.max_new_tokens),
                                    kwargs.get("max_length", gen.max_length), self.config.num_pauses + 1)
        return super().generate(inputs, *args, **kwargs)

    # -- pieces of the pass loop ---------------------------------------------------------------
    def _check_inputs(self, input_ids, inputs_embeds, labels, shift_labels, past: int = 0) -> None:
        """Wrong dtype or shape, empty input, more positions than the model has (:mod:`.input_checks`: host
        values only), ids outside the vocabulary and labels with nothing to score (:func:`check_token_ids`)
        raise here, once per call, rather than deep inside the passes. The value checks cost a host sync; they
        are skipped when training on an accelerator (the data loaders range-check every batch they serve, and
        every packed sample has targets) and while ``torch.compile`` traces (a data-dependent branch would break
        the graph)."""
        check_input_kind(input_ids, inputs_embeds)
        x = input_ids if input_ids is not None else inputs_embeds
        if x.shape[:2].numel() == 0:
            raise TokenIdError(f"the input is empty (shape {tuple(x.shape)}); expected at least one token per row")
        check_positions(self.config.max_position_embeddings, x.shape[1], past, self.config.num_pauses + 1)
        if torch.compiler.is_compiling() or (self.training and x.device.type != "cpu"):
            return
        check_token_ids(self.config.vocab_size, input_ids=input_ids, labels=labels, shift_labels=shift_labels)

    def _insert_pauses(self, input_ids, inputs_embeds, attention_mask, position_ids):
        """A19: the backbone's inputs with P pause embeddings after every token. Masks and positions
        follow the expansion (a pause is padding when its token is; positions stay consecutive), so
        callers — ``generate``, lm-eval, perplexity — pass plain text and get one logit per token."""
        stride = self.config.num_pauses + 1
        x = self.gpt_neox.embed_in(input_ids) if inputs_embeds is None else inputs_embeds
        embeds = self.pause_embeddings.interleave(x)
        if attention_mask is not None:
            attention_mask = attention_mask.repeat_interleave(stride, dim=-1)
        if position_ids is not None:
            offsets = torch.arange(stride, device=position_ids.device)
            position_ids = (position_ids[..., None] * stride + offsets).flatten(-2)
        return embeds, attention_mask, position_ids

    def _ponder_cache(self, cache: Cache | None) -> PonderCache:
        if isinstance(cache, PonderCache):
            return cache
        if cache is None or cache.get_seq_length() == 0:
            return PonderCache(self.config.num_passes, self.config.num_hidden_layers)
        raise TypeError(
            f"AdaPonder needs a PonderCache (keyed by pass and layer); got a non-empty {type(cache).__name__}"
        )

    def pass_context(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None,
                     cache: PonderCache | None = None) -> "PassContext":
        """Everything a pass needs besides its input: embeddings, masks, rotary tables (A1, A2)."""
        cfg = self.config
        x0 = self.gpt_neox.embed_in(input_ids) if inputs_embeds is None else inputs_embeds
        batch, length = x0.shape[:2]
        past = cache.get_seq_length() if cache is not None else 0
        device = x0.device
        if attention_mask is not None and attention_mask.shape[-1] not in (length, past + length):
            raise ValueError(
                f"attention_mask has length {attention_mask.shape[-1]}, expected {past + length} "
                f"(past {past} + new {length})"
            )
        key_padding = None
        if attention_mask is not None and not bool(attention_mask.all()):
            key_padding = attention_mask.bool()
            if key_padding.shape[-1] == length and past:
                key_padding = torch.cat([key_padding.new_ones(batch, past), key_padding], dim=-1)
        valid = key_padding[:, -length:] if key_padding is not None else torch.ones(
            batch, length, dtype=torch.bool, device=device
        )
        if position_ids is None:
            position_ids = torch.arange(past, past + length, device=device).unsqueeze(0)
        position_ids = position_ids.expand(batch, length)
        impl = cfg._attn_implementation or "sdpa"
        q_slot = torch.arange(past, past + length, device=device).expand(batch, length)
        full_mask = None
        if impl == "eager" or key_padding is not None or (past > 0 and length > 1):
            full_mask = _attention_mask(q_slot, past + length, key_padding, impl, x0.dtype)
        cos, sin = self.gpt_neox.rotary_emb(x0, position_ids)
        E0 = x0 * cfg.first_pass_scale if cfg.first_pass_scale != 1.0 else x0  # E⁰ = c·Ẽ[x] (A1)
        return PassContext(x0, E0, batch, length, past, valid, key_padding, full_mask, (cos, sin), impl)

    def run_pass(self, E, ctx: "PassContext", pass_idx: int, aligner: KVAligner | None = None,
                 active: torch.Tensor | None = None, subset: TokenSubset | None = None):
        """Run the layer stack once over ``E`` (A3) and return the final-LN hidden states of the computed
        tokens flattened to ``[N, d]`` (N = B·T, or the active tokens when ``subset`` is set), and the
        pre-norm hidden states in the same layout (the Loop Transformer's feedback).

        ``aligner`` carries K/V alignment (A3) and the cache across passes; a fresh one (no cache) is
        used when omitted, e.g. by the sequence classifier, whose passes see every token.
        """
        aligner = aligner if aligner is not None else KVAligner(self.config.num_hidden_layers, None)
        cos, sin = ctx.rope
        attention = contextlib.nullcontext()
        if subset is not None:
            # Compacted pass (A16): projections and MLPs run on the N active tokens flat, [1, N, d], so no padding
            # slot of the packed [R, Tq] layout costs a GEMM row; only attention regroups them by row.
            hidden = subset.gather(E)[None]
            rope = (subset.gather(cos)[None], subset.gather(sin)[None])
            kp = subset.select_rows(ctx.key_padding) if ctx.key_padding is not None else None
            mask = _attention_mask(ctx.past + subset.token, ctx.past + E.shape[1], kp, ctx.impl, E.dtype)
            extra = {"ponder_subset": subset, "ponder_impl": ctx.impl}
            attention = _attention_implementation(self.config, PACKED_ATTENTION)
        else:
            hidden, mask, rope, extra = E, ctx.full_mask, ctx.rope, {}

        def stack(h):
            # Set inside, so that a checkpointed pass recomputed during backward sees its own pass state.
            aligner.begin_pass(pass_idx, active, subset)
            h = self.gpt_neox.emb_dropout(h)
            for layer in self.gpt_neox.layers:
                h = layer(h, attention_mask=mask, layer_past=aligner, position_embeddings=rope, **extra)
            return h

        with attention:
            if self.pass_checkpointing and self.training and torch.is_grad_enabled():
                hidden = checkpoint(stack, hidden, use_reentrant=False)
            else:
                hidden = stack(hidden)
        out = self.gpt_neox.final_layer_norm(hidden)
        return out.reshape(-1, out.shape[-1]), hidden.reshape(-1, hidden.shape[-1])

    def _ponder_update(self, E, h_flat, s, next_active, subset, going_on, grad):
        """``E^i = E^{i-1} + m^{i+1}·s^i·e^i`` (A7) with ``e^i = softmax(W_out h^i)·Ẽ`` (A4).

        Training computes e for every token (masked). Without gradients only the tokens that go on to the
        next pass need it — ``going_on``, a :class:`TokenSubset` of ``next_active``; None when no gate can
        halt, i.e. all of them — so only those are computed (A15–A17: D−1 pondering products). ``h_flat``
        holds the rows of ``subset``'s tokens (all tokens when it is None).
        """
        batch, length = E.shape[:2]
        if grad:
            e = self._unflatten(self.ponder_from_hidden(h_flat), subset, batch, length)
            step = 1.0 if s is None else (next_active.to(s.dtype) * s).to(E.dtype)[..., None]
            return E + step * e
        if going_on is None:
            return E + self.ponder_from_hidden(h_flat).reshape(batch, length, -1)
        n = going_on.num_tokens
        if n == 0:
            return E
        if n == h_flat.shape[0]:  # every computed token goes on: h_flat's rows, in order
            rows = None
        elif subset is None:
            rows = going_on.b_idx * length + going_on.t_idx
        else:  # positions, among the computed tokens, of those that go on (size known: no host sync)
            rows = torch.nonzero_static(next_active[subset.b_idx, subset.t_idx], size=n).squeeze(1)
        b_idx, t_idx = going_on.b_idx, going_on.t_idx
        e = self.ponder_from_hidden(h_flat if rows is None else h_flat.index_select(0, rows))
        if s is not None:
            e = e * s[b_idx, t_idx].to(e.dtype)[:, None]
        if n == batch * length:  # all of them (row-major order): no gather/scatter of E
            return E + e.reshape(batch, length, -1)
        return E.index_put((b_idx, t_idx), E[b_idx, t_idx] + e)

    def ponder_from_hidden(self, h_flat: torch.Tensor) -> torch.Tensor:
        """A4 from final-LN hidden states ``[N, d]``, chunked, never storing ``[N, V]`` for backward."""
        return pondering_from_hidden(h_flat, self.lm_head.weight, self.gpt_neox.embed_in.weight,
                                     self.config.embedding_scale, self.config.ponder_chunk_size,
                                     recompute=self.config.ponder_recompute)

    @staticmethod
    def _unflatten(flat: torch.Tensor, subset: TokenSubset | None, batch: int, length: int) -> torch.Tensor:
        if subset is None:
            return flat.reshape(batch, length, *flat.shape[1:])
        full = flat.new_zeros(batch, length, *flat.shape[1:])
        full[subset.b_idx, subset.t_idx] = flat
        return full

    @staticmethod
    def _targets(labels, shift_labels):
        """Next-token targets aligned with the inputs (A10): ``shift_labels`` as given, or ``labels``
        shifted left (HF convention); -100 is ignored."""
        if shift_labels is not None:
            return shift_labels
        if labels is not None:
            return F.pad(labels[:, 1:], (0, 1), value=-100)
        return None

    def external_parameters(self) -> list[nn.Parameter]:
        """Parameters read outside their own module's ``forward``: the pondering embedding (A4) and the
        chunked loss use ``W_out`` and ``W_E`` directly. Under DeepSpeed ZeRO-3 register them on the
        model (``deepspeed.zero.register_external_parameter(model, p)``, as the trainer does) so they are
        gathered for the whole forward; the model itself stays free of DeepSpeed. Tied weights appear once."""
        params = [self.gpt_neox.embed_in.weight, self.lm_head.weight]
        return [p for i, p in enumerate(params) if all(p is not q for q in params[:i])]

    # -- accounting (A17) ------------------------------------------------------------------------
    def parameter_counts(self) -> dict[str, int]:
        """Parameters by part: ``embedding`` (input embedding + output head), ``non_embedding``
        (layers and final norm), ``gates`` (A5), and ``total``. Works on the meta device."""
        emb = self.gpt_neox.embed_in.weight.numel()
        if self.lm_head.weight is not self.gpt_neox.embed_in.weight:
            emb += self.lm_head.weight.numel()
        layers = sum(p.numel() for p in self.gpt_neox.layers.parameters())
        layers += sum(p.numel() for p in self.gpt_neox.final_layer_norm.parameters())
        gates = sum(p.numel() for p in self.gates.parameters())
        return {"embedding": emb, "non_embedding": layers, "gates": gates, "total": emb + layers + gates}

    def flops_per_token(self, exit_pass: torch.Tensor | None = None, context: int | None = None,
                        training: bool = False) -> dict[str, float]:
        """FLOPs per token from the realised exit passes (A17).

        Convention: a matmul of an ``m×n`` weight costs 2·m·n FLOPs per token (forward); attention adds
        2·2·ctx·d per layer (scores and weighted sum), no causal discount, with ``ctx`` the context
        length (default: ``max_position_embeddings``); layer norms, softmax and rotary are not counted.
        A token with exit pass D costs D backbone passes and D head products (2dV each), D−1 pondering
        products ``softmax(z)·Ẽ`` (2dV each) and min(D, K−1) gate MLPs. ``training=True`` multiplies
        by 3 (forward + backward). ``exit_pass`` (any shape; padding excluded by the caller) defaults to
        K for every token. Returns the mean per token of each part, their ``total`` and ``mean_passes``.
        ``context`` counts real tokens; in ``pause`` mode (A19) each token occupies P+1 backbone positions,
        so the backbone runs P+1 times per token over a (P+1)× longer context, and the head once.
        """
        cfg = self.config
        d, L, V, K = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.num_passes
        stride = cfg.num_pauses + 1
        ctx = (context if context is not None else cfg.max_position_embeddings // stride) * stride
        ff = cfg.intermediate_size
        per_layer = (2 * (d * 3 * d + d * d + 2 * d * ff) + 4 * ctx * d) * stride
        if exit_pass is None:
            D = torch.full((1,), float(K))
        else:
            D = exit_pass.float().reshape(-1).cpu()
        mean_d = float(D.mean())
        mean_gates = float(torch.clamp(D, max=K - 1).mean()) if cfg.gated else 0.0
        gate_cost = 2 * (d * cfg.gate_hidden_mult * d + cfg.gate_hidden_mult * d)
        pondering = float((D - 1).mean()) * 2 * d * V if cfg.ponders else 0.0
        parts = {
            "backbone": mean_d * L * per_layer,
            "head": mean_d * 2 * d * V,
            "pondering": pondering,
            "gates": mean_gates * gate_cost,
        }
        mult = 3.0 if training else 1.0
        parts = {k: v * mult for k, v in parts.items()}
        parts["total"] = sum(parts.values())
        parts["mean_passes"] = mean_d
        return parts

    def kv_cache_bytes_per_token(self) -> int:
        """KV-cache bytes per token: ``K · L · 2 · d · bytes``, whatever the token's exit pass. The
        :class:`PonderCache` keeps K and V of every layer in every pass for every token (a token that halted
        at pass D holds its pass-D K/V in passes j > D, A15), so halting saves compute, not cache memory."""
        cfg = self.config
        return cfg.num_passes * cfg.num_hidden_layers * 2 * cfg.hidden_size * self.dtype.itemsize


__all__ = ["AdaPonderForCausalLM", "AdaPonderPreTrainedModel", "AdaPonderCausalLMOutput", "GateWarmup", "PonderGate",
           "ModelInputError", "TokenIdError", "check_token_ids", "ponder_loss"]
