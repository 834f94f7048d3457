"""Model-shape presets: the published Pythia shapes and a tiny CPU shape.

Shapes follow the Pythia model cards / configs (rotary_pct 0.25, parallel residual, untied embeddings,
vocabulary padded to a multiple of 128: 50304, except 6.9B (50432) and 12B (50688) whose released
checkpoints pad further for model parallelism). The pretraining recipe lives in ``configs/*.yaml``.
"""

from __future__ import annotations

import os
from typing import Any

from adaponder.errors import UsageError

from .configuration_adaponder import AdaPonderConfig

# name: (hidden, layers, heads, vocab, published total parameters)
PYTHIA_SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "70m": (512, 6, 8, 50304, 70_426_624),
    "160m": (768, 12, 12, 50304, 162_322_944),
    "410m": (1024, 24, 16, 50304, 405_334_016),
    "1b": (2048, 16, 8, 50304, 1_011_781_632),
    "1.4b": (2048, 24, 16, 50304, 1_414_647_808),
    "2.8b": (2560, 32, 32, 50304, 2_775_208_960),
    "6.9b": (4096, 32, 32, 50432, 6_857_302_016),
    "12b": (5120, 36, 40, 50688, 11_846_072_320),
}

# A shape for CPU tests and the README demo: Pythia's layout, tiny sizes.
TINY_SHAPE = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
                  vocab_size=50304, max_position_embeddings=512)


def pythia_shape(size: str) -> dict[str, Any]:
    """GPT-NeoX config fields of a Pythia size (``"70m"`` … ``"12b"``) or ``"tiny"``."""
    key = size.lower().removeprefix("pythia-").removeprefix("pythia")
    base = dict(rotary_pct=0.25, rotary_emb_base=10000, use_parallel_residual=True, tie_word_embeddings=False,
                layer_norm_eps=1e-5, initializer_range=0.02, hidden_act="gelu", max_position_embeddings=2048,
                bos_token_id=0, eos_token_id=0)
    if key == "tiny":
        return {**base, **TINY_SHAPE}
    if key not in PYTHIA_SHAPES:
        raise KeyError(f"unknown Pythia size {size!r}; known: {', '.join(PYTHIA_SHAPES)}, tiny")
    d, n_layers, heads, vocab, _ = PYTHIA_SHAPES[key]
    return {**base, "hidden_size": d, "num_hidden_layers": n_layers, "num_attention_heads": heads,
            "intermediate_size": 4 * d, "vocab_size": vocab}


def checked_size(value: str, arg: str, also: tuple[str, ...] = ("tiny",)) -> str:
    """``value`` if it names a Pythia shape (``70m`` … ``12b``, ``pythia-`` prefix allowed) or one of ``also``; a
    :class:`UsageError` otherwise (a checkpoint path given where a shape is expected reached the shape table and
    failed there with a ``KeyError``)."""
    key = str(value).lower().removeprefix("pythia-").removeprefix("pythia")
    known = [*PYTHIA_SHAPES, *also]
    if key not in known:
        hint = ("; it looks like a path, and this option takes a model shape, not a checkpoint"
                if "/" in str(value) or os.sep in str(value) else "")
        raise UsageError(f"{arg} {value!r}: no such Pythia size{hint}; expected one of {', '.join(known)}")
    return value


def default_input_scale(size: str, passes: int) -> float:
    """c of A1: 1 for 70M/160M, K−1 for 410M and up (PonderLM's recipe)."""
    key = size.lower().removeprefix("pythia-").removeprefix("pythia")
    return 1.0 if key in ("tiny", "70m", "160m") else float(max(passes - 1, 1))


def pythia_config(size: str, mode: str = "adaponder", **overrides: Any) -> AdaPonderConfig:
    """An :class:`AdaPonderConfig` for a Pythia size in a given mode; ``overrides`` win."""
    values = pythia_shape(size)
    values["mode"] = mode
    values.update(overrides)
    passes = values.get("passes") or (1 if mode in ("vanilla", "pause") else 4)
    values.setdefault("input_scale", default_input_scale(size, passes))
    return AdaPonderConfig.from_mapping(values, source=f"preset {size!r}")
