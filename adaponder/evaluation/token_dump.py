"""The per-token dump of a scored held-out set: one row per token with its exit pass and NLL.

Written by ``adaponder-perplexity --dump``, ``adaponder-halting`` and ``adaponder-report``; read back with
:func:`read_token_dump`. It imports :mod:`.perplexity` only for type checking, so no import cycle runs through it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .perplexity import Document, TokenScores


def token_texts(tokenizer, ids: np.ndarray) -> dict[int, str]:
    """The decoded text of each distinct token id in ``ids`` (special tokens kept)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    out = {}
    for i in np.unique(ids).tolist():
        text = backend.decode([i], skip_special_tokens=False) if backend is not None else tokenizer.decode([i])
        out[i] = text
    return out


def write_token_dump(scores: TokenScores, tokenizer, path: str | Path, docs: Sequence[Document] | None = None) -> Path:
    """Write one row per scored token (JSON Lines for ``.jsonl``/``.json``, else tab-separated with a header).

    Columns: ``doc`` (index, or name when ``docs`` is given), ``position`` (index of the token in its
    document), ``token_id``, ``token`` (decoded text; in TSV, tabs/newlines are escaped as ``\\t``/``\\n``),
    ``exit_pass``, ``nll`` (nats).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    texts = token_texts(tokenizer, scores.token)
    names = [d.name for d in docs] if docs is not None else None
    jsonl = path.suffix in (".jsonl", ".json")
    with open(path, "w", encoding="utf-8") as fh:
        if not jsonl:
            fh.write("doc\tposition\ttoken_id\ttoken\texit_pass\tnll\n")
        for d, pos, tid, ep, nll in zip(scores.doc.tolist(), scores.position.tolist(), scores.token.tolist(),
                                        scores.exit_pass.tolist(), scores.nll.tolist()):
            doc = names[d] if names is not None else d
            if jsonl:
                fh.write(json.dumps({"doc": doc, "position": pos, "token_id": tid, "token": texts[tid],
                                     "exit_pass": ep, "nll": round(nll, 6)}, ensure_ascii=False) + "\n")
            else:
                text = texts[tid].replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
                fh.write(f"{doc}\t{pos}\t{tid}\t{text}\t{ep}\t{nll:.6f}\n")
    return path


def read_token_dump(path: str | Path) -> list[dict]:
    """Rows of a dump written by :func:`write_token_dump` (numbers parsed)."""
    path = Path(path)
    rows = []
    with open(path, encoding="utf-8") as fh:
        if path.suffix in (".jsonl", ".json"):
            return [json.loads(line) for line in fh if line.strip()]
        header = fh.readline().rstrip("\n").split("\t")
        for line in fh:
            vals = dict(zip(header, line.rstrip("\n").split("\t")))
            for k in ("position", "token_id", "exit_pass"):
                vals[k] = int(vals[k])
            vals["nll"] = float(vals["nll"])
            rows.append(vals)
    return rows


__all__ = ["read_token_dump", "token_texts", "write_token_dump"]
