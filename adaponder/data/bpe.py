"""Train a small byte-level BPE tokenizer on a corpus's training documents (``adaponder-prepare --train-tokenizer``).

Small studies need a small vocabulary: with Pythia's 50k entries a model a few million parameters wide is
almost all embedding and output head. The tokenizer is byte-level (every string round-trips exactly, no
unknown token), has no normalizer (the ids of a text are a function of its bytes), and reserves the ids
Pythia uses for its special tokens: ``<|endoftext|>`` = 0 (end of document) and ``<|padding|>`` = 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ("<|endoftext|>", "<|padding|>")
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # the byte alphabet plus the special tokens


def train_bpe(texts: Iterable[str], vocab_size: int, out_file: str | Path, *, num_texts: int | None = None) -> Path:
    """Train byte-level BPE with ``vocab_size`` entries (special tokens included) on ``texts`` and save it
    as a Hugging Face ``tokenizer.json`` at ``out_file``."""
    if vocab_size < MIN_VOCAB:
        raise ValueError(f"a byte-level BPE vocabulary needs at least {MIN_VOCAB} entries "
                         f"(256 bytes + {len(SPECIAL_TOKENS)} special tokens), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer, length=num_texts)
    out = Path(out_file)
    tok.save(str(out))
    return out


__all__ = ["train_bpe", "SPECIAL_TOKENS", "MIN_VOCAB"]
