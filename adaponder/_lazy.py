"""Lazy package exports: names resolved from their modules on first access (PEP 562), so importing a
package stays cheap (no torch in tokenizer workers, no lm-eval or matplotlib until needed)."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` serving ``exports``: name → submodule of ``package`` (``"loader"``) or an
    absolute module name (``"adaponder.palbert.config"``)."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = exports[name]
        target = module if module.startswith("adaponder.") else f"{package}.{module}"
        return getattr(importlib.import_module(target), name)

    return __getattr__
