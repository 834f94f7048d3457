"""Pass-pipelined self-speculative decoding: the tokens of one sequence in flight at successive passes, one tick each.

Pass ``p`` of the token at position ``t`` needs pass ``p − 1`` of that token (its pondering input, A4) and the
pass-``p`` keys and values of the positions before ``t`` — nothing of later passes. So while token ``t`` runs pass
2, token ``t + 1`` can already run pass 1, token ``t + 2`` the tick after, and so on: a wavefront in which every tick
runs the layer stack once over K tokens of the sequence, each at its own pass (the depth-batched decoder's tick,
several entries of the same row at different passes and positions). Token ``t + 1`` is not known while token ``t`` ponders; it is
*drafted* from token ``t``'s first pass (the draft head where the model has one, A24, else pass 1's own logits) and
verified K − 1 ticks later, when token ``t`` finishes its passes:

- the full model's token equals the draft: the tokens behind it were computed on the right input and go on;
- it differs: every entry behind it is dropped (their keys and values sit at positions no later token reads before
  it is written again — attention only reaches a row's own position and earlier) and the full model's token starts
  at pass 1 in the next tick.

Ordinary decoding runs K stack calls per token. Here a tick is one stack call, and a sequence gains a token per tick
while the drafts hold; a rejected draft costs the K − 1 ticks its pipeline needs to fill again. With agreement α
per token, about ``1 + (1 − α)(K − 1)`` ticks per token: K / that is the speed-up in stack runs (weights read),
against ``tokens per cycle · K / (γ + K − 1)`` for draft-then-verify cycles (:mod:`.speculative`), which pay the
draft passes and the verification one after the other.

A model with a re-draft head (``redraft_head``, A24: the draft head's recipe on pass K−1's state) drafts token
``t + 1`` again when token ``t`` finishes pass K − 1; where the re-draft differs from the token fed, the entries from
``t + 1`` on are dropped and the re-draft starts at once — K − 2 ticks before the full model's verdict would have
dropped them.

Every emitted token is the full model's greedy token computed on verified inputs (A15 K/V reuse included: a token
that halts early copies its K/V to the later passes at once, before any later token reaches them), so the output is
token for token that of ordinary greedy decoding. A token that halts is complete at its exit pass; the draft of the
next one is then its final distribution.

Scope: greedy decoding of prompts left-padded or not, ``ponderlm`` and ``adaponder`` with K ≥ 2 and any exit
rule that decides per element (not fixed pruning, which draws over a batch at one pass). A rule's memory across passes
(``carries``: Q-exit, or a rule of one's own) is kept per entry — it follows the entries as they are dropped and
started, and starts afresh at each token's pass 1 (:func:`~.exit_rules.rule_answer`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .depth_batching import DecoderPrefill, DepthBatchedDecoder, TickLayout, _index
from ..modeling.input_checks import check_generation_length
from ..modeling.pass_driver import drive
from ..modeling.run_settings import RunSettings


@dataclass
class PipelineStats:
    """``ticks`` stack runs after the prefill; ``token_passes`` the entry-passes they computed; ``wasted`` those of
    entries dropped (behind a rejected draft or a re-draft); ``drafted`` speculative entries started from pass 1's
    drafts; ``redrafted`` drafts replaced by pass K−1's (the re-draft head); ``accepted`` / ``rejected`` drafts
    verified equal / different (a draft dropped behind a rejected one is neither)."""

    ticks: int = 0
    token_passes: int = 0
    wasted: int = 0
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0
    redrafted: int = 0

    @property
    def acceptance_rate(self) -> float:
        judged = self.accepted + self.rejected
        return self.accepted / judged if judged else float("nan")


@dataclass
class PipelineOutput:
    """``sequences`` ``[B, T + new]``; ``exit_pass`` ``[B, new]`` of the emitted tokens (the first from the prefill);
    ``new_tokens`` ``[B]`` (fewer than asked after an EOS: the rest of the row is EOS, exit pass 0); ``stats``."""

    sequences: torch.Tensor
    exit_pass: torch.Tensor
    new_tokens: torch.Tensor
    stats: PipelineStats


class PipelinedSpeculativeDecoder:
    """``PipelinedSpeculativeDecoder(model).generate(input_ids, max_new_tokens)`` (see the module docstring).

    ``settings``: the :class:`~.run_settings.RunSettings` every pass runs with (τ, exit rule, passes)."""

    def __init__(self, model, settings: RunSettings | None = None):
        cfg = model.config
        if cfg.mode not in ("ponderlm", "adaponder") or cfg.num_passes < 2:
            raise ValueError(f"pass-pipelined drafting needs a pondering model (ponderlm or adaponder) with K >= 2; "
                             f"this one is {cfg.mode!r} with K = {cfg.num_passes}")
        self.batched = DepthBatchedDecoder(model, settings)
        self.model, self.settings = model, self.batched.settings
        if self.settings.num_passes(cfg.num_passes) < 2:
            raise ValueError(f"settings.passes ({self.settings.passes}) leaves one pass: nothing to pipeline")
        self.stats = PipelineStats()

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, eos_token_id: int | None = None,
                 prefill: DecoderPrefill | None = None, attention_mask: torch.Tensor | None = None) -> PipelineOutput:
        """``prefill``: a :class:`~.depth_batching.DecoderPrefill` of these prompts when the caller ran it (it is
        decoded in place while it has room). ``attention_mask``: left-padded prompts."""
        model = self.model
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be [batch, length] with length >= 1, got {tuple(input_ids.shape)}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        length = input_ids.shape[1]
        need = length + max_new_tokens
        check_generation_length(model.config.max_position_embeddings, length, max_new_tokens, None)
        if prefill is None:
            prefill = self.batched.prefill(input_ids, min(need, length + DepthBatchedDecoder.GROWTH), attention_mask)
        K = self.settings.num_passes(model.config.num_passes)
        layout = PipelineLayout(self.batched, prefill, input_ids, K, need, max_new_tokens, eos_token_id)
        drive(model, layout, self.settings.rule)
        self.stats = layout.stats
        layout.stats.ticks = layout.ticks
        layout.stats.token_passes = layout.token_passes
        fill = eos_token_id if eos_token_id is not None else 0
        device = input_ids.device
        gen = torch.tensor([t + [fill] * (max_new_tokens - len(t)) for t in layout.tokens], device=device)
        ex = torch.tensor([d + [0] * (max_new_tokens - len(d)) for d in layout.exits], device=device)
        count = _index([len(t) for t in layout.tokens], device)
        return PipelineOutput(torch.cat([input_ids, gen], 1), ex, count, layout.stats)


class PipelineLayout(TickLayout):
    """The pass driver's layout of :class:`PipelinedSpeculativeDecoder`: entries ``(row, pass, position)`` with the
    token fed at that position (``feeds``), several per row. Per row, ``fed`` maps the positions in flight (or finished
    and waiting for the tokens before them to be verified) to the token each was started with, ``done`` holds the
    finished ones' predictions ``(token, exit pass)`` until they are next in line."""

    def __init__(self, decoder: DepthBatchedDecoder, prefill: DecoderPrefill, input_ids: torch.Tensor, K: int,
                 need: int, max_new_tokens: int, eos_token_id: int | None):
        super().__init__(decoder, prefill, input_ids, K, need, max_new_tokens, eos_token_id, None)
        batch, self.length = input_ids.shape
        self.feeds = [self.tokens[b][-1] for b in self.live]
        self.fed = [{self.length: self.tokens[b][-1]} for b in range(batch)]
        self.done = [{} for _ in range(batch)]
        self.last_input = self.length + max_new_tokens - 2  # the last position whose prediction is still wanted
        self.stats = PipelineStats()
        model = decoder.model
        self.draft_head = getattr(model, "draft_head", None)  # the draft of pass 1's entries (None: their own logits)
        # entries at a pass with a re-draft head draft again (where the model runs its K passes: the heads were
        # trained on those passes)
        full = K == model.config.num_passes and hasattr(model, "redraft_heads")
        self.redraft_at = model.redraft_heads() if full else {}

    def _token_ids(self) -> torch.Tensor:
        return _index(self.feeds, self.device)  # each entry's own token, not its row's newest

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """Every entry's logits; the drafts of pass 1's entries and the re-drafts of the entries at a re-draft head's
        pass, through their heads (A24), in the same product with W_out."""
        self.first = [i for i, p in enumerate(self.passes) if p == 1]
        groups = [(self.draft_head, self.first)]
        groups += [(head, [i for i, p in enumerate(self.passes) if p == at]) for at, head in self.redraft_at.items()]
        self.late = sorted(i for _, which in groups[1:] for i in which)
        rows, parts = [h], []
        for head, which in groups:
            if head is not None and which:
                rows.append(head(h.index_select(0, _index(which, h.device))))
                parts.append((which, len(rows) - 1))
        z = self.model.lm_head(torch.cat(rows) if len(rows) > 1 else h)
        pieces = z.split([len(r) for r in rows]) if len(rows) > 1 else (z,)
        self.drafts = [(which, pieces[k]) for which, k in parts]
        if self.draft_head is None and self.first:  # no draft head: pass 1's own logits draft
            self.drafts.append((self.first, None))
        return pieces[0]

    def feedback(self, h, state, going):
        """As the depth-batched tick's, the drafts' tokens read with the tick's one host synchronisation."""
        z = self.z
        stop = self.pass_t >= self.K if going is None else ~going
        guess = z.new_zeros(len(self.passes), dtype=torch.long)
        for which, logits in self.drafts:
            idx = _index(which, z.device)
            guess = guess.index_copy(0, idx, (z.index_select(0, idx) if logits is None else logits).argmax(-1))
        self.halt_h, self.nxt_h, self.guess_h = torch.stack([stop.long(), z.argmax(-1), guess]).tolist()
        return self._pondering_args()

    def advance(self, E, going):
        if E is not None:
            self.E = E
        stopped = [i for i, s in enumerate(self.halt_h) if s]
        self._carry_forward([(self.live[i], self.passes[i], self.positions[i]) for i in stopped])
        self._advance()

    def _advance(self):
        """Finished entries leave with their prediction; rows' newest tokens propose the next one (drafted); each row
        then verifies in order what is next in line, dropping what a rejected draft fed."""
        live, passes, positions, feeds = self.live, self.passes, self.positions, self.feeds
        keep = []
        for i, b in enumerate(live):
            if self.halt_h[i]:
                self.done[b][positions[i]] = (self.nxt_h[i], passes[i])
            else:
                keep.append(i)
        starts = []  # (row, position, token) of entries starting at pass 1 in the next tick
        for i, b in enumerate(live):
            t = positions[i] + 1
            if passes[i] == 1 and t <= self.last_input and t not in self.fed[b]:
                guess = self.nxt_h[i] if self.halt_h[i] else self.guess_h[i]
                if self.eos is None or guess != self.eos:
                    starts.append((b, t, guess))
                    self.fed[b][t] = guess
                    self.stats.drafted += 1
        entries = [(live[i], passes[i] + 1, positions[i], feeds[i], i) for i in keep]
        for b in sorted({b for b in live}):
            entries, starts = self._verify(b, entries, starts)
        entries, starts = self._redraft(entries, starts)
        old = [e[4] for e in entries]
        E, carry = self.E, self.carry
        if len(old) < E.shape[0] or old != list(range(len(old))):
            E = E.index_select(0, _index(old, E.device))
            carry = None if carry is None else carry.index_select(0, _index(old, carry.device))
        if starts:
            E = torch.cat([E, self._first_input([tok for _, _, tok in starts])])
            if carry is not None:  # the rule's memory of the new entries: a placeholder (they start afresh at pass 1)
                carry = torch.cat([carry, carry.new_zeros(len(starts), *carry.shape[1:])])
        self.E, self.carry = E, carry
        self.live = [e[0] for e in entries] + [b for b, _, _ in starts]
        self.passes = [e[1] for e in entries] + [1] * len(starts)
        self.positions = [e[2] for e in entries] + [t for _, t, _ in starts]
        self.feeds = [e[3] for e in entries] + [tok for _, _, tok in starts]

    def _verify(self, b, entries, starts):
        """Emit row ``b``'s finished predictions that are next in line; on the first that differs from the token fed
        after it, drop every entry of the row from there on and start the full model's token instead."""
        tokens, fed, done = self.tokens[b], self.fed[b], self.done[b]
        while True:
            at = self.length + len(tokens) - 1  # the position of the newest emitted token
            if at not in done:
                return entries, starts
            y, depth = done.pop(at)
            fed.pop(at, None)
            tokens.append(y)
            self.exits[b].append(depth)
            nxt = at + 1
            if self._done(tokens):  # the row is complete: everything it has in flight goes
                return self._drop(b, nxt, entries, starts)
            if fed.get(nxt) == y:
                self.stats.accepted += 1
                continue
            if nxt in fed:
                self.stats.rejected += 1
                entries, starts = self._drop(b, nxt, entries, starts)
            if nxt <= self.last_input:
                starts.append((b, nxt, y))
                fed[nxt] = y
            return entries, starts

    def _redraft(self, entries, starts):
        """Entries at a re-draft head's pass p that go on draft their next token again: where that differs from the
        token fed there, the row's entries from there on are dropped and the new draft starts in their place — K − p
        ticks sooner than the full model's verdict would have dropped them."""
        # earliest position first: a re-draft that drops the entries behind it drops their re-drafts too
        for i in sorted(self.late, key=lambda i: self.positions[i]):
            b, t, guess = self.live[i], self.positions[i] + 1, self.guess_h[i]
            if i not in {e[4] for e in entries} or self.fed[b].get(t, guess) == guess:  # (dropped, or agrees)
                continue
            entries, starts = self._drop(b, t, entries, starts)
            self.stats.redrafted += 1
            if self.eos is None or guess != self.eos:
                starts.append((b, t, guess))
                self.fed[b][t] = guess
        return entries, starts

    def _drop(self, b, start, entries, starts):
        """Row ``b``'s entries (running or about to start) and predictions at positions ≥ ``start`` removed."""
        fed, done = self.fed[b], self.done[b]
        for t in [t for t in fed if t >= start]:
            del fed[t]
        for t in [t for t in done if t >= start]:
            del done[t]
        kept = [e for e in entries if e[0] != b or e[2] < start]
        self.stats.wasted += sum(e[1] - 1 for e in entries if e[0] == b and e[2] >= start)
        return kept, [s for s in starts if s[0] != b or s[1] < start]

    def running(self) -> bool:
        return bool(self.live)


__all__ = ["PipelineLayout", "PipelineOutput", "PipelineStats", "PipelinedSpeculativeDecoder"]
