"""Self-speculative decoding on the static cache with compiled steps (``generate(decoding=DecodingConfig(
draft=..., compile=True))``): the greedy tokens of ``generate(do_sample=False)``, or its sampling distribution.

A cycle drafts γ tokens, each one :func:`draft_step` (passes 1..P of one token per row and its draft logits, one
graph; the token is chosen from them outside the graph), then verifies them with one :func:`verify_step` (passes P+1..K over the γ drafted tokens at once, continued
from the drafts' states, one graph), as :mod:`.speculative` does eagerly. Drafts write their K/V of passes 1..P and
the verification those of passes P+1..K into the static cache (:mod:`.static_decoding`); a token that halted by
pass P reuses its exit pass's K/V in the later passes (A15) exactly as in eager decoding. Rejected positions are not
cleared: their slots are masked out and overwritten by the next cycle. The acceptance is read on the host once per
cycle (γ tokens), never inside a step; so is sampling (the acceptance rule of :func:`~.speculative.accept`).

Each γ is a verification graph of its own, so ``adaptive`` moves γ by powers of two (doubled after a cycle every
row accepted whole, halved after one cut short, between 1 and ``max_draft_tokens``: a few graphs, each compiled
once) and chooses between drafting and ordinary decoding (the compiled static step) as the eager decoder does:
a draft cycle only where the decoded tokens' depth says drafting could pay, the other way timed
after three steps and taking over only when clearly faster (:class:`~.speculative.SpeculativeConfig`). An exit rule's memory (``carries``) after
pass P travels from each draft to its verification, as the eager decoder's does.
"""

from __future__ import annotations

import torch

from ..modeling.run_settings import RunSettings, settings_or_default
from .speculative import (DecodedDepth, SelfSpeculativeDecoder, SpeculativeConfig, SpeculativeStats, accept,
                          pad_after_eos, warp)
from .static_decoding import (RECOMPILE_LIMIT, StaticDecoder, StepState, compile_step, decode_passes,
                              pass_buffers)
from .way_choice import WayChooser


def draft_step(model, settings: RunSettings, buffers, key_ok, ids, slot, position, draft_passes: int):
    """Passes 1..P of ``ids`` ``[B]`` at cache ``slot`` ``[1]`` (rotary ``position`` ``[B]``): the draft logits
    ``[B, V]`` from the exit-pass states after pass P, and the state the verification continues from."""
    key_ok.index_fill_(1, slot, True)
    state = decode_passes(model, settings, buffers, key_ok[:, None, None, :], ids, slot, position[:, None],
                          StepState.start(model, ids), 1, draft_passes)
    draft = model.draft_logits(state.h_hat, state.active, draft_passes)  # A24: the draft head where there is one
    return draft, state.E, state.active, state.exit_pass, state.h_hat, state.carry


def verify_step(model, settings: RunSettings, buffers, key_ok, ids, slots, positions, E, active, exit_pass, h_hat,
                carry, draft_passes: int):
    """Passes P+1..K over the block ``ids`` ``[B, γ]`` at ``slots`` ``[γ]`` (rotary ``positions`` ``[B, γ]``),
    continued from the drafts' states (``[B·γ, ...]``, row by row; ``carry`` the exit rule's memory after pass P, or
    None); each query sees the keys written before it and
    its own. Returns the full model's logits ``[B, γ, V]`` and exit passes ``[B, γ]``."""
    batch, gamma = ids.shape
    K = settings.num_passes(model.config.num_passes)
    causal = torch.arange(key_ok.shape[1], device=key_ok.device)[None, :] <= slots[:, None]  # [γ, capacity]
    mask = key_ok[:, None, None, :] & causal[None, None]
    state = decode_passes(model, settings, buffers, mask, ids.reshape(-1), slots, positions,
                          StepState(E, active, exit_pass, h_hat, carry), draft_passes + 1, K)
    return model.lm_head(state.h_hat).view(batch, gamma, -1), state.exit_pass.view(batch, gamma)


class StaticSpeculativeDecoder:
    """``StaticSpeculativeDecoder(model, SpeculativeConfig(draft_passes=1, draft_tokens=4), settings).generate(ids)``:
    self-speculative decoding with compiled draft and verify steps (eager when ``settings.compile`` is off,
    the reference the tests compare with)."""

    def __init__(self, model, config: SpeculativeConfig | None = None, settings: RunSettings | None = None):
        self.config = config or SpeculativeConfig()
        self.settings = settings_or_default(settings)
        SelfSpeculativeDecoder(model, self.config, self.settings)  # the same checks of model, P and passes
        self.model = model
        self.static = StaticDecoder(model, self.settings)
        self.stats = SpeculativeStats()
        self._compiled: dict[str, object] = {}

    def _fn(self, name: str):
        plain = {"draft": draft_step, "verify": verify_step}[name]
        if not self.settings.compile:
            return plain
        if name not in self._compiled:
            self._compiled[name] = compile_step(plain, self.model)
        return self._compiled[name]

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, max_new_tokens: int = 20,
                 eos_token_id: int | None = None, pad_token_id: int | None = None, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """``[B, T + max_new_tokens]``: the prompts and the new tokens (after a row's ``eos_token_id`` its row is
        ``pad_token_id``, as ``generate`` pads it). Greedy, or with ``do_sample`` drawn from the full model's warped
        distribution (``temperature``, ``top_k``, ``top_p``) by the speculative acceptance rule, outside the compiled
        steps."""
        self._warp = (lambda z: warp(z, temperature, top_k, top_p)) if do_sample else (lambda z: z.float())
        self._choose = (lambda logp: torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)) \
            if do_sample else (lambda logp: logp.argmax(-1))
        self._sampling = (do_sample, generator)
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be [batch, length] with length ≥ 1, got {tuple(input_ids.shape)}")
        if self.settings.compile:
            with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                return self._generate(input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id)
        return self._generate(input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id)

    def _generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id):
        cfg = self.config
        self.stats = stats = SpeculativeStats()
        batch, length = input_ids.shape
        device = input_ids.device
        gamma = cfg.draft_tokens
        most = max(gamma, cfg.max_draft_tokens) if cfg.adaptive else gamma
        kv, key_ok, out, position = self.static.prefill(input_ids, attention_mask, length + max_new_tokens + most)
        buffers = pass_buffers(kv)
        pending = self._choose(self._warp(out.logits[:, -1]))  # [B]: the next input of every row
        exits = [out.exit_pass[:, -1:]]  # the pass each emitted token's distribution came from
        tokens, produced, n = [pending[:, None]], 1, length  # n: the next free slot
        finished = pending == eos_token_id if eos_token_id is not None else None
        chooser = WayChooser(("draft", "plain"), cfg.probe_every, device) if cfg.adaptive else None
        depth = DecodedDepth()
        draft, verify = self._fn("draft"), self._fn("verify")
        while produced < max_new_tokens and not (finished is not None and bool(finished.all())):
            way = "draft" if chooser is None else chooser.next_way()
            if way == "draft" and chooser is not None and not depth.drafting_may_pay(cfg):
                way = "plain"
            started = chooser.start() if chooser is not None else None
            if way == "plain":
                logits, exit_pass = self.static.step(kv, key_ok, pending.contiguous(), torch.tensor([n], device=device),
                                                     position, buffers)
                depth.note(exit_pass[:, None])
                new = self._choose(self._warp(logits))[:, None]
                exits.append(exit_pass[:, None])
                stats.plain_steps += 1
            else:
                ran = gamma
                new, verified = self._cycle(draft, verify, buffers, key_ok, pending, n, position, gamma, depth)
                exits.append(verified)
                if cfg.adaptive:
                    gamma = min(gamma * 2, cfg.max_draft_tokens) if new.shape[1] == gamma else max(1, gamma // 2)
            if chooser is not None:  # (a plain step's work: its depth over the mean; a cycle's cost: per γ)
                timed = way == "plain" and "plain" in (chooser.current, chooser.probed)  # (else never compared)
                chooser.record(way, started, new.shape[1], depth.relative(exit_pass) if timed else None,
                               setting=ran if way == "draft" else None)
            advance = new.shape[1]
            n, produced = n + advance, produced + advance
            position = position + advance
            pending = new[:, -1]
            tokens.append(new)
            if finished is not None:
                finished = finished | (new == eos_token_id).any(1)
        new = pad_after_eos(torch.cat(tokens, dim=1)[:, :max_new_tokens], eos_token_id, pad_token_id)
        self.exit_pass = torch.cat(exits, dim=1)[:, :max_new_tokens]
        return torch.cat([input_ids, new], dim=1)

    def _cycle(self, draft, verify, buffers, key_ok, pending, n, position, gamma, depth) -> torch.Tensor:
        """Draft γ tokens after ``pending`` (at slots n..n+γ-1), verify them, keep the agreed prefix (every row
        advances by the smallest); returns the tokens added, ``[B, m]``, the last the next pending one, and the exit
        passes of the distributions they came from."""
        model, settings, cfg, stats = self.model, self.settings, self.config, self.stats
        P = cfg.draft_passes
        device = pending.device
        offsets = torch.arange(gamma, device=device)
        ids, states, draft_logp = [pending], [], []
        for j in range(gamma):
            logits, *state = draft(model, settings, buffers, key_ok, ids[-1].contiguous(),
                                   torch.tensor([n + j], device=device), position + j, P)
            draft_logp.append(self._warp(logits))
            ids.append(self._choose(draft_logp[-1]))
            states.append(state)
        block = torch.stack(ids[:gamma], dim=1)  # [B, γ]: the inputs at the drafted positions
        drafts = torch.stack(ids[1:], dim=1)  # the drafted tokens
        flat = lambda k: None if states[0][k] is None else \
            torch.stack([s[k] for s in states], dim=1).flatten(0, 1)  # noqa: E731  [B·γ, ...]
        full, exit_pass = verify(model, settings, buffers, key_ok, block, n + offsets,
                                 position[:, None] + offsets, flat(0), flat(1), flat(2), flat(3), flat(4), P)
        depth.note(exit_pass)
        keep, correction, accepted = accept(drafts, torch.stack(draft_logp, 1), self._warp(full), *self._sampling)
        advance = int(keep.min())
        key_ok[:, n + advance:n + gamma] = False  # the rejected positions' slots: masked, rewritten next cycle
        new = torch.where(offsets[None] == keep[:, None] - 1, correction, drafts)
        stats.cycles += 1
        stats.drafted += drafts.numel()
        stats.accepted += int(accepted.sum())
        stats.emitted += advance * drafts.shape[0]
        stats.advances.append(advance)
        stats.uneven += int(int(keep.max()) != advance)
        return new[:, :advance], exit_pass[:, :advance]


__all__ = ["StaticSpeculativeDecoder", "draft_step", "verify_step"]
