"""Self-speculative decoding across passes: draft with the first passes, verify with the rest in one forward.

The first pass of a looped model is a language model of its own, and pass p of token t depends only on passes
≤ p of tokens ≤ t, so the first-pass keys and values that a draft computes are exactly the ones the full model
needs. A cycle, for every row, from its pending token ``y₀`` (chosen by the full model, not yet run):

1. **draft** ``γ`` tokens: run passes ``1..P`` on ``y_j`` (writing those passes' K/V into the cache) and take the
   next token ``y_{j+1}`` from the draft distribution — the logits of each token's state after pass ``P`` (its
   exit state when it already halted, A9), read through the model's draft head where it has one and drafts with
   pass 1 (A24: trained to predict the full model, with no gradient into the passes);
2. **verify**: run passes ``P+1..K`` over the ``γ`` drafted positions in one forward — the pass loop continued from
   the drafts' states (:meth:`~.modeling_adaponder.AdaPonderForCausalLM.run_passes`), with the same K/V reuse and
   halting as ordinary decoding (A15) — giving the full model's distribution at each of them;
3. **accept** the longest prefix the full model agrees with (greedy: the same argmax; sampling: the speculative
   acceptance rule, which keeps the model's distribution), take the full model's token at the first
   disagreement, and roll the cache back behind it.

A token that halts within the draft passes (AdaPonder) has its final distribution already: its draft is accepted
by construction and the verification computes nothing for it (compaction, A16).

Rows accept different numbers of tokens; the cache is one rectangle, so every row advances by the smallest
number of verified tokens in the cycle (a row keeps the first tokens of its verified run; what it verified beyond
them is drafted again). Greedy output is then token for token that of ordinary cached decoding, and the cache after
a run holds what ordinary decoding would have written.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field

import torch

from ..modeling.pass_driver import run_passes
from ..modeling.pass_step import PassRun, generate_positions
from ..modeling.ponder_cache import KVAligner, PonderCache
from ..modeling.run_settings import RunSettings, SettingsError, bool_field, int_field, positive_field, settings_or_default
from .way_choice import WayChooser


@dataclass(frozen=True)
class SpeculativeConfig:
    """``draft_passes`` P (the passes that draft; ``1 ≤ P < K``) and ``draft_tokens`` γ (tokens drafted per cycle).
    ``adaptive``: γ follows the acceptance — doubled after a cycle every row accepted whole, one less after one that
    was cut short, between 1 and ``max_draft_tokens`` (the compiled decoder halves it instead, each γ being a graph
    of its own) — and drafting itself is measured against ordinary decoding while decoding
    (:class:`~.way_choice.WayChooser`): the way run first stays in use, the other is timed after three of its steps
    and again after every ``probe_every`` tokens, and takes over only when clearly faster, so a model whose drafts
    do not pay (rarely accepted, or no cheaper than the passes its tokens take anyway) decodes at ordinary speed.
    A cycle is timed per γ; an ordinary step is timed per token at the decoded tokens' mean depth (its own token's
    passes divided out: one token that took every pass says little about the next).
    The adaptive schedule drafts at all only where drafting could pay: its best case (every draft accepted, γ at
    ``max_draft_tokens``) reads the weights ``P + (D − P)/γ`` times per token where ordinary decoding reads them
    ``D`` times (``D``: the passes the decoded tokens took, the deepest row of each position), and a cycle is run
    only while ``D / (P + (D − P)/γ) ≥ min_gain`` with ``D`` the lower end of a one-standard-error band around
    their mean (at least two positions decoded) — a model whose tokens exit after pass P anyway never pays for a
    probe, and a few deep tokens at the start do not buy one."""

    draft_passes: int = 1
    draft_tokens: int = 4
    adaptive: bool = False
    max_draft_tokens: int = 16
    probe_every: int = 32
    min_gain: float = 1.1

    def __post_init__(self):
        """Every field's type and range, checked when built: one :class:`~.run_settings.SettingsError` naming every
        bad field (bools are not integers). The bound that depends on the model (``draft_passes < K``) is
        :meth:`check`'s."""
        problems = []
        for name, low in (("draft_passes", 1), ("draft_tokens", 1), ("max_draft_tokens", 1), ("probe_every", 1)):
            object.__setattr__(self, name, int_field(problems, name, getattr(self, name), low))
        bool_field(problems, "adaptive", self.adaptive)
        object.__setattr__(self, "min_gain", positive_field(problems, "min_gain", self.min_gain))
        if not problems and self.adaptive and self.max_draft_tokens < self.draft_tokens:
            problems.append(f"max_draft_tokens ({self.max_draft_tokens}) must be >= draft_tokens ({self.draft_tokens})"
                            " when adaptive")
        if problems:
            raise SettingsError("SpeculativeConfig", problems)

    def check(self, num_passes: int) -> None:
        """The model's bound: ``draft_passes`` must leave passes to verify (:class:`~.run_settings.SettingsError`)."""
        if not 1 <= self.draft_passes < num_passes:
            raise SettingsError("SpeculativeConfig", [f"draft_passes must lie in [1, K) = [1, {num_passes}), "
                                                      f"got {self.draft_passes}"])


@dataclass
class SpeculativeStats:
    """What the cycles did: ``cycles``; ``drafted`` tokens drafted and ``accepted`` of them kept (summed over rows);
    ``emitted`` tokens added (summed over rows); ``uneven`` cycles in which rows verified different numbers of
    tokens (every row then advanced by the smallest); ``advances`` the tokens per row of each cycle."""

    cycles: int = 0
    plain_steps: int = 0  # ordinary decoding steps the adaptive schedule chose instead of drafting
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    uneven: int = 0
    advances: list = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def mean_advance(self) -> float:
        """Tokens per row per cycle (every row advances alike)."""
        return sum(self.advances) / len(self.advances) if self.advances else float("nan")


class DecodedDepth:
    """The passes the decoded tokens took — the deepest row of each decoded position, summed with its square — and
    :class:`SpeculativeConfig`'s bound on what drafting could gain at that depth. Only decoded positions count,
    not the prompt's (text the model reads halts otherwise than its own continuation: the README demo's model
    takes about two passes over the README and 1.04 over what it writes; counting even the prefill's last position
    opened drafting there)."""

    def __init__(self):
        self.sums: torch.Tensor | None = None  # [sum, sum of squares], on the device
        self.steps = 0

    def note(self, exit_pass: torch.Tensor) -> None:
        """``exit_pass`` ``[B, n]`` of n decoded positions."""
        deepest = exit_pass.amax(0).float()
        part = torch.stack([deepest.sum(), deepest.square().sum()])
        self.sums = part if self.sums is None else self.sums + part
        self.steps += exit_pass.shape[1]

    def relative(self, exit_pass: torch.Tensor) -> float:
        """One decoded step's work against a typical step's: the passes its deepest row took over the decoded
        tokens' mean (a single token's time says little about ordinary decoding's until its depth is divided out).
        One host read."""
        if self.steps == 0:
            return 1.0
        deepest, total = torch.stack([exit_pass.amax().float(), self.sums[0]]).tolist()
        return deepest / (total / self.steps)

    def drafting_may_pay(self, config: SpeculativeConfig) -> bool:
        """Could a cycle with every draft accepted beat ordinary decoding by ``config.min_gain``? (One host read,
        only when a draft is due; False until two positions are seen.)"""
        n = self.steps
        if n < 2:
            return False
        total, squares = self.sums.tolist()
        mean = total / n
        spread = max(squares / n - mean * mean, 0.0) * n / (n - 1)
        depth = mean - math.sqrt(spread / n)
        P, gamma = config.draft_passes, config.max_draft_tokens
        return depth / (P + max(depth - P, 0.0) / gamma) >= config.min_gain


def truncate(cache: PonderCache, length: int) -> None:
    """Keep the first ``length`` positions of every (pass, layer) of ``cache`` (a rejected speculative block is
    dropped); the room behind them stays reserved, so the next append writes in place."""
    for layer in cache.layers:
        if layer.is_initialized and layer.get_seq_length() > length:
            layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]


def pad_after_eos(new: torch.Tensor, eos_token_id: int | None, pad_token_id: int | None) -> torch.Tensor:
    """``new`` ``[B, n]`` with every token after a row's first ``eos_token_id`` set to ``pad_token_id`` (default: the
    eos id), as transformers' ``generate`` pads finished rows."""
    if eos_token_id is None:
        return new
    is_eos = (new == eos_token_id).long()
    after = is_eos.cumsum(1) - is_eos > 0
    return new.masked_fill(after, eos_token_id if pad_token_id is None else pad_token_id)


def warp(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
         top_p: float | None = None) -> torch.Tensor:
    """Log-probabilities after temperature, top-k and top-p, in that order (transformers' warpers' order and
    rules: top-p keeps the smallest set whose probability reaches ``top_p``, at least one token)."""
    scores = logits.float() / temperature if temperature != 1.0 else logits.float()
    if top_k is not None and 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ordered, order = torch.sort(scores, dim=-1, descending=False)
        cum = ordered.softmax(-1).cumsum(-1)
        drop = cum <= 1 - top_p
        drop[..., -1:] = False
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.log_softmax(scores, dim=-1)


class SelfSpeculativeDecoder:
    """``SelfSpeculativeDecoder(model, SpeculativeConfig(draft_passes=1, draft_tokens=4)).generate(ids, ...)``.

    For ``ponderlm``, ``loop`` and ``adaponder`` models (K ≥ 2). ``settings``: the
    :class:`~.run_settings.RunSettings` of every pass this decoder runs (τ, exit rule, compaction).
    """

    def __init__(self, model, config: SpeculativeConfig | None = None, settings: RunSettings | None = None):
        cfg = model.config
        if cfg.mode not in ("ponderlm", "loop", "adaponder") or cfg.num_passes < 2:
            raise ValueError(f"self-speculative decoding needs a looped model (ponderlm, loop or adaponder with "
                             f"K >= 2); this one is {cfg.mode!r} with K = {cfg.num_passes}")
        self.model = model
        self.config = config or SpeculativeConfig()
        self.config.check(cfg.num_passes)
        self.settings = settings_or_default(settings)
        if self.settings.num_passes(cfg.num_passes) <= self.config.draft_passes:
            raise ValueError(f"settings.passes ({self.settings.passes}) leaves nothing to verify after "
                             f"{self.config.draft_passes} draft passes")
        self.stats = SpeculativeStats()

    # -- the public call --------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, max_new_tokens: int = 32,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, generator: torch.Generator | None = None,
                 eos_token_id: int | None = None, pad_token_id: int | None = None,
                 cache: PonderCache | None = None) -> torch.Tensor:
        """``[B, T + max_new_tokens]``: the prompts (left padding marked by ``attention_mask``) and the new tokens.
        Greedy by default; ``do_sample`` samples with ``temperature``/``top_k``/``top_p`` (:func:`warp`). After a
        row's ``eos_token_id`` the rest of its row is ``pad_token_id`` (as transformers' ``generate`` pads it);
        decoding stops once every row has one. ``cache``: an empty :class:`PonderCache` to fill (e.g. to inspect
        it afterwards)."""
        model = self.model
        self.stats = SpeculativeStats()
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be [batch, length] with length >= 1, got {tuple(input_ids.shape)}")
        batch, length = input_ids.shape
        limit = model.config.max_position_embeddings
        if length + max_new_tokens > limit:
            raise ValueError(f"prompt length {length} + max_new_tokens {max_new_tokens} exceeds the model's "
                             f"max_position_embeddings ({limit})")
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(input_ids.device).long()
        self._padded = attention_mask is not None and not bool(mask.all())
        self._choose = (lambda logp: self._sample(logp, generator)) if do_sample else (lambda logp: logp.argmax(-1))
        self._warp = (lambda z: warp(z, temperature, top_k, top_p)) if do_sample else (lambda z: z.float())
        self.do_sample, self.generator = do_sample, generator
        cache = cache if cache is not None else PonderCache(model.config.num_passes, model.config.num_hidden_layers)
        out = model(input_ids, attention_mask=mask, position_ids=generate_positions(mask, 0, length), cache=cache,
                    use_cache=True, logits_to_keep=1, settings=self.settings)  # (only the last position is read)
        tokens = [self._choose(self._warp(out.logits[:, -1]))[:, None]]  # [B, 1]: the pending token of every row
        self._exits = [out.exit_pass[:, -1:]]  # the pass each emitted token's distribution came from
        produced, gamma = 1, self.config.draft_tokens
        finished = tokens[0][:, 0] == eos_token_id if eos_token_id is not None else None
        chooser = (WayChooser(("draft", "plain"), self.config.probe_every, input_ids.device)
                   if self.config.adaptive else None)
        self._depth = DecodedDepth()
        while produced < max_new_tokens and not (finished is not None and bool(finished.all())):
            step = min(gamma, max_new_tokens - produced)
            way = "draft" if chooser is None else chooser.next_way()
            if way == "draft" and chooser is not None and not self._depth.drafting_may_pay(self.config):
                way = "plain"
            started = chooser.start() if chooser is not None else None
            if way == "draft":
                new = self._cycle(tokens[-1][:, -1], mask, cache, step)
                if self.config.adaptive:
                    gamma = min(gamma * 2, self.config.max_draft_tokens) if new.shape[1] == step else max(1, gamma - 1)
            else:
                new = self._plain_step(tokens[-1][:, -1], mask, cache)
            if chooser is not None:  # (a plain step's work: its depth over the mean; a cycle's cost: per γ)
                timed = way == "plain" and "plain" in (chooser.current, chooser.probed)  # (else never compared)
                work = self._depth.relative(self._plain_exit) if timed else None
                chooser.record(way, started, new.shape[1], work, setting=step if way == "draft" else None)
            mask = torch.cat([mask, mask.new_ones(batch, new.shape[1])], dim=1)
            tokens.append(new)
            produced += new.shape[1]
            if finished is not None:
                finished = finished | (new == eos_token_id).any(1)
        new = pad_after_eos(torch.cat(tokens, dim=1)[:, :max_new_tokens], eos_token_id, pad_token_id)
        self.exit_pass = torch.cat(self._exits, dim=1)[:, :max_new_tokens]
        return torch.cat([input_ids, new], dim=1)

    def _plain_step(self, pending: torch.Tensor, mask: torch.Tensor, cache: PonderCache) -> torch.Tensor:
        """Ordinary decoding of one token: every row's ``pending`` token through the passes (the cached forward);
        returns the next pending token, ``[B, 1]`` — what a cycle of one verified token returns, without a draft."""
        model = self.model
        if self._padded:
            n = cache.pass_layer(self.settings.num_passes(model.config.num_passes), 0).get_seq_length()
            step_mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            out = model(pending[:, None], attention_mask=step_mask, position_ids=generate_positions(step_mask, n, 1),
                        cache=cache, use_cache=True, settings=self.settings)
        else:  # no padding: positions follow the cache, and attention needs no mask (the plain cached forward)
            out = model(pending[:, None], cache=cache, use_cache=True, settings=self.settings)
        self.stats.plain_steps += 1
        K = self.settings.num_passes(model.config.num_passes)
        self._plain_exit = out.exit_pass if out.exit_pass is not None else torch.full_like(pending[:, None], K)
        self._exits.append(self._plain_exit)
        self._depth.note(self._plain_exit)
        return self._choose(self._warp(out.logits[:, -1]))[:, None]

    # -- one cycle -----------------------------------------------------------------------------------------------
    def _cycle(self, pending: torch.Tensor, mask: torch.Tensor, cache: PonderCache, gamma: int) -> torch.Tensor:
        """Draft ``gamma`` tokens after each row's ``pending`` one, verify them, keep the agreed prefix; returns the
        tokens every row adds (``[B, m]``, 1 ≤ m ≤ gamma), the last of them the next pending token."""
        model, P = self.model, self.config.draft_passes
        K = self.settings.num_passes(model.config.num_passes)
        n = cache.pass_layer(K, 0).get_seq_length()  # positions every pass this call runs holds
        ids, runs, draft_logp = [pending.reshape(-1)], [], []
        for j in range(gamma):  # 1. draft: passes 1..P, one token per row
            step_mask = torch.cat([mask, mask.new_ones(mask.shape[0], j + 1)], dim=1)
            ctx = model.pass_context(ids[-1][:, None], step_mask, generate_positions(step_mask, n + j, 1), cache=cache,
                                     past=n + j)
            run = run_passes(model, ctx, KVAligner(model.config.num_hidden_layers, cache), last=P,
                             settings=self.settings)
            runs.append(run)
            logp = self._warp(model.draft_logits(run.h_hat[:, -1], run.active[:, -1], P))  # A24
            draft_logp.append(logp)
            ids.append(self._choose(logp))
        block = torch.stack(ids[:gamma], dim=1)  # y_0 .. y_{γ-1}: the inputs of the drafted positions
        drafts = torch.stack(ids[1:], dim=1)  # y_1 .. y_γ
        full_logp, exits = self._verify(block, runs, mask, cache, n)  # 2. verify: passes P+1..K, one forward
        keep, correction, accepted = accept(drafts, torch.stack(draft_logp, 1), full_logp,  # 3. accept
                                            self.do_sample, self.generator)
        advance = int(keep.min())
        new = torch.where(torch.arange(gamma, device=drafts.device)[None] == keep[:, None] - 1, correction, drafts)
        truncate(cache, n + advance)
        self._exits.append(exits[:, :advance])
        self.stats.cycles += 1
        self.stats.drafted += drafts.numel()
        self.stats.accepted += int(accepted.sum())
        self.stats.emitted += advance * drafts.shape[0]
        self.stats.advances.append(advance)
        self.stats.uneven += int(int(keep.max()) != advance)
        return new[:, :advance]

    def _verify(self, block, runs, mask, cache: PonderCache, n: int) -> torch.Tensor:
        """The full model's (warped) log-probabilities at the drafted positions, ``[B, γ, V]``: passes P+1..K over
        the block, continued from the drafts' states; passes 1..P of the block come from the cache as written by
        the drafts (their aligned K/V are what pass P+1 reuses for tokens that halted, A15)."""
        model, P = self.model, self.config.draft_passes
        gamma = block.shape[1]
        full_mask = torch.cat([mask, mask.new_ones(mask.shape[0], gamma)], dim=1)
        ctx = model.pass_context(block, full_mask, generate_positions(full_mask, n, gamma), cache=cache, past=n)
        aligner = KVAligner(model.config.num_hidden_layers, cache)
        for layer in range(model.config.num_hidden_layers):
            k, v = cache.view(P, layer)
            aligner.fresh[(P, layer)] = (k[:, :, n:n + gamma], v[:, :, n:n + gamma])
        cat = lambda name: torch.cat([getattr(r, name) for r in runs], dim=1)  # noqa: E731
        carry = cat("carry") if runs[0].carry is not None else None
        run = PassRun.resume(cat("E"), cat("active"), cat("exit_pass"), cat("h_hat"), P + 1,
                             compact=self.settings.compact and ctx.impl != "flash_attention_2", carry=carry)
        run = run_passes(model, ctx, aligner, run, settings=self.settings)
        self._depth.note(run.exit_pass)
        return self._warp(model.lm_head(run.h_hat)), run.exit_pass

    def _sample(self, logp: torch.Tensor, generator) -> torch.Tensor:
        return torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)


def accept(drafts, draft_logp, full_logp, do_sample: bool, generator: torch.Generator | None = None):
    """Per row of ``drafts`` ``[B, γ]``: how many of the γ tokens it verifies (``keep``: the accepted prefix, plus the
    full model's own token at the first disagreement), the token to emit there (``correction``), and the number of
    ``accepted`` drafts. Greedy: a draft stands where it is the full model's argmax. Sampling: it stands with
    probability min(1, p(y)/q(y)), else the token is drawn from norm(max(0, p − q)) — the full model's distribution
    either way. ``draft_logp``/``full_logp``: the warped log-probabilities ``[B, γ, V]`` (the draft's unused when
    greedy)."""
    gamma = drafts.shape[1]
    if not do_sample:
        target = full_logp.argmax(-1)
        agree = drafts == target
        correction = target
    else:  # keep y with probability min(1, p(y)/q(y)); else draw from norm(max(0, p - q))
        p_y = full_logp.gather(-1, drafts[..., None]).squeeze(-1)
        q_y = draft_logp.gather(-1, drafts[..., None]).squeeze(-1)
        u = torch.rand(drafts.shape, device=drafts.device, generator=generator)
        agree = u.log() < (p_y - q_y).clamp(max=0)
        residual = (full_logp.exp() - draft_logp.exp()).clamp(min=0)
        fallback = residual.sum(-1, keepdim=True) <= 0  # p == q: any rejection is impossible; keep p
        residual = torch.where(fallback, full_logp.exp(), residual)
        correction = torch.multinomial(residual.reshape(-1, residual.shape[-1]), 1,
                                       generator=generator).reshape(drafts.shape)
    accepted = torch.cumprod(agree.long(), dim=1).sum(1)  # length of the agreed prefix
    keep = torch.clamp(accepted + 1, max=gamma)
    correction = torch.where(agree, drafts, correction)
    return keep, correction, accepted


__all__ = ["DecodedDepth", "SelfSpeculativeDecoder", "accept", "SpeculativeConfig", "SpeculativeStats", "pad_after_eos",
           "warp"]
