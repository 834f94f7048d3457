"""``model.generate(ids, decoding=DecodingConfig(...))``: one entry to every way of decoding.

The combination is checked against the support table (:mod:`.support`) before any forward; then one strategy
runs and its result is brought to one shape (:class:`GenerationOutput`): the tokens after a row's EOS are the pad
token and their exit passes 0, and the sequences end where transformers' ``generate`` ends them (at the last row's
EOS, else after ``max_new_tokens``). Nothing is left on the model; compiled steps are kept per model in a weak map,
so a second call of the same shapes compiles nothing.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from transformers import GenerationMixin

from ..modeling.run_settings import RunSettings, settings_or_default
from .config import DecodingConfig
from .depth_batching import DepthBatchedDecoder
from .pass_pipeline import PipelinedSpeculativeDecoder
from .speculative import SelfSpeculativeDecoder, SpeculativeConfig, pad_after_eos
from .static_decoding import StaticDecoder
from .static_speculative import StaticSpeculativeDecoder
from .support import Combination, refusal_line

#: Keywords the strategies other than transformers' own generate take.
TAKEN = ("attention_mask", "max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "eos_token_id",
         "pad_token_id", "generator")
SAMPLING = ("temperature", "top_k", "top_p", "generator")


@dataclass
class GenerationOutput:
    """``sequences`` ``[B, T + n]``; ``exit_pass`` ``[B, n]`` the pass each new token's distribution came from (the
    first from the prefill; 0 after the row's EOS); ``new_tokens`` ``[B]`` tokens each row generated, its EOS
    included; ``stats`` the strategy's counts (drafts accepted, ticks; None for plain decoding); ``strategy`` what
    ran."""

    sequences: torch.Tensor
    exit_pass: torch.Tensor
    new_tokens: torch.Tensor
    stats: object | None
    strategy: str


class GenerationRefused(ValueError):
    """A combination the support table refuses (:func:`~.support.refusal_line`), raised before any forward."""


#: Decoders holding compiled steps, per model (a model's second call with the same settings compiles nothing).
_compiled: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def _old_spelling(speculative, settings: RunSettings | None) -> DecodingConfig:
    """``speculative=`` and ``RunSettings(compile=True)``, the spellings before ``decoding=``."""
    compiled = bool(getattr(settings, "compile", False))
    if speculative is None:
        return DecodingConfig(compile=compiled)
    if isinstance(speculative, str):
        if speculative != "pipelined":
            raise ValueError(f"speculative={speculative!r}: the named way is 'pipelined' "
                             f"(now decoding=DecodingConfig(schedule='pipelined'))")
        return DecodingConfig(schedule="pipelined", compile=compiled)
    if not isinstance(speculative, SpeculativeConfig):
        raise TypeError(f"speculative must be a SpeculativeConfig or 'pipelined', got {type(speculative).__name__}")
    return DecodingConfig(draft=speculative, compile=compiled)


def generate_with(model, input_ids, args=(), *, decoding: DecodingConfig | None = None, speculative=None, **kwargs):
    """What ``model.generate`` runs when ``decoding=`` (or an older spelling) is given: a :class:`GenerationOutput`
    for ``decoding=``, the sequences alone for the older spellings."""
    settings = kwargs.pop("settings", None)
    kwargs.pop("input_ids", None)
    if decoding is not None and speculative is not None:
        raise TypeError("give decoding= alone: speculative= is its older spelling "
                        "(decoding=DecodingConfig(draft=SpeculativeConfig(...)) or schedule='pipelined')")
    old = decoding is None
    if old:
        decoding = _old_spelling(speculative, settings)
    elif not isinstance(decoding, DecodingConfig):
        raise TypeError(f"decoding must be a DecodingConfig, got {type(decoding).__name__}")
    elif getattr(settings, "compile", False) and not decoding.compile:
        raise TypeError("RunSettings(compile=True) and decoding=DecodingConfig(compile=False) disagree: compiling is "
                        "now DecodingConfig(compile=True)")
    settings = settings_or_default(settings).replace(compile=decoding.compile)
    if args:
        raise TypeError("generate(decoding=...) takes the prompt as its one positional argument")
    out = decode(model, input_ids, decoding, settings, **kwargs)
    return out.sequences if old else out


def decode(model, input_ids: torch.Tensor, decoding: DecodingConfig, settings: RunSettings, **kwargs):
    """Check the combination, run its strategy, return a :class:`GenerationOutput`."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError("generate(decoding=...) takes input_ids as a [batch, length] tensor")
    mask = kwargs.get("attention_mask")
    sampling = bool(kwargs.get("do_sample")) or any(kwargs.get(k) is not None for k in SAMPLING)
    plain = decoding == DecodingConfig()
    if sampling and not kwargs.get("do_sample") and not plain:
        named = ", ".join(k for k in SAMPLING if kwargs.get(k) is not None)
        raise TypeError(f"{named} given without do_sample=True")
    combination = Combination(model.config.mode, decoding.schedule, decoding.draft is not None, decoding.compile,
                              mask is not None and not bool(mask.all()), sampling)
    line = refusal_line(combination)
    if line is not None:
        raise GenerationRefused(line)
    if not plain:
        other = sorted(set(kwargs) - set(TAKEN))
        if other:
            raise TypeError(f"{decoding.spelled()} takes {', '.join(TAKEN)} and settings; got {', '.join(other)}")
    gen = model.generation_config
    new = kwargs.pop("max_new_tokens", None) or gen.max_new_tokens or 20
    eos = kwargs.pop("eos_token_id", gen.eos_token_id)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    pad = kwargs.pop("pad_token_id", gen.pad_token_id)
    with torch.no_grad():
        if plain:
            sequences, exits, stats, name = _plain(model, input_ids, settings, new, eos, pad, kwargs)
        else:
            sequences, exits, stats, name = _strategy(model, input_ids, decoding, settings, new, eos, pad, kwargs)
    return _shaped(input_ids.shape[1], sequences, exits, stats, name, eos, pad)


def _plain(model, ids, settings, new, eos, pad, kwargs):
    """The reference: transformers' ``generate`` on the eager cached forward, the exit passes read off every forward
    it runs (the last position's: the pass the next token's distribution came from)."""
    exits = []
    hook = model.register_forward_hook(lambda module, inputs, output: exits.append(output.exit_pass[:, -1]))
    try:
        sequences = GenerationMixin.generate(model, ids, max_new_tokens=new, eos_token_id=eos, pad_token_id=pad,
                                             settings=settings, **kwargs)
    finally:
        hook.remove()
    n = sequences.shape[1] - ids.shape[1]
    return sequences, torch.stack(exits[:n], 1), None, "token, eager (transformers' generate)"


def _cached(model, key, make):
    """A decoder holding compiled steps, kept per model while its settings stay the same."""
    held = _compiled.setdefault(model, {})
    if key not in held:
        held[key] = make()
    return held[key]


def _strategy(model, ids, decoding, settings, new, eos, pad, kwargs):
    mask = kwargs.get("attention_mask")
    if decoding.schedule == "depth":
        out = DepthBatchedDecoder(model, settings).generate(ids, new, eos, attention_mask=mask)
        return out.sequences, out.exit_pass, out, "depth, eager"
    if decoding.schedule == "pipelined":
        out = PipelinedSpeculativeDecoder(model, settings).generate(ids, new, eos, attention_mask=mask)
        return out.sequences, out.exit_pass, out.stats, "pipelined, eager"
    way = "compiled" if decoding.compile else "eager"
    sampling = {k: kwargs[k] for k in ("do_sample", "temperature", "top_k", "top_p", "generator")
                if kwargs.get(k) is not None}
    if decoding.draft is None:  # token by token on the compiled static step
        decoder = _cached(model, ("static", settings), lambda: StaticDecoder(model, settings))
        out = decoder.generate(ids, mask, new, eos_token_id=eos, pad_token_id=pad, **sampling)
        return out.sequences, out.exit_pass, None, f"token, {way} static step"
    if decoding.compile:
        decoder = _cached(model, ("speculative", settings, decoding.draft),
                          lambda: StaticSpeculativeDecoder(model, decoding.draft, settings))
        sequences = decoder.generate(ids, mask, new, eos, pad, **sampling)
        return sequences, decoder.exit_pass, decoder.stats, "token, draft then verify, compiled"
    decoder = SelfSpeculativeDecoder(model, decoding.draft, settings=settings)
    sequences = decoder.generate(ids, max_new_tokens=new, eos_token_id=eos, pad_token_id=pad, **kwargs)
    return sequences, decoder.exit_pass, decoder.stats, "token, draft then verify, eager"


def _shaped(length, sequences, exits, stats, name, eos, pad) -> GenerationOutput:
    """One shape for every strategy: pad after each row's EOS, exit passes 0 there, columns after the last row's EOS
    dropped (transformers' ``generate`` stops once every row has one)."""
    new = pad_after_eos(sequences[:, length:], eos, pad)
    exits = exits[:, :new.shape[1]].clone()
    if eos is None:
        count = torch.full((new.shape[0],), new.shape[1], dtype=torch.long, device=new.device)
    else:
        is_eos = (new == eos).long()
        done_before = is_eos.cumsum(1) - is_eos > 0  # after the row's first EOS
        exits[done_before] = 0
        ended = is_eos.cumsum(1).clamp(max=1)
        count = torch.where(ended[:, -1] > 0, is_eos.argmax(1) + 1, new.shape[1])
        keep = int(count.max())
        new, exits = new[:, :keep], exits[:, :keep]
    return GenerationOutput(torch.cat([sequences[:, :length], new], 1), exits, count, stats, name)


__all__ = ["DecodingConfig", "GenerationOutput", "GenerationRefused", "decode", "generate_with"]
