"""Input resolution and document reading for ``prepare``.

Inputs are files, folders (searched recursively), globs, or Hugging Face datasets saved with
``save_to_disk``. What one *document* is depends on the format:

- text (``.txt``/``.text``, or any explicitly named file of unknown type): the whole file is one document;
  a leading UTF-8 BOM is dropped, everything else (CRLF line endings included) is kept byte for byte;
- JSONL (``.jsonl``/``.ndjson``/``.json``, Pile-style): one document per line, ``record[text_field]``;
  blank lines are ignored;
- parquet: one document per row of column ``text_field`` (streamed with pyarrow);
- saved HF dataset (a folder with ``state.json`` or ``dataset_dict.json``, loaded with
  ``datasets.load_from_disk``): one document per row of ``text_field``; all splits of a DatasetDict in
  their saved order;
- a ``datasets`` name (:func:`hub_source`, CLI ``--hf-dataset NAME [--hf-config C] [--split S] [--streaming]``):
  ``datasets.load_dataset(NAME, C, split=S, streaming=...)`` through the datasets cache (offline: only what is
  cached); NAME may also be a local folder (data files, or a ``save_to_disk`` folder, then read with
  ``load_from_disk`` and the split picked from it). Without ``--split``, all splits in order.

Text and JSONL files may be compressed: ``.gz``, ``.zst``/``.zstd``, ``.xz``, ``.bz2``. Records whose text is
empty or null are skipped and counted. Folders are searched for the suffixes in ``FOLDER_SUFFIXES`` only
(so READMEs and licences beside the data are not swallowed); hidden files and folders are skipped.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import hashlib
import io
import json
import lzma
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import zstandard

from .errors import DataError, DecodingError, EmptyInputError, InputNotFoundError, RecordError

COMPRESSIONS = {".gz": "gz", ".zst": "zst", ".zstd": "zst", ".xz": "xz", ".bz2": "bz2"}
TEXT_SUFFIXES = (".txt", ".text")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet",)
FOLDER_SUFFIXES = (".txt", ".text", ".jsonl", ".ndjson", ".parquet")  # .json is too often a config file
_GLOB_CHARS = re.compile(r"[*?\[]")
_ESCAPED = re.compile("[\udc80-\udcff]")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Source:
    """One resolved input: a file or a saved dataset folder."""

    path: Path
    kind: str  # "text" | "jsonl" | "parquet" | "hf_dataset" | "hf_hub"
    compression: str | None = None
    #: ``hf_hub`` only: (config, split, streaming) of ``datasets.load_dataset(str(path), ...)``.
    hub: tuple[str | None, str | None, bool] | None = None

    @property
    def format(self) -> str:
        return self.kind + (f".{self.compression}" if self.compression else "")


@dataclass
class SourceStats:
    """What reading one source found; ends up in meta.json."""

    documents: int = 0
    skipped_empty: int = 0
    replacements: int = 0
    bytes: int = 0
    sha256: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# -- resolution -----------------------------------------------------------------------------------------
def _split_suffixes(path: Path) -> tuple[str, str | None]:
    """("inner" suffix, compression) of a file name, e.g. "a.jsonl.zst" -> (".jsonl", "zst")."""
    suffixes = Path(path.name.lower()).suffixes
    compression = None
    if suffixes and suffixes[-1] in COMPRESSIONS:
        compression = COMPRESSIONS[suffixes.pop()]
    return (suffixes[-1] if suffixes else ""), compression


def _classify(path: Path) -> Source:
    inner, compression = _split_suffixes(path)
    if inner in PARQUET_SUFFIXES and compression is None:
        return Source(path, "parquet")
    if inner in JSONL_SUFFIXES:
        return Source(path, "jsonl", compression)
    return Source(path, "text", compression)  # explicit files of unknown type are read as text


def _is_hf_dataset_dir(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


def _in_folder_suffixes(path: Path) -> bool:
    inner, compression = _split_suffixes(path)
    return inner in FOLDER_SUFFIXES and not (compression and inner in PARQUET_SUFFIXES)


def _walk_folder(folder: Path) -> list[Source]:
    if _is_hf_dataset_dir(folder):
        return [Source(folder, "hf_dataset")]
    found: list[Source] = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        root_path = Path(root)
        dirs.sort()
        for d in list(dirs):
            if d.startswith(".") or _is_hf_dataset_dir(root_path / d):
                dirs.remove(d)
                if not d.startswith("."):
                    found.append(Source(root_path / d, "hf_dataset"))
        for f in sorted(files):
            p = root_path / f
            if not f.startswith(".") and _in_folder_suffixes(p):
                found.append(_classify(p))
    return sorted(found, key=lambda s: str(s.path))


def resolve_inputs(inputs: Sequence[str | os.PathLike[str]]) -> list[Source]:
    """Expand files, folders and globs into an ordered, de-duplicated list of sources.

    Raises :class:`InputNotFoundError` for a missing path, or a folder or glob that yields no input file.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if not inputs:
        raise InputNotFoundError("no inputs given; expected files, folders, globs or saved datasets")
    sources: list[Source] = []
    for spec in inputs:
        if isinstance(spec, Source):  # already resolved (e.g. hub_source(...))
            sources.append(spec)
            continue
        spec_str = os.fspath(spec)
        path = Path(spec_str).expanduser()
        if path.exists():
            if path.is_dir():
                found = _walk_folder(path)
                if not found:
                    raise InputNotFoundError(
                        f"folder {path} contains no input files; expected files ending in "
                        f"{', '.join(FOLDER_SUFFIXES)} (optionally .gz/.zst/.xz/.bz2) or a saved HF dataset"
                    )
                sources.extend(found)
            else:
                sources.append(_classify(path))
        elif _GLOB_CHARS.search(spec_str):
            matches = sorted(glob.glob(os.path.expanduser(spec_str), recursive=True))
            found = []
            for m in matches:
                mp = Path(m)
                if mp.is_dir():
                    found.extend(_walk_folder(mp))
                elif mp.is_file():
                    found.append(_classify(mp))
            if not found:
                raise InputNotFoundError(f"glob {spec_str!r} matched no input files")
            sources.extend(found)
        else:
            raise InputNotFoundError(f"input {path} does not exist; expected a file, folder, glob or saved dataset")
    seen: set[Path] = set()
    unique = []
    for s in sources:
        if s.kind == "hf_hub":
            unique.append(s)
            continue
        key = s.path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(Source(key, s.kind, s.compression))
    return unique


def hub_source(name: str, config: str | None = None, split: str | None = None, streaming: bool = False) -> Source:
    """A ``datasets`` dataset by name (or local folder) as an input of ``prepare`` (see the module doc)."""
    if not name:
        raise InputNotFoundError("--hf-dataset: empty dataset name")
    return Source(Path(name), "hf_hub", None, (config, split, bool(streaming)))


# -- decoding -------------------------------------------------------------------------------------------
def decode_utf8(data: bytes, errors: str, where: str, base_offset: int = 0) -> tuple[str, int]:
    """Decode UTF-8; return (text, number of replaced bytes).

    ``errors="strict"`` raises :class:`DecodingError` naming ``where`` and the byte offset. ``"replace"``
    substitutes U+FFFD for every byte that is not part of valid UTF-8 and counts those bytes.
    """
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError as exc:
        if errors != "replace":
            bad = data[exc.start : exc.end].hex(" ")
            raise DecodingError(
                f"{where}: byte offset {base_offset + exc.start}: invalid UTF-8 (bytes {bad}: {exc.reason}); "
                "expected UTF-8 text. Convert the file, or pass errors='replace' (CLI: --errors replace) "
                "to substitute U+FFFD and count the replacements"
            ) from None
    # Only reached for 'replace': surrogateescape maps each bad byte to one lone surrogate (valid UTF-8 never
    # decodes to a surrogate), which makes the count exact and per byte.
    text = data.decode("utf-8", "surrogateescape")
    n = len(_ESCAPED.findall(text))
    return _ESCAPED.sub("\ufffd", text), n


# -- raw reading with hashing ----------------------------------------------------------------------------
class _HashingReader(io.RawIOBase):
    """Passes a binary file through while hashing the raw (possibly compressed) bytes."""

    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.sha = hashlib.sha256()
        self.nbytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self._f.readinto(b)  # type: ignore[attr-defined]
        if n:
            self.sha.update(memoryview(b)[:n])
            self.nbytes += n
        return n or 0

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass


def _decompressing(raw: IO[bytes], compression: str | None) -> IO[bytes]:
    if compression is None:
        return io.BufferedReader(raw, _CHUNK)  # type: ignore[arg-type]
    if compression == "gz":
        return io.BufferedReader(gzip.GzipFile(fileobj=raw), _CHUNK)  # type: ignore[arg-type]
    if compression == "xz":
        return io.BufferedReader(lzma.LZMAFile(raw), _CHUNK)  # type: ignore[arg-type]
    if compression == "bz2":
        return io.BufferedReader(bz2.BZ2File(raw), _CHUNK)  # type: ignore[arg-type]
    if compression == "zst":
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        return io.BufferedReader(reader, _CHUNK)  # type: ignore[arg-type]
    raise ValueError(compression)


def _decompress_errors() -> tuple[type[BaseException], ...]:
    return (EOFError, OSError, lzma.LZMAError, zstandard.ZstdError)


def sha256_file(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def _sha256_tree(folder: Path) -> tuple[str, int]:
    """Hash of every file under a folder (relative names and contents), in sorted order."""
    h = hashlib.sha256()
    total = 0
    for p in sorted(q for q in folder.rglob("*") if q.is_file()):
        digest, n = sha256_file(p)
        h.update(f"{p.relative_to(folder).as_posix()}\0{digest}\n".encode())
        total += n
    return h.hexdigest(), total


# -- per-format document iterators -----------------------------------------------------------------------
def _iter_text(src: Source, errors: str, stats: SourceStats) -> Iterator[str]:
    try:
        with open(src.path, "rb") as f:
            hashing = _HashingReader(f)
            with _decompressing(hashing, src.compression) as stream:  # type: ignore[arg-type]
                data = stream.read()
            hashing.drain()
    except _decompress_errors() as exc:
        raise DataError(f"{src.path}: cannot read {src.format} file ({exc}); expected a valid {src.format} file") from exc
    stats.sha256, stats.bytes = hashing.sha.hexdigest(), hashing.nbytes
    where = str(src.path) + (" (decompressed)" if src.compression else "")
    if not data:
        raise EmptyInputError(f"{src.path}: empty file; expected UTF-8 text")
    text, stats.replacements = decode_utf8(data, errors, where)
    if text.startswith("\ufeff"):
        text = text[1:]  # a BOM marks the encoding, it is not part of the text
    if not text.strip():
        raise EmptyInputError(f"{src.path}: file holds only whitespace; expected text")
    stats.documents = 1
    yield text


def _text_of(record: Any, text_field: str, where: str) -> str | None:
    if not isinstance(record, dict):
        raise RecordError(
            f"{where}: expected a JSON object with a {text_field!r} field, got {type(record).__name__}"
        )
    if text_field not in record:
        keys = ", ".join(repr(k) for k in list(record)[:10]) or "none"
        raise RecordError(f"{where}: record has no {text_field!r} field (keys: {keys}); set text_field")
    value = record[text_field]
    if value is not None and not isinstance(value, str):
        raise RecordError(f"{where}: field {text_field!r} is {type(value).__name__}, expected a string")
    return value


def _iter_jsonl(src: Source, text_field: str, errors: str, stats: SourceStats) -> Iterator[str]:
    offset = 0
    saw_bytes = False
    try:
        with open(src.path, "rb") as f:
            hashing = _HashingReader(f)
            with _decompressing(hashing, src.compression) as stream:  # type: ignore[arg-type]
                for lineno, raw_line in enumerate(stream, start=1):
                    saw_bytes = True
                    where = f"{src.path}: line {lineno}"
                    line, n_rep = decode_utf8(raw_line, errors, where, base_offset=offset)
                    offset += len(raw_line)
                    stats.replacements += n_rep
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise RecordError(
                            f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); "
                            f"expected one JSON object per line with a {text_field!r} field"
                        ) from None
                    text = _text_of(record, text_field, where)
                    if not text:
                        stats.skipped_empty += 1
                        continue
                    stats.documents += 1
                    yield text
            hashing.drain()
    except _decompress_errors() as exc:
        raise DataError(f"{src.path}: cannot read {src.format} file ({exc}); expected a valid {src.format} file") from exc
    stats.sha256, stats.bytes = hashing.sha.hexdigest(), hashing.nbytes
    if not saw_bytes:
        raise EmptyInputError(f"{src.path}: empty file; expected JSON lines with a {text_field!r} field")
    if stats.documents == 0:
        raise EmptyInputError(
            f"{src.path}: no non-empty documents; expected JSON lines with a non-empty {text_field!r} field"
        )


def _check_column_values(values: list[Any], text_field: str, where: str, first_row: int) -> None:
    for i, v in enumerate(values):
        if v is not None and not isinstance(v, str):
            raise RecordError(
                f"{where}: row {first_row + i}: column {text_field!r} is {type(v).__name__}, expected a string"
            )


def _iter_parquet(src: Source, text_field: str, stats: SourceStats) -> Iterator[str]:
    # pyarrow takes a noticeable time to import: only parquet inputs need it, not every tokenizer worker
    import pyarrow as pa
    import pyarrow.parquet as pq

    stats.sha256, stats.bytes = sha256_file(src.path)
    if stats.bytes == 0:
        raise EmptyInputError(f"{src.path}: empty file; expected a parquet file")
    try:
        pf = pq.ParquetFile(src.path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{src.path}: cannot read as parquet ({exc}); expected a parquet file") from exc
    names = pf.schema_arrow.names
    if text_field not in names:
        raise RecordError(f"{src.path}: no column {text_field!r} (columns: {', '.join(names)}); set text_field")
    row = 0
    for batch in pf.iter_batches(columns=[text_field], batch_size=1024):
        values = batch.column(0).to_pylist()
        yield from _column_values(values, text_field, str(src.path), row, stats)
        row += len(values)
    if stats.documents == 0:
        raise EmptyInputError(f"{src.path}: no non-empty values in column {text_field!r} ({row} rows)")


def _column_values(values: list, text_field: str, where: str, first_row: int, stats: SourceStats) -> Iterator[str]:
    """The non-empty ``values`` of one batch of a text column (rows from ``first_row``), counted in ``stats``."""
    _check_column_values(values, text_field, where, first_row)
    for v in values:
        if v:
            stats.documents += 1
            yield v
        else:
            stats.skipped_empty += 1


def _iter_text_column(parts, text_field: str, stats: SourceStats, where_of, hint: str) -> Iterator[str]:
    """The non-empty values of column ``text_field`` of each ``(split name, dataset)`` in ``parts`` (map-style or
    streaming), counted in ``stats``; ``where_of(name)`` names a split in errors, ``hint`` says how to choose
    another column. Raises :class:`EmptyInputError` when no value is left."""
    import datasets  # seconds to import: only Hugging Face dataset inputs need it, not every tokenizer worker

    rows = 0
    for name, ds in parts:
        where = where_of(name)
        columns = ds.column_names
        if columns is not None and text_field not in columns:
            raise RecordError(f"{where}: no column {text_field!r} (columns: {', '.join(columns)}); set {hint}")
        batches = (ds.select_columns([text_field]).iter(batch_size=1024) if isinstance(ds, datasets.Dataset)
                   else ds.iter(batch_size=1024))
        row = 0
        for batch in batches:
            if text_field not in batch:  # a streaming dataset learns its columns from its first batch
                raise RecordError(f"{where}: no column {text_field!r} (columns: {', '.join(batch)}); set {hint}")
            yield from _column_values(batch[text_field], text_field, where, row, stats)
            row += len(batch[text_field])
        rows += row
    if stats.documents == 0:
        raise EmptyInputError(f"{where_of(None)}: no non-empty values in column {text_field!r} ({rows} rows)")


def _iter_hf_dataset(src: Source, text_field: str, stats: SourceStats) -> Iterator[str]:
    import datasets  # seconds to import: only Hugging Face dataset inputs need it, not every tokenizer worker

    stats.sha256, stats.bytes = _sha256_tree(src.path)
    try:
        loaded = datasets.load_from_disk(str(src.path))
    except Exception as exc:  # datasets raises FileNotFoundError/ValueError/arrow errors
        raise DataError(f"{src.path}: cannot load with datasets.load_from_disk ({exc})") from exc
    parts = list(loaded.items()) if isinstance(loaded, datasets.DatasetDict) else [(None, loaded)]
    stats.extra["splits"] = [name for name, _ in parts if name is not None]
    yield from _iter_text_column(parts, text_field, stats, hint="text_field",
                                 where_of=lambda name: f"{src.path}" + (f" [split {name!r}]" if name else ""))


def _hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def _load_hub(src: Source):
    import datasets  # seconds to import: only Hugging Face dataset inputs need it, not every tokenizer worker

    config, split, streaming = src.hub or (None, None, False)
    name = str(src.path)
    what = f"dataset {name!r}" + (f" (config {config!r})" if config else "") + (f" split {split!r}" if split else "")
    local = Path(name).expanduser()
    if local.is_dir() and _is_hf_dataset_dir(local):  # written by save_to_disk: load_dataset cannot read it
        try:
            loaded = datasets.load_from_disk(str(local))
        except Exception as exc:
            raise DataError(f"{local}: cannot load with datasets.load_from_disk ({exc})") from exc
        if split is not None:
            if not isinstance(loaded, datasets.DatasetDict):
                raise DataError(f"{local}: a single saved split; leave out --split (asked for {split!r})")
            if split not in loaded:
                raise DataError(f"{local}: no split {split!r} (splits: {', '.join(loaded)})")
            loaded = loaded[split]
        if streaming:
            loaded = (datasets.IterableDatasetDict({k: v.to_iterable_dataset() for k, v in loaded.items()})
                      if isinstance(loaded, datasets.DatasetDict) else loaded.to_iterable_dataset())
        return loaded, what
    try:
        return datasets.load_dataset(name, config, split=split, streaming=streaming), what
    except Exception as exc:  # ConnectionError, FileNotFoundError, DatasetNotFoundError, ValueError, ...
        hint = (" HF_DATASETS_OFFLINE / HF_HUB_OFFLINE is set and it is not in the datasets cache: load it once "
                "online (or save it with save_to_disk and pass that folder)" if _hub_offline() else "")
        raise InputNotFoundError(f"--hf-dataset: cannot load {what}: {type(exc).__name__}: {exc}.{hint}") from exc


def _iter_hub_dataset(src: Source, text_field: str, stats: SourceStats) -> Iterator[str]:
    import datasets  # seconds to import: only Hugging Face dataset inputs need it, not every tokenizer worker

    loaded, what = _load_hub(src)
    config, split, streaming = src.hub or (None, None, False)
    stats.extra.update(hf_dataset=str(src.path), hf_config=config, split=split, streaming=streaming)
    dict_types = (datasets.DatasetDict, datasets.IterableDatasetDict)
    parts = list(loaded.items()) if isinstance(loaded, dict_types) else [(split, loaded)]
    stats.extra["splits"] = [name for name, _ in parts if name is not None]
    for name, ds in parts:
        fp = getattr(ds, "_fingerprint", None)
        if fp:
            stats.extra.setdefault("fingerprints", {})[str(name)] = fp
    yield from _iter_text_column(
        parts, text_field, stats, hint="--text-field",
        where_of=lambda name: what + (f" [split {name!r}]" if name is not None and split is None else ""))


def iter_documents(src: Source, text_field: str, errors: str, stats: SourceStats) -> Iterator[str]:
    """Yield the documents of one source, filling ``stats`` as it goes (complete once exhausted)."""
    if src.kind == "text":
        return _iter_text(src, errors, stats)
    if src.kind == "jsonl":
        return _iter_jsonl(src, text_field, errors, stats)
    if src.kind == "parquet":
        return _iter_parquet(src, text_field, stats)
    if src.kind == "hf_dataset":
        return _iter_hf_dataset(src, text_field, stats)
    if src.kind == "hf_hub":
        return _iter_hub_dataset(src, text_field, stats)
    raise ValueError(f"unknown source kind {src.kind!r}")


__all__ = ["Source", "SourceStats", "resolve_inputs", "hub_source", "iter_documents", "decode_utf8", "sha256_file"]
