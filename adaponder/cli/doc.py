"""``--help`` text of a command whose library module documents what it computes."""

from __future__ import annotations

#: Opens the closing paragraph of a library module's docstring that names its command (not shown in ``--help``).
POINTER = "\nCommand line: "


def description(library_doc: str | None, command_doc: str | None) -> str:
    """The library module's docstring without its closing ``Command line: ...`` paragraph, then the command
    module's docstring without its first paragraph (the usage section)."""
    body = (library_doc or "").split(POINTER)[0].rstrip()
    usage = (command_doc or "").split("\n\n", 1)[-1]
    return f"{body}\n\n{usage}" if body else usage


__all__ = ["POINTER", "description"]
