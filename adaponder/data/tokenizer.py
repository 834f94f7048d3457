"""One tokenizer interface over Hugging Face ``tokenizers`` JSON files and sentencepiece models.

The default is the GPT-NeoX-20B tokenizer used by every Pythia model, shipped gzip-compressed inside the
package (``adaponder/assets/tokenizer/gpt-neox-20b``, Apache-2.0), so nothing is downloaded.

``Tokenizer.fingerprint`` identifies what the tokenizer *does*, not where its file lives: it hashes the
vocabulary, merges and added tokens plus the ids of a fixed probe text, which exercises the normalizer and
pre-tokenizer. Re-saving the same tokenizer with another ``tokenizers`` version, compressing it or moving
it keeps the fingerprint; changing a merge, a token or the normalization changes it. Prepared data records
it so a model is never trained on ids from a different tokenizer.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import weakref
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import sentencepiece as spm
from tokenizers import Tokenizer as HFTokenizer

from .errors import DataError, InputNotFoundError

BUNDLED_NAME = "gpt-neox-20b"

# Tried in order when a tokenizer does not name its end-of-document / padding token explicitly.
_EOD_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")
_PAD_CANDIDATES = ("<|padding|>", "<pad>", "<|pad|>", "[PAD]")

# Exercises normalization (NFC/NFKC, composed vs decomposed accents, ligatures, full-width forms), whitespace
# handling, digits, CJK, emoji and special-token matching, so the fingerprint changes with behaviour even when
# the vocabulary does not.
_PROBE_TEXT = (
    "Hello, World!  Two  spaces,\tTab\nLF\r\nCRLF    4 spaces.\u00a0NBSP "
    "caf\u00e9 cafe\u0301 \ufb01ne \uff26\uff55\uff4c\uff4c \u00bd \u2460 I\u0307 \u0130stanbul "
    "12345 3.14159 don't WE'LL \u4f60\u597d\u4e16\u754c \U0001f600 \u00c5ngstr\u00f6m "
    "<|endoftext|> <pad> </s> \u2014 \u201cquoted\u201d"
)


def bundled_tokenizer_path() -> Path:
    """Path of the bundled (gzip-compressed) Pythia / GPT-NeoX-20B ``tokenizer.json.gz``."""
    return Path(str(resources.files("adaponder") / "assets" / "tokenizer" / BUNDLED_NAME / "tokenizer.json.gz"))


class Tokenizer:
    """A loaded tokenizer: HF ``tokenizers`` (``kind="hf"``) or sentencepiece (``kind="sentencepiece"``).

    ``encode`` never adds BOS/EOS or other special tokens: the data pipeline inserts ``eod_id`` itself.
    ``decode`` keeps special tokens by default so decoding is lossless (EOD shows up as ``<|endoftext|>``).
    Instances are picklable (they travel to tokenization worker processes).
    """

    def __init__(
        self,
        backend: Any,
        kind: str,
        *,
        name: str,
        fingerprint: str,
        eod_id: int,
        pad_id: int,
        source: str,
    ) -> None:
        self._backend = backend
        self.kind = kind
        self.name = name
        self.fingerprint = fingerprint
        self.eod_id = eod_id
        self.pad_id = pad_id
        self.source = source  # file it was loaded from; informational only (not part of the fingerprint)
        if kind == "hf":
            self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        else:
            self.vocab_size = backend.get_piece_size()

    # -- encoding -------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        if self.kind == "hf":
            return self._backend.encode(text, add_special_tokens=False).ids
        return self._backend.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text; identical to ``[encode(t) for t in texts]``, but faster."""
        texts = list(texts)
        if self.kind == "hf":
            # encode_batch_fast skips offset tracking (~1.5x faster); same ids.
            fn = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
            return [enc.ids for enc in fn(texts, add_special_tokens=False)]
        return self._backend.encode(texts, out_type=int)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (a list, numpy array or torch tensor)."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        ids = [int(i) for i in ids]
        if self.kind == "hf":
            return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)
        if skip_special_tokens:
            ids = [i for i in ids if not self._backend.is_control(i)]
        return self._backend.decode(ids)

    def ids_of(self, token_or_text: str) -> list[int]:
        """A special token by name (``<|endoftext|>``) → ``[its id]``; other text → its encoding; ``""`` → ``[]``."""
        if not token_or_text:
            return []
        tid = self.token_to_id(token_or_text)
        return [tid] if tid is not None else self.encode(token_or_text)

    def token_to_id(self, token: str) -> int | None:
        """Id of a token string, or None if it is not in the vocabulary."""
        if self.kind == "hf":
            return self._backend.token_to_id(token)
        i = self._backend.piece_to_id(token)
        return None if i == self._backend.unk_id() and token != self._backend.id_to_piece(i) else i

    def id_to_token(self, token_id: int) -> str | None:
        """Token string of an id, or None if out of range."""
        if not 0 <= token_id < self.vocab_size:
            return None
        if self.kind == "hf":
            return self._backend.id_to_token(token_id)
        return self._backend.id_to_piece(token_id)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (
            f"Tokenizer(name={self.name!r}, kind={self.kind!r}, vocab_size={self.vocab_size}, "
            f"eod_id={self.eod_id}, pad_id={self.pad_id}, fingerprint={self.fingerprint[:12]}…)"
        )

    # -- pickling: ship the serialized tokenizer, rebuild the backend on the other side ------------------
    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k != "_backend"}
        if self.kind == "hf":
            state["_serialized"] = self._backend.to_str()
        else:
            state["_serialized"] = self._backend.serialized_model_proto()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        serialized = state.pop("_serialized")
        self.__dict__.update(state)
        if self.kind == "hf":
            self._backend = HFTokenizer.from_str(serialized)
        else:
            self._backend = spm.SentencePieceProcessor(model_proto=serialized)


def _sha256_json(obj: Any) -> str:
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _hf_fingerprint(spec: dict[str, Any], backend: Any) -> str:
    model = spec.get("model") or {}
    merges = model.get("merges")
    if merges is not None:
        # tokenizers < 0.20 stores merges as "a b", newer versions as ["a", "b"]: canonicalize.
        merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    vocab = model.get("vocab")
    canonical = {
        "kind": "hf",
        "model_type": model.get("type"),
        "vocab": backend.get_vocab(with_added_tokens=True),
        # Unigram keeps scores in a list; BPE/WordPiece vocab dicts are already covered by get_vocab().
        "model_vocab": vocab if isinstance(vocab, list) else None,
        "merges": merges,
        "added_tokens": sorted(
            (t["id"], t["content"], bool(t.get("special", False))) for t in spec.get("added_tokens") or []
        ),
        "probe": backend.encode(_PROBE_TEXT, add_special_tokens=False).ids,
    }
    return _sha256_json(canonical)


def _pick_token(candidates: Sequence[str], lookup: Any) -> tuple[str, int] | None:
    for tok in candidates:
        i = lookup(tok)
        if i is not None:
            return tok, i
    return None


def _load_hf(path: Path, name: str, eod_token: str | None, pad_token: str | None) -> Tokenizer:
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8")
        spec = json.loads(text)
        backend = HFTokenizer.from_str(text)
    except Exception as exc:  # OSError, bad gzip, bad UTF-8/JSON, or tokenizers' own parse error
        raise DataError(
            f"{path}: cannot load as a Hugging Face tokenizers JSON file ({type(exc).__name__}: {exc}); "
            "expected a tokenizer.json (optionally .gz) or a sentencepiece .model"
        ) from exc
    eod = _resolve_special(path, backend.token_to_id, eod_token, _EOD_CANDIDATES, "end-of-document")
    pad_pick = (
        _resolve_special(path, backend.token_to_id, pad_token, _PAD_CANDIDATES, "padding")
        if pad_token
        else _pick_token(_PAD_CANDIDATES, backend.token_to_id)
    )
    pad_id = pad_pick[1] if pad_pick else eod[1]
    return Tokenizer(
        backend,
        "hf",
        name=name,
        fingerprint=_hf_fingerprint(spec, backend),
        eod_id=eod[1],
        pad_id=pad_id,
        source=str(path),
    )


def _resolve_special(
    path: Path, lookup: Any, explicit: str | None, candidates: Sequence[str], what: str
) -> tuple[str, int]:
    if explicit is not None:
        i = lookup(explicit)
        if i is None:
            raise DataError(f"{path}: {what} token {explicit!r} is not in the vocabulary")
        return explicit, i
    found = _pick_token(candidates, lookup)
    if found is None:
        raise DataError(
            f"{path}: no {what} token found (tried {', '.join(candidates)}); "
            f"pass it explicitly, e.g. load_tokenizer(path, eod_token=...)"
        )
    return found


def _load_sentencepiece(path: Path, name: str, eod_token: str | None, pad_token: str | None) -> Tokenizer:
    try:
        proto = path.read_bytes()
        backend = spm.SentencePieceProcessor(model_proto=proto)
    except Exception as exc:  # sentencepiece raises RuntimeError/OSError with terse messages
        raise DataError(f"{path}: cannot load as a sentencepiece model ({exc}); expected a .model file") from exc

    def lookup(tok: str) -> int | None:
        i = backend.piece_to_id(tok)
        return i if backend.id_to_piece(i) == tok else None

    if eod_token is not None:
        eod_id = _resolve_special(path, lookup, eod_token, (), "end-of-document")[1]
    elif backend.eos_id() >= 0:
        eod_id = backend.eos_id()
    else:
        eod_id = _resolve_special(path, lookup, None, _EOD_CANDIDATES, "end-of-document")[1]
    if pad_token is not None:
        pad_id = _resolve_special(path, lookup, pad_token, (), "padding")[1]
    else:
        pad_id = backend.pad_id() if backend.pad_id() >= 0 else eod_id
    # The serialized proto holds pieces, scores and the normalizer spec: hash it exactly.
    fingerprint = hashlib.sha256(b"sentencepiece\0" + backend.serialized_model_proto()).hexdigest()
    return Tokenizer(
        backend,
        "sentencepiece",
        name=name,
        fingerprint=fingerprint,
        eod_id=eod_id,
        pad_id=pad_id,
        source=str(path),
    )


def _resolve_path(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise InputNotFoundError(
            f"tokenizer path {p} does not exist; expected a tokenizer.json, a folder with one, "
            "or a sentencepiece .model"
        )
    if p.is_dir():
        for cand in ("tokenizer.json", "tokenizer.json.gz", "tokenizer.model"):
            if (p / cand).is_file():
                return p / cand
        models = sorted(p.glob("*.model"))
        if len(models) == 1:
            return models[0]
        raise InputNotFoundError(
            f"tokenizer folder {p} holds no tokenizer.json, tokenizer.json.gz or single *.model file"
        )
    return p


def _default_name(p: Path) -> str:
    if p.name in ("tokenizer.json", "tokenizer.json.gz", "tokenizer.model"):
        return p.parent.name or p.stem
    return p.name.split(".")[0]


@functools.lru_cache(maxsize=16)
def _load_cached(
    path: str, size: int, mtime_ns: int, name: str, eod_token: str | None, pad_token: str | None
) -> Tokenizer:
    p = Path(path)
    if p.suffix == ".model":
        return _load_sentencepiece(p, name, eod_token, pad_token)
    return _load_hf(p, name, eod_token, pad_token)


def load_tokenizer(
    path: str | Path | None = None,
    *,
    eod_token: str | None = None,
    pad_token: str | None = None,
) -> Tokenizer:
    """Load a tokenizer.

    Args:
        path: ``None`` for the bundled Pythia / GPT-NeoX-20B tokenizer; else a ``tokenizer.json`` (or
            ``.json.gz``), a folder containing one (or a single ``*.model``), or a sentencepiece ``.model``.
        eod_token: end-of-document token; default: the first of ``<|endoftext|>``, ``<|end_of_text|>``,
            ``</s>``, ``<eos>``… present (sentencepiece: its ``eos_id``).
        pad_token: padding token; default: ``<|padding|>``/``<pad>``/… if present, else the EOD token.

    Loads are cached per (file, size, mtime), so repeated calls are cheap and return the same object.
    """
    p = bundled_tokenizer_path() if path is None else _resolve_path(path)
    name = BUNDLED_NAME if path is None else _default_name(p)
    st = p.stat()
    return _load_cached(str(p.resolve()), st.st_size, st.st_mtime_ns, name, eod_token, pad_token)


def as_tokenizer(tokenizer: Any) -> Tokenizer:
    """The :class:`Tokenizer` of ``tokenizer``: a loaded one as it is; a path, or None (bundled), loaded; a
    transformers fast tokenizer (what ``AutoTokenizer`` and lm-eval hold) wrapped over its own backend — the same ids,
    EOD its eos token, padding its pad token (else EOD)."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    if tokenizer is None or isinstance(tokenizer, (str, Path)):
        return load_tokenizer(tokenizer)
    try:
        return _WRAPPED[tokenizer]
    except (KeyError, TypeError):
        pass
    backend = getattr(tokenizer, "backend_tokenizer", None)
    name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
    if backend is None:
        raise ValueError(f"tokenizer {name}: a fast tokenizer (tokenizer.json) is needed, got {type(tokenizer).__name__}")
    eod = getattr(tokenizer, "eos_token_id", None)
    if eod is None:
        raise ValueError(f"tokenizer {name} has no end-of-document (eos) token")
    pad = getattr(tokenizer, "pad_token_id", None)
    wrapped = Tokenizer(backend, "hf", name=str(name), fingerprint=_hf_fingerprint(json.loads(backend.to_str()), backend),
                        eod_id=int(eod), pad_id=int(eod if pad is None else pad), source=str(name))
    try:
        _WRAPPED[tokenizer] = wrapped
    except TypeError:  # not weak-referenceable: wrapped again next time
        pass
    return wrapped


# transformers tokenizers wrapped by as_tokenizer, while they live (their fingerprint costs a pass over the vocabulary)
_WRAPPED: "weakref.WeakKeyDictionary[Any, Tokenizer]" = weakref.WeakKeyDictionary()


__all__ = ["Tokenizer", "load_tokenizer", "as_tokenizer", "bundled_tokenizer_path", "BUNDLED_NAME"]
