"""The fine-tuning tokenizer must fit the model's embedding.

``data.tokenizer: null`` means the bundled Pythia tokenizer (~50k ids). A checkpoint pretrained with a smaller
vocabulary, fine-tuned without naming its own tokenizer, would otherwise stop with an IndexError inside the
embedding at the first batch (or, on CUDA, a device-side assert). Checked before any process group is joined.
"""

from __future__ import annotations

import json
from pathlib import Path

from adaponder.data.tokenizer import load_tokenizer

from .config import FinetuneConfigError


def _model_vocab_size(init_dir: str) -> int | None:
    """``vocab_size`` of the checkpoint's ``config.json``; None when there is none to read (``tiny-random``)."""
    config = Path(init_dir) / "config.json"
    if not config.is_file():
        return None
    value = json.loads(config.read_text(encoding="utf-8")).get("vocab_size")
    return value if isinstance(value, int) else None


def check_tokenizer_fits(init_dir: str, tokenizer_path: str | None) -> None:
    """Raise :class:`FinetuneConfigError` naming both vocabulary sizes when the tokenizer yields ids the model
    at ``init_dir`` cannot embed, and suggest the checkpoint's own tokenizer when it holds one."""
    model_vocab = _model_vocab_size(init_dir)
    if model_vocab is None:
        return
    tok = load_tokenizer(tokenizer_path)
    if tok.vocab_size <= model_vocab:
        return
    own = Path(init_dir) / "tokenizer.json"
    hint = (f"fine-tune with the checkpoint's own tokenizer: --set data.tokenizer={own}" if own.is_file()
            else "set data.tokenizer to the tokenizer the checkpoint was pretrained with")
    which = "the bundled tokenizer" if tokenizer_path is None else "data.tokenizer"
    raise FinetuneConfigError([f"data.tokenizer: {which} {tok.name} has {tok.vocab_size} tokens (ids up to "
                               f"{tok.vocab_size - 1}), but the model {init_dir} embeds only {model_vocab} "
                               f"(vocab_size in its config.json); {hint}"])


__all__ = ["check_tokenizer_fits"]
