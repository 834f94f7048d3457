"""Small JSON results: made JSON-safe (NaN → null, NumPy scalars → numbers) and written atomically."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def json_safe(obj: Any) -> Any:
    """A copy of ``obj`` that ``json.dumps`` writes as strict JSON: NaN/inf → None, NumPy scalars → numbers."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as indented JSON beside ``path``, then rename: a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


__all__ = ["json_safe", "write_json_atomic"]
