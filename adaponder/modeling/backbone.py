"""The Pythia backbone and where a model's weights come from: the GPT-NeoX container whose linear maps decode fast
at small batch, weight initialisation (A5's gate start, A20), the pause vectors (A19), and building a model in any
mode from a GPT-NeoX/Pythia or AdaPonder checkpoint (A14).

This file travels with saved checkpoints (``auto_map``): standard library, torch and transformers only.
"""

from __future__ import annotations

import json
import math
import os

import torch
from torch import nn
from transformers import GPTNeoXForCausalLM, GPTNeoXModel, PreTrainedModel
from transformers import initialization as hf_init
from transformers.activations import ACT2FN
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.gpt_neox.modeling_gpt_neox import (GPTNeoXAttention, GPTNeoXLayer, GPTNeoXMLP,
                                                            GPTNeoXRotaryEmbedding, apply_rotary_pos_emb,
                                                            eager_attention_forward)

from .attention import attention_for
from .configuration_adaponder import AdaPonderConfig
from .pass_heads import DraftHead, PassHeads
from .pass_step import GateOutput, SkinnyLinear


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


def _model_type(path: str) -> str | None:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
        return json.load(fh).get("model_type")


class AdaPonderPreTrainedModel(PreTrainedModel):
    config_class = AdaPonderConfig
    config: AdaPonderConfig
    base_model_prefix = "gpt_neox"
    supports_gradient_checkpointing = True
    _no_split_modules = ["GPTNeoXLayer", "PonderLayer"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_attention_backend = False
    _keys_to_ignore_on_load_unexpected = [r"attention.bias", r"attention.masked_bias"]

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """transformers' loader (a folder, or a hub id at ``revision``). Offline, a hub id missing from the cache is
        first reported as ``init.backbone`` reports it, one error naming the id and revision, instead of
        transformers' connection error that names neither; a caller's own ``cache_dir`` is left to transformers."""
        if kwargs.get("cache_dir") is None:
            _require_cached_offline(pretrained_model_name_or_path, kwargs.get("revision"))
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module):
        cfg = self.config
        drafts = [getattr(self, "draft_head", None), *getattr(self, "redraft_heads", dict)().values()]
        for draft in drafts:
            if draft is not None and any(module is m for m in draft.modules()):  # its own recipe, whichever part
                draft.reset_parameters(cfg.initializer_range)                    # is visited
                return
        if isinstance(module, PassHeads):
            module.reset_parameters(cfg.initializer_range)
            return
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


class PonderAttention(GPTNeoXAttention):
    """transformers' ``GPTNeoXAttention`` (same parameters, names and math) built with :class:`SkinnyLinear`
    projections, whose attention function is chosen per call from the call's own arguments
    (:func:`~.attention.attention_for`: packed for a compacted pass, per row for a depth-batched tick, else the
    config's implementation) instead of from a config written for the pass."""

    def __init__(self, config, layer_idx=None):
        # GPTNeoXAttention.__init__ without its nn.Linear maps: each module is built once, of its final type (under
        # ZeRO-3 every module built inside deepspeed.zero.Init is partitioned, a discarded one included).
        nn.Module.__init__(self)
        self.config = config
        self.head_size = config.hidden_size // config.num_attention_heads
        self.attention_dropout = config.attention_dropout
        partial_rotary_factor = config.rope_parameters.get("partial_rotary_factor", 1.0)
        self.rotary_ndims = int(self.head_size * partial_rotary_factor)
        self.scaling = self.head_size**-0.5
        self.is_causal = True
        self.layer_idx = layer_idx
        self.query_key_value = SkinnyLinear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.dense = SkinnyLinear(config.hidden_size, config.hidden_size, bias=config.attention_bias)

    def forward(self, hidden_states, attention_mask, layer_past=None, position_embeddings=None, **kwargs):
        # GPTNeoXAttention.forward, with the attention function chosen by attention_for
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, 3 * self.head_size)
        qkv = self.query_key_value(hidden_states).view(hidden_shape).transpose(1, 2)
        query_states, key_states, value_states = qkv.chunk(3, dim=-1)
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if layer_past is not None:
            key_states, value_states = layer_past.update(key_states, value_states, self.layer_idx)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
            attention_for(kwargs, self.config._attn_implementation), eager_attention_forward)
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask, scaling=self.scaling,
            dropout=0.0 if not self.training else self.attention_dropout, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.dense(attn_output), attn_weights


class PonderMLP(GPTNeoXMLP):
    """transformers' ``GPTNeoXMLP`` built with :class:`SkinnyLinear` maps (see :class:`PonderAttention`)."""

    def __init__(self, config):
        nn.Module.__init__(self)
        self.dense_h_to_4h = SkinnyLinear(config.hidden_size, config.intermediate_size)
        self.dense_4h_to_h = SkinnyLinear(config.intermediate_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]


class PonderLayer(GPTNeoXLayer):
    """transformers' ``GPTNeoXLayer`` (same modules, names, order of construction and forward) built from
    :class:`PonderAttention` and :class:`PonderMLP`."""

    def __init__(self, config, layer_idx):
        super(GPTNeoXLayer, self).__init__()
        self.use_parallel_residual = config.use_parallel_residual
        self.input_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_attention_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_attention_dropout = nn.Dropout(config.hidden_dropout)
        self.post_mlp_dropout = nn.Dropout(config.hidden_dropout)
        self.attention = PonderAttention(config, layer_idx)
        self.mlp = PonderMLP(config)


class PythiaBackbone(GPTNeoXModel):
    """transformers' ``GPTNeoXModel`` (same modules, names and forward) whose weight initialisation
    follows ``config.init`` (A20): the backbone initialises itself when constructed, so its scheme
    has to live here rather than in the outer model.

    Its layers are :class:`PonderLayer`: their linear maps are :class:`SkinnyLinear`, so that a decode step's
    few-row products run blocked on the CPU (an ordinary module type, chosen at construction; the state dict is
    transformers' own), and their attention follows each call's arguments (compacted passes, depth-batched ticks)."""

    config_class = AdaPonderConfig

    def __init__(self, config: AdaPonderConfig):
        # GPTNeoXModel.__init__ with PonderLayer for GPTNeoXLayer (each module built once, of its final type).
        super(GPTNeoXModel, self).__init__(config)
        self.config = config
        self.embed_in = nn.Embedding(config.vocab_size, config.hidden_size)
        self.emb_dropout = nn.Dropout(config.hidden_dropout)
        self.layers = nn.ModuleList([PonderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.rotary_emb = GPTNeoXRotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()

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


def from_backbone(cls, source, mode: str = "adaponder", dtype: torch.dtype | None = None, *,
                  revision: str | None = None, **overrides):
    """Load a GPT-NeoX/Pythia (or AdaPonder) checkpoint — a local directory, a Hugging Face hub id
    (``org/name`` at ``revision``, as ``init.backbone`` takes it) or a model object — into any mode, for
    continued pretraining (A14); ``cls`` is the model class to build.

    The backbone (embedding, layers, final norm, output head) is copied unchanged; gates that the
    source lacks are freshly initialised with s ≈ 1 (``gate_init_bias``). ``overrides`` set
    recurrence fields (``passes``, ``input_scale``, …).
    """
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(_checkpoint_source(source, revision))
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
    if not isinstance(source, (GPTNeoXForCausalLM, cls)):
        raise TypeError(f"expected a GPTNeoXForCausalLM or AdaPonderForCausalLM, got {type(source).__name__}")
    src_cfg = source.config.to_dict()
    shape_keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                  "max_position_embeddings", "rope_parameters", "use_parallel_residual", "layer_norm_eps",
                  "tie_word_embeddings", "hidden_act", "attention_bias", "initializer_range", "bos_token_id",
                  "eos_token_id", "pad_token_id", "hidden_dropout", "attention_dropout")
    values = {k: src_cfg[k] for k in shape_keys if k in src_cfg}
    if isinstance(source, cls):
        values.update({k: src_cfg[k] for k in ("input_scale", "embedding_multiplier", "gate_hidden_mult",
                                                  "gate_activation", "gate_init_bias")})
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


def _checkpoint_source(source, revision):
    """``adaponder.hub.checkpoint_source``. The import sits in a ``try`` because this file is also saved into
    checkpoints as remote code, loadable without adaponder, and transformers skips imports inside ``try`` when it
    lists a remote module's required packages; there only local folders are read."""
    try:
        from adaponder.hub import checkpoint_source
    except ImportError:
        if revision:
            raise ValueError(f"{source}: a revision ({revision}) needs adaponder installed") from None
        return source
    return checkpoint_source(source, revision)


def _require_cached_offline(name, revision) -> None:
    """:func:`adaponder.hub.resolve_pretrained`'s error for a hub id missing from the cache while offline; nothing
    otherwise. The import is in a ``try`` for the reason :func:`_checkpoint_source` gives."""
    try:
        from adaponder.hub import is_hub_id, offline, resolve_pretrained
    except ImportError:
        return
    if isinstance(name, (str, os.PathLike)) and is_hub_id(name) and offline():
        resolve_pretrained(name, revision)


__all__ = ["AdaPonderPreTrainedModel", "PauseEmbeddings", "PonderAttention", "PonderLayer", "PonderMLP",
           "PythiaBackbone", "from_backbone", "init_pythia_", "init_std"]
