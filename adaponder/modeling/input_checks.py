"""The model's input checks, run once per ``forward`` / ``generate`` call before any pass.

Wrong input would otherwise fail deep inside (an embedding lookup with float ids, a reshape of 3-D ids), or
silently give wrong numbers: rotary positions past ``max_position_embeddings`` were never trained, and a loss
over labels that are all ignored (-100) is 0/0 = NaN. The shape and position checks read host values only
(shapes, the cache's length), so they cost no device synchronisation; the value checks (ids in the vocabulary,
a label to score) share one host transfer and are skipped where the caller cannot afford it (see
``AdaPonderForCausalLM._check_inputs``).
"""

from __future__ import annotations

import torch


class ModelInputError(ValueError):
    """Input the model cannot run on: wrong dtype or shape, too long for its positions, nothing to score."""


class TokenIdError(ModelInputError):
    """Input the model cannot embed: a token id (or label) outside ``[0, vocab_size)``, or no tokens at all."""


def check_input_kind(input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> None:
    """``input_ids`` must be integer ``[batch, length]``; ``inputs_embeds`` ``[batch, length, hidden]``."""
    if input_ids is not None:
        if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise ModelInputError(f"input_ids must hold integer token ids (torch.long), got dtype {input_ids.dtype}; "
                                  "pass ids from a tokenizer, or embeddings as inputs_embeds")
        if input_ids.dim() != 2:
            raise ModelInputError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    elif inputs_embeds is not None and inputs_embeds.dim() != 3:
        raise ModelInputError(f"inputs_embeds must be [batch, length, hidden], got shape {tuple(inputs_embeds.shape)}")


def check_positions(max_positions: int, new_tokens: int, past: int = 0, stride: int = 1,
                    what: str = "the input") -> None:
    """``past`` cached positions plus ``new_tokens`` tokens (``stride`` positions each: a token and its pauses)
    must fit the model's ``max_positions``."""
    needed = past + new_tokens * stride
    if needed <= max_positions:
        return
    tokens = f"{new_tokens} tokens × {stride} positions (1 + {stride - 1} pauses)" if stride > 1 \
        else f"{new_tokens} tokens"
    cached = f"{past} cached positions + " if past else ""
    raise ModelInputError(f"{what} needs {needed} positions ({cached}{tokens}), more than the model's "
                          f"max_position_embeddings ({max_positions}); shorten it or use a window of at most "
                          f"{max_positions} positions")


def context_tokens(config) -> int:
    """Tokens the model takes at most: its positions, each token taking ``1 + num_pauses`` of them."""
    return config.max_position_embeddings // (config.num_pauses + 1)


def context_note(config) -> str:
    """How :func:`context_tokens` came about, for a message ("max_position_embeddings 128")."""
    pauses = f" / (1 + {config.num_pauses} pauses)" if config.num_pauses else ""
    return f"max_position_embeddings {config.max_position_embeddings}{pauses}"


def check_generation_length(max_positions: int, prompt: int, max_new_tokens: int | None, max_length: int | None,
                            stride: int = 1) -> None:
    """A generation of ``max_new_tokens`` (else up to ``max_length`` tokens in all) after a ``prompt`` must fit
    the model's positions, checked before the prompt is even run."""
    total = prompt + max_new_tokens if max_new_tokens is not None else max(prompt, max_length or 0)
    what = (f"generating {max_new_tokens} new tokens after a prompt of {prompt}" if max_new_tokens is not None
            else f"generating up to max_length {total} tokens")
    check_positions(max_positions, total, 0, stride, what)


def check_token_ids(vocab_size: int, **tensors: torch.Tensor | None) -> None:
    """Raise :class:`TokenIdError` naming the first id outside ``[0, vocab_size)`` (``labels`` and
    ``shift_labels`` may also hold the ignore index -100). Such an id would otherwise end in an IndexError deep
    in the embedding or the loss — on CUDA in a device-side assert that poisons the process. One min/max
    reduction per tensor and a single host transfer for all of them. Labels with nothing to score (every target
    -100; ``labels`` are shifted, so their first column never counts) raise :class:`ModelInputError`: the mean
    loss over no tokens would be NaN."""
    ids = tensors.get("input_ids")
    for name in ("labels", "shift_labels"):  # (shapes only: no host sync) torch would name neither tensor
        t = tensors.get(name)
        if ids is not None and t is not None and tuple(t.shape) != tuple(ids.shape):
            raise ModelInputError(f"{name} must have the shape of input_ids {tuple(ids.shape)} ([batch, length]: "
                                  f"one label per input token), got {tuple(t.shape)}")
    named = [(n, t if n == "input_ids" else t.masked_fill(t == -100, 0)) for n, t in tensors.items()
             if t is not None and t.numel()]
    if not named:
        return
    device = named[0][1].device  # labels may live elsewhere (forward moves them); one transfer for all bounds
    scored = [(n, tensors[n][..., 1:] if n == "labels" else tensors[n]) for n, _ in named if n != "input_ids"]
    values = [b.to(device) for _, t in named for b in torch.aminmax(t)]
    values += [(t != -100).sum().to(device) for _, t in scored]
    numbers = torch.stack(values).tolist()  # the one host sync
    bounds = numbers[:2 * len(named)]
    for (name, t), lo, hi in zip(named, bounds[0::2], bounds[1::2]):
        if lo < 0 or hi >= vocab_size:
            pos = tuple(((t < 0) | (t >= vocab_size)).nonzero()[0].tolist())
            what = "token id" if name == "input_ids" else f"{name} value"
            raise TokenIdError(f"{what} {int(t[pos])} at position {pos} is outside the vocabulary "
                               f"(size {vocab_size}: ids 0..{vocab_size - 1})")
    for (name, t), count in zip(scored, numbers[2 * len(named):]):
        if count == 0:
            shifted = " after the shift (labels[..., 1:]: the first label of a row is never a target)" \
                if name == "labels" else ""
            raise ModelInputError(f"{name} hold no target to score: every value is -100 (ignored){shifted}, so the "
                                  "loss would be NaN; leave labels out to get logits only")


__all__ = ["ModelInputError", "TokenIdError", "check_generation_length", "context_note", "context_tokens", "check_input_kind", "check_positions",
           "check_token_ids"]
