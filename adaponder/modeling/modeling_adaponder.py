"""AdaPonderLM and its baselines on one code path, composed around transformers' GPT-NeoX layers.

Equations are those of ``docs/method.md`` (part a), cited as A1–A20. The model owns a
``GPTNeoXModel`` only as the container of the Pythia backbone (embedding, layers, final layer norm,
rotary embedding), so parameter names equal ``GPTNeoXForCausalLM``'s and a Pythia checkpoint maps 1:1.
The pass loop drives the layers itself; the only hook into them is the public ``layer_past.update``.

This file travels with saved checkpoints (``auto_map``): standard library, torch and transformers only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import GenerationMixin
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .attention import causal_slot_mask
from .backbone import AdaPonderPreTrainedModel, PauseEmbeddings, PythiaBackbone, from_backbone
from .configuration_adaponder import AdaPonderConfig
from .input_checks import (ModelInputError, TokenIdError, check_generation_length, check_input_kind, check_positions,
                           check_token_ids)
from .pass_driver import run_passes
from .pass_heads import HALTING_INIT_BIAS, DraftHead, PassHeads, PassSupervision, pass_supervision_losses
from .pass_step import GateWarmup, PassContext, PassRun, PonderGate, SkinnyLinear, first_input, ponder_loss  # noqa: F401
from .ponder_cache import KVAligner, PonderCache, TokenSubset
from .pondering import linear_cross_entropy, pondering_from_hidden
from .run_settings import LEGACY_CONFIG_KEYS, RunSettings, settings_or_default

try:  # FLOPs accounting (A17, flops_per_token) where adaponder is installed; a checkpoint's copy alone has none
    from adaponder.modeling.cost import CostAccounting
except ImportError:
    CostAccounting = type("CostAccounting", (), {})


@dataclass
class AdaPonderCausalLMOutput(CausalLMOutputWithPast):
    """``CausalLMOutputWithPast`` plus halting statistics.

    lm_loss: A10 (equal to ``loss``; the trainer adds the ponder loss itself).
    exit_pass: ``[B, T]`` long, D_t of A8 (1..K).
    gate_values: ``[B, T, K-1]`` gate outputs s^i_t (A5); 0 where the gate was not evaluated.
    gate_mask: ``[B, T, K-1]`` bool, the gates of the pool G of A11 (active, not padding).
    active_fraction: ``[K]`` fraction of non-padding tokens active in each pass.
    pass_logits: the logits z^i of every pass (only with ``return_pass_logits=True``).
    aux_losses: the pass heads' training terms (A21–A24: ``halting_kl``, ``consistency``, ``draft``, ``redraft``,
        ``redraft_pass{p}``), scalars
        with graphs; None when there are none. ``loss`` already holds A21/A22's expected loss.
    """

    lm_loss: torch.Tensor | None = None
    exit_pass: torch.Tensor | None = None
    gate_values: torch.Tensor | None = None
    gate_mask: torch.Tensor | None = None
    active_fraction: torch.Tensor | None = None
    pass_logits: tuple[torch.Tensor, ...] | None = None
    aux_losses: dict | None = None


class AdaPonderForCausalLM(CostAccounting, AdaPonderPreTrainedModel, GenerationMixin):
    """Looped Pythia: K passes of the whole GPT-NeoX stack with pondering feedback and halting gates.

    ``config.mode`` selects the method or a baseline on this one code path:
    ``vanilla`` (K = 1), ``ponderlm`` (no gates), ``loop`` (hidden-state feedback), ``adaponder``.
    """

    _tied_weights_keys = {"lm_head.weight": "gpt_neox.embed_in.weight"}
    # A model built to run fewer passes than its checkpoint was trained with
    # (``from_pretrained(path, passes=K)``) has no use for the later gates.
    _keys_to_ignore_on_load_unexpected = [r"^gates\.\d+\."]

    def __init__(self, config: AdaPonderConfig):
        super().__init__(config)
        self.gpt_neox = PythiaBackbone(config)
        self.lm_head = SkinnyLinear(config.hidden_size, config.vocab_size, bias=False)
        n_gates = config.num_passes - 1 if config.gated else 0
        self.gates = nn.ModuleList([PonderGate(config) for _ in range(n_gates)])
        self.pause_embeddings = PauseEmbeddings(config.num_pauses, config.hidden_size) if config.num_pauses else None
        # Heads that read the passes (A21–A24), built without drawing from the global generator and registered
        # last: the backbone of a model with them starts from the same weights as one without.
        with torch.random.fork_rng(devices=[]):
            k, d = config.num_passes - 1, config.hidden_size
            self.halting_heads = PassHeads(k, d, HALTING_INIT_BIAS) if config.halting_heads else None
            self.consistency_heads = PassHeads(k, d) if config.consistency_heads else None
            self.draft_head = DraftHead(d) if config.draft_head else None
            self.redraft_head = DraftHead(d) if config.redraft_head else None
            # passes 2..K−2, in pass order (pass K−1's stays ``redraft_head``: checkpoints with it load as they are)
            self.early_redraft_heads = nn.ModuleList(
                [DraftHead(d) for _ in range(2, k)]) if config.early_redraft_heads else None
        self.pass_checkpointing = False
        self.post_init()

    # -- building from a backbone -------------------------------------------------------------------
    @classmethod
    def from_backbone(cls, source, mode: str = "adaponder", dtype: torch.dtype | None = None, *,
                      revision: str | None = None, **overrides):
        """Load a GPT-NeoX/Pythia (or AdaPonder) checkpoint — a local directory, a hub id ``org/name`` at
        ``revision`` or a model object — into any mode, for continued pretraining (A14); see
        :func:`.backbone.from_backbone`."""
        return from_backbone(cls, source, mode, dtype, revision=revision, **overrides)

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
        settings: RunSettings | None = None,
        gate_warmup: GateWarmup | None = None,
        pass_supervision: PassSupervision | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> AdaPonderCausalLMOutput:
        r"""Run K passes (A1–A9) and, with ``labels`` (HF convention: shifted inside) or ``shift_labels``
        (already aligned with the inputs), the LM loss on the exit-pass logits (A10).

        With ``use_cache`` a :class:`PonderCache` is filled (prefill, A16) or extended (decoding, A15);
        an empty cache of another type (e.g. the ``DynamicCache`` that ``generate`` makes) is replaced.
        ``return_logits=False`` (training) computes the loss in chunks without the ``[B, T, V]`` logits.
        ``settings`` (:class:`~.run_settings.RunSettings`: τ, the exit rule, passes to run, compaction, chunking)
        are this call's; ``generate`` passes them through. The config is never written.
        ``gate_warmup`` (:class:`GateWarmup`, training's warm-up only) bypasses, floors or stops the gates' halting.
        ``pass_supervision`` (:class:`~.pass_heads.PassSupervision`, training only): how the passes are scored
        (A21–A22). With gradients and targets, the model's pass heads (A21–A24) add their terms to ``aux_losses``.
        """
        cfg = self.config
        _refuse_run_keywords(kwargs)
        settings = settings_or_default(settings)
        cache = cache if cache is not None else past_key_values
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        self._check_inputs(input_ids, inputs_embeds, labels, shift_labels,
                           cache.get_seq_length() if cache is not None else 0)
        if use_cache is None:
            use_cache = cache is not None or (cfg.use_cache and not self.training)
        cache = self._ponder_cache(cache) if use_cache else None
        stride = cfg.num_pauses + 1  # backbone positions per real token (A19; 1 outside pause mode)
        if stride > 1:
            inputs_embeds, attention_mask, position_ids = self._insert_pauses(
                input_ids, inputs_embeds, attention_mask, position_ids)
            input_ids = None
        ctx = self.pass_context(input_ids, attention_mask, position_ids, inputs_embeds, cache)
        targets = self._targets(labels, shift_labels)
        per_pass = pass_supervision is not None and pass_supervision.kind != "none"
        if per_pass and self.halting_heads is None:
            raise ValueError(f"per-pass supervision {pass_supervision.kind!r} needs halting heads "
                             "(model.halting_heads: true)")
        keep_states = torch.is_grad_enabled() and targets is not None and (
            per_pass or self.consistency_heads is not None or self.draft_head is not None
            or self.redraft_head is not None)  # (early re-draft heads come with it)
        run = run_passes(self, ctx, KVAligner(cfg.num_hidden_layers, cache), settings=settings,
                         gate_warmup=gate_warmup, return_pass_logits=return_pass_logits,
                         return_pass_states=keep_states)
        h_hat, exit_pass, pass_logits, length = run.h_hat, run.exit_pass, run.pass_logits, ctx.length
        if stride > 1:  # A19: x_{t+1} is predicted at the last pause after x_t; no other position is scored
            h_hat, exit_pass = h_hat[:, stride - 1::stride], exit_pass[:, stride - 1::stride]
            pass_logits = [z[:, stride - 1::stride] for z in pass_logits]
            length = length // stride
        aux = {}
        if keep_states:
            aux = pass_supervision_losses(self, run.pass_states, targets.to(h_hat.device), pass_supervision)
        logits, lm_loss = self._exit_logits_and_loss(h_hat, targets, return_logits and not per_pass, logits_to_keep,
                                                     length, settings.chunk_size, need_loss="lm" not in aux)
        if "lm" in aux:  # A21/A22: the expected loss under the exit distribution replaces the final pass's CE
            lm_loss = aux.pop("lm")
            logits = self.lm_head(h_hat) if return_logits else None
        gate_values, gate_mask = run.gate_tensors(cfg.num_passes)
        return AdaPonderCausalLMOutput(
            loss=lm_loss, logits=logits, cache=cache, lm_loss=lm_loss, exit_pass=exit_pass, gate_values=gate_values,
            gate_mask=gate_mask, active_fraction=torch.stack(run.active_fraction),
            pass_logits=tuple(pass_logits) if return_pass_logits else None, aux_losses=aux or None)

    def run_passes(self, ctx: "PassContext", aligner: KVAligner, run: PassRun | None = None, last: int | None = None,
                   *, settings: RunSettings | None = None, gate_warmup: GateWarmup | None = None,
                   return_pass_logits: bool = False) -> PassRun:
        """The pass driver's loop (:func:`.pass_driver.run_passes`) over this model."""
        return run_passes(self, ctx, aligner, run, last, settings=settings_or_default(settings),
                          gate_warmup=gate_warmup, return_pass_logits=return_pass_logits)

    # -- the heads that read the passes (A21–A24) ------------------------------------------------------------
    def draft_logits(self, h: torch.Tensor, going_on: torch.Tensor | None = None, draft_passes: int = 1) -> torch.Tensor:
        """The draft distribution's logits from the states ``h`` after ``draft_passes`` passes (A24): through the draft
        head where the model has one and drafts with pass 1, else those states' own logits. ``going_on`` (bool,
        ``h.shape[:-1]``): tokens that have not halted; a halted token's logits are already its final ones."""
        if self.draft_head is None or draft_passes != 1:
            return self.lm_head(h)
        drafted = self.lm_head(self.draft_head(h))
        return drafted if going_on is None else torch.where(going_on[..., None], drafted, self.lm_head(h))

    def redraft_heads(self) -> dict[int, nn.Module]:
        """The re-draft heads by the pass (1-based) whose state they read: pass K−1's (``redraft_head``) and, with
        ``early_redraft_heads``, passes 2..K−2's (A24)."""
        heads = {} if self.redraft_head is None else {self.config.num_passes - 1: self.redraft_head}
        for i, head in enumerate(self.early_redraft_heads or ()):
            heads[i + 2] = head
        return dict(sorted(heads.items()))

    def halting_probability(self, h: torch.Tensor, pass_idx: int | torch.Tensor) -> torch.Tensor:
        """λ_i (A21) of states ``h`` after pass ``pass_idx``, float32, shape ``h.shape[:-1]``."""
        if self.halting_heads is None:
            raise ValueError("token-level Q-exit needs a model with halting heads (halting_heads: true, A21)")
        return torch.sigmoid(self.halting_heads(h, pass_idx).float())

    def agreement_probability(self, h: torch.Tensor, pass_idx: int | torch.Tensor) -> torch.Tensor:
        """The consistency head's probability that pass ``pass_idx``'s greedy token is the full model's (A23)."""
        if self.consistency_heads is None:
            raise ValueError("the consistency exit needs a model with consistency heads (consistency_heads: true, "
                             "A23)")
        return torch.sigmoid(self.consistency_heads(h, pass_idx).float())

    def _exit_logits_and_loss(self, h_hat, targets, return_logits: bool, logits_to_keep, length: int,
                              chunk_size: int = 0, need_loss: bool = True):
        """``(logits, lm_loss)`` from the exit-pass states (A9, A10). Training (``return_logits=False``) computes the
        loss in chunks and never builds the ``[B, T, V]`` logits."""
        device = h_hat.device
        if not need_loss:
            targets = None
        if not return_logits:
            lm_loss = None if targets is None else linear_cross_entropy(
                h_hat.reshape(-1, h_hat.shape[-1]), self.lm_head.weight, targets.reshape(-1).to(device), chunk_size)
            return None, lm_loss
        if logits_to_keep and targets is None:  # generate(): only the last logits are needed
            h_hat = h_hat[:, -logits_to_keep:] if isinstance(logits_to_keep, int) else h_hat[:, logits_to_keep]
        logits = self.lm_head(h_hat)
        lm_loss = None if targets is None else F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1).to(device), ignore_index=-100)
        if logits_to_keep and logits.shape[1] == length:
            logits = logits[:, -logits_to_keep:] if isinstance(logits_to_keep, int) else logits[:, logits_to_keep]
        return logits, lm_loss

    def generate(self, inputs: torch.Tensor | None = None, *args, decoding=None, speculative=None, **kwargs):
        """transformers' ``generate`` after :meth:`forward`'s input checks and a check that the prompt plus the tokens
        asked for fit the positions (transformers' own would index an empty prompt, or embed an id outside the
        vocabulary, before any forward, and decode past the positions silently). ``decoding=DecodingConfig(...)``
        (:mod:`adaponder.generation`, not shipped with checkpoints) picks a schedule, a draft or compiled steps and
        returns a ``GenerationOutput``; ``speculative=`` and ``RunSettings(compile=True)`` are older spellings of it
        that still return the sequences alone."""
        ids = inputs if inputs is not None else kwargs.get("input_ids")
        if isinstance(ids, torch.Tensor):
            self._check_inputs(ids, None, None, None)
            gen = kwargs.get("generation_config") or self.generation_config
            check_generation_length(self.config.max_position_embeddings, ids.shape[-1],
                                    kwargs.get("max_new_tokens", gen.max_new_tokens),
                                    kwargs.get("max_length", gen.max_length), self.config.num_pauses + 1)
        settings = kwargs.get("settings")
        if decoding is None and speculative is None and not getattr(settings, "compile", False):
            return super().generate(inputs, *args, **kwargs)
        try:
            from adaponder.generation import generate_with
        except ImportError:  # a checkpoint loaded with trust_remote_code where adaponder is not installed
            raise ValueError("decoding=, speculative= and RunSettings(compile=True) need the adaponder package "
                             "(pip install adaponder); without it generate() is transformers' own") from None
        return generate_with(self, ids, args, decoding=decoding, speculative=speculative, **kwargs)

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
                     cache: PonderCache | None = None, past: int | None = None) -> "PassContext":
        """Everything a pass needs besides its input: embeddings, masks, rotary tables (A1, A2). ``past``: the
        cached positions before these tokens (default: the cache's length; the passes of a self-speculative
        verification start where the last pass's cache ends, behind the drafted first passes)."""
        cfg = self.config
        x0 = self.gpt_neox.embed_in(input_ids) if inputs_embeds is None else inputs_embeds
        batch, length = x0.shape[:2]
        if past is None:
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
            full_mask = causal_slot_mask(q_slot, past + length, key_padding, impl, x0.dtype)
        cos, sin = self.gpt_neox.rotary_emb(x0, position_ids)
        E0 = first_input(x0, cfg.first_pass_scale)  # E⁰ = c·Ẽ[x] (A1)
        return PassContext(x0, E0, batch, length, past, valid, key_padding, full_mask, (cos, sin), impl,
                           input_ids if inputs_embeds is None else None)

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
        if subset is not None:
            # Compacted pass (A16): projections and MLPs run on the N active tokens flat, [1, N, d], so no padding
            # slot of the packed [R, Tq] layout costs a GEMM row; only attention regroups them by row.
            hidden = subset.gather(E)[None]
            rope = (subset.gather(cos)[None], subset.gather(sin)[None])
            kp = subset.select_rows(ctx.key_padding) if ctx.key_padding is not None else None
            mask = causal_slot_mask(ctx.past + subset.token, ctx.past + E.shape[1], kp, ctx.impl, E.dtype)
            extra = {"ponder_subset": subset, "ponder_impl": ctx.impl}  # routes its attention (attention_for)
        else:
            hidden, mask, rope, extra = E, ctx.full_mask, ctx.rope, {}

        def stack(h):
            # Set inside, so that a checkpointed pass recomputed during backward sees its own pass state.
            aligner.begin_pass(pass_idx, active, subset)
            h = self.gpt_neox.emb_dropout(h)
            for layer in self.gpt_neox.layers:
                h = layer(h, attention_mask=mask, layer_past=aligner, position_embeddings=rope, **extra)
            return h

        if self.pass_checkpointing and self.training and torch.is_grad_enabled():
            hidden = checkpoint(stack, hidden, use_reentrant=False)
        else:
            hidden = stack(hidden)
        out = self.gpt_neox.final_layer_norm(hidden)
        return out.reshape(-1, out.shape[-1]), hidden.reshape(-1, hidden.shape[-1])

    def ponder_from_hidden(self, h_flat: torch.Tensor, settings: RunSettings | None = None) -> torch.Tensor:
        """A4 from final-LN hidden states ``[N, d]``, chunked (``settings.chunk_size``), never storing ``[N, V]`` for
        backward unless ``settings.recompute`` is off."""
        settings = settings_or_default(settings)
        return pondering_from_hidden(h_flat, self.lm_head.weight, self.gpt_neox.embed_in.weight,
                                     self.config.embedding_scale, settings.chunk_size, recompute=settings.recompute)

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



#: Keywords that once set run-time settings on ``forward``; now fields of :class:`RunSettings` (``settings=``).
_RUN_KEYWORDS = {**LEGACY_CONFIG_KEYS, "halting_policy": "exit_rule", "tau": "tau", "compact": "compact",
                 "passes": "passes"}


def _refuse_run_keywords(kwargs) -> None:
    """``TypeError`` for a run-time setting passed as a keyword of its own: ``forward`` takes extra keywords (from
    ``generate``), so such a keyword would otherwise be dropped silently and the call run with the defaults."""
    found = sorted(k for k in kwargs if k in _RUN_KEYWORDS)
    if found:
        fields = ", ".join(f"{_RUN_KEYWORDS[k]}=..." for k in found)
        raise TypeError(f"{', '.join(found)}: run-time settings are passed as settings=RunSettings({fields})")

__all__ = ["AdaPonderForCausalLM", "AdaPonderPreTrainedModel", "AdaPonderCausalLMOutput", "GateWarmup", "PonderGate",
           "ModelInputError", "TokenIdError", "check_token_ids", "ponder_loss"]
