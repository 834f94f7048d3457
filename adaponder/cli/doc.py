"""``--help`` text of a command whose library module documents what it computes."""

from __future__ import annotations

import argparse

#: Opens the closing paragraph of a library module's docstring that names its command (not shown in ``--help``).
POINTER = "\nCommand line: "


def description(library_doc: str | None, command_doc: str | None) -> str:
    """The library module's docstring without its closing ``Command line: ...`` paragraph, then the command
    module's docstring without its first paragraph (the usage section)."""
    body = (library_doc or "").split(POINTER)[0].rstrip()
    usage = (command_doc or "").split("\n\n", 1)[-1]
    return f"{body}\n\n{usage}" if body else usage


class DefaultsHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` with every option's default after its help text (as ``ArgumentDefaultsHelpFormatter``), except where
    the text states its default already or there is none to show (None, a flag's False, an empty list); descriptions
    and epilogs as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        nothing = action.default is None or action.default is False or action.default in ([], "", argparse.SUPPRESS)
        if nothing or not action.option_strings or "default" in text.lower() or text == argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


__all__ = ["DefaultsHelpFormatter", "POINTER", "description"]
