"""Decoding: ``model.generate(ids, decoding=DecodingConfig(...))`` and the strategies behind it.

Not shipped with checkpoints: a saved model carries its configuration and forward only, and transformers' own
``generate`` runs on it where adaponder is not installed.
"""

from .config import DecodingConfig
from .engine import GenerationOutput, GenerationRefused, decode, generate_with
from .speculative import SpeculativeConfig
from .support import Combination, markdown_table, refusal, refusal_line

__all__ = ["Combination", "DecodingConfig", "GenerationOutput", "GenerationRefused", "SpeculativeConfig", "decode",
           "generate_with", "markdown_table", "refusal", "refusal_line"]
