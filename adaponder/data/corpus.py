"""The small public-domain corpus shipped inside the package (see ``assets/corpus/README.md``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def bundled_corpus_dir() -> Path:
    """Folder holding the bundled Project Gutenberg books (``*.txt.gz``), usable as a ``prepare`` input."""
    return Path(str(resources.files("adaponder") / "assets" / "corpus"))


def bundled_corpus_files() -> list[Path]:
    """The bundled book files, sorted by name."""
    return sorted(bundled_corpus_dir().glob("*.txt.gz"))


__all__ = ["bundled_corpus_dir", "bundled_corpus_files"]
