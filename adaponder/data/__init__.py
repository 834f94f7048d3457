"""AdaPonder data pipeline: tokenizer, one-time preparation into token shards, packed resumable loader.

Typical use::

    from adaponder.data import PackedLoader, bundled_corpus_dir, load_tokenizer
    from adaponder.data.prepare import prepare  # (adaponder.data.prepare itself is the module)
    prepare([str(bundled_corpus_dir())], "data/bundled", num_workers=2)
    loader = PackedLoader("data/bundled", seq_len=256, micro_batch_size=8,
                          tokenizer_fingerprint=load_tokenizer().fingerprint)
    for batch in loader:            # LongTensor [8, 257]; inputs batch[:, :-1], labels batch[:, 1:]
        ...

Names are imported lazily so that tokenization worker processes never import torch.
"""

from __future__ import annotations

from adaponder._lazy import lazy_getattr


from .corpus import bundled_corpus_dir, bundled_corpus_files
# the error classes are re-exported as errors.__all__ lists them, so that list is the only one
from . import errors
from .errors import *  # noqa: F401, F403

_LAZY = {
    "Tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "PackedLoader": "loader",
    "iter_eval_batches": "loader",
    "read_meta": "layout",
    "IndexedDataset": "indexed",
    "IndexedLoader": "indexed",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "bundled_corpus_dir",
    "bundled_corpus_files",
    *errors.__all__,
    *_LAZY,
]
