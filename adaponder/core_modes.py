"""The recurrence modes a classifier core runs (PALBERT mode, docs/method.md (b), B1), how a checkpoint's
mode maps onto one, and the attention implementations a core may use.

A classifier halts with its own λ layer (B3), never with AdaPonder's gates (A5), so a gated ``adaponder``
checkpoint becomes a ``ponderlm`` core: the same pondering feedback and embedding scaling (A4, A7), no gates.
``pause`` (A19) is not a classifier core.

Every mode here is one of :data:`adaponder.modeling.configuration_adaponder.MODES`, the one list of
modes (``tests/test_core_modes.py`` checks it). This module imports nothing, so configuration modules can
validate a ``core_mode`` without loading torch or transformers.
"""

from __future__ import annotations

#: Modes a classifier core runs.
CLASSIFIER_CORE_MODES = ("vanilla", "ponderlm", "loop")

#: Checkpoint modes that a classifier core runs without their gates.
_GATELESS = {"adaponder": "ponderlm"}

#: What a fine-tuning configuration's ``model.core_mode`` accepts: a core mode, or a checkpoint mode that
#: maps onto one (:func:`classifier_core_mode`).
CORE_MODE_CHOICES = (*CLASSIFIER_CORE_MODES, *_GATELESS)


#: ``model.attn_implementation`` of a fine-tuning configuration. The model's configuration module keeps its own
#: copy (it ships alone inside exported checkpoints and cannot import adaponder); tests/test_core_modes.py
#: checks that the two are equal.
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")


def classifier_core_mode(mode: str) -> str:
    """The classifier-core mode for a checkpoint's (or a requested) ``mode``: ``adaponder`` → ``ponderlm``;
    every other mode is returned unchanged (and validated where the core is built)."""
    return _GATELESS.get(mode, mode)


__all__ = ["ATTN_IMPLEMENTATIONS", "CLASSIFIER_CORE_MODES", "CORE_MODE_CHOICES", "classifier_core_mode"]
