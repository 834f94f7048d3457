"""docs/method.md is the one reference for the equations: every number the code cites is defined there.

An equation number is a part letter and a number: ``A`` (causal LM, numbers up to 30) or ``B``
(PALBERT mode, numbers up to 20; 0 counts too, so a stray zeroth entry is reported). A citation is such a token standing alone — not preceded or followed by
a letter, digit or underscore — so hardware names, hex digits and dtype names do not count. A range
such as ``A11–A13`` cites every number in it. A number is *defined* when docs/method.md has it as the
label of an entry: a Markdown heading that starts with it (``### A4 — pondering embedding``) or a bold
label (``**A4**``).
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METHOD_DOC = REPO / "docs" / "method.md"
CODE_DIRS = ("adaponder", "launch", "eval", "tests")
CITING_FILES = ("README.md",)  # besides every .py file under CODE_DIRS
MAX_NUMBER = {"A": 30, "B": 20}
TEXT_SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".txt", ".toml", ".json", ".cfg", ".ini"}

_EDGE_L, _EDGE_R = r"(?<![A-Za-z0-9_])", r"(?![A-Za-z0-9_])"
# "A4", or a range "A11–A13" / "A11-A13" (same letter on both ends).
CITATION = re.compile(_EDGE_L + r"([AB])(\d{1,2})(?:\s*[–—-]\s*\1(\d{1,2}))?" + _EDGE_R)
HEADING_LABEL = re.compile(r"^#{1,6}[ \t]+([AB])(\d{1,2})" + _EDGE_R, re.MULTILINE)
BOLD_LABEL = re.compile(r"\*\*([AB])(\d{1,2})" + _EDGE_R)

# Built from parts so that this file does not contain the path it forbids.
OUTSIDE_REFERENCE = "/".join(("shared", "docs"))


def _in_range(letter: str, number: int) -> bool:
    return 1 <= number <= MAX_NUMBER[letter] or number == 0


def cited_numbers(text: str) -> list[tuple[str, int]]:
    """``[(label, line)]`` of every equation number cited in ``text`` (ranges expanded), in order."""
    out = []
    for match in CITATION.finditer(text):
        letter, first, last = match.group(1), int(match.group(2)), match.group(3)
        line = text.count("\n", 0, match.start()) + 1
        numbers = [first]
        if last is not None:
            last = int(last)
            numbers = list(range(first, last + 1)) if first < last <= MAX_NUMBER[letter] else [first, last]
        out += [(f"{letter}{n}", line) for n in numbers if _in_range(letter, n)]
    return out


def defined_numbers(text: str) -> set[str]:
    """Entry labels of docs/method.md: headings that start with a number, and bold labels."""
    found = {f"{m.group(1)}{int(m.group(2))}" for m in HEADING_LABEL.finditer(text)}
    found |= {f"{m.group(1)}{int(m.group(2))}" for m in BOLD_LABEL.finditer(text)}
    return found


def _files(suffixes: set[str] | None) -> list[Path]:
    files = []
    for top in CODE_DIRS:
        for path in sorted((REPO / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or any(p.startswith(".") for p in
                                                                         path.relative_to(REPO).parts):
                continue
            if suffixes is None or path.suffix in suffixes:
                files.append(path)
    return files


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def test_doc_defines_the_reference_numbering():
    text = _read(METHOD_DOC)
    labels = [f"{m.group(1)}{int(m.group(2))}" for m in HEADING_LABEL.finditer(text)]
    labels += [f"{m.group(1)}{int(m.group(2))}" for m in BOLD_LABEL.finditer(text)]
    duplicates = sorted({x for x in labels if labels.count(x) > 1})
    assert not duplicates, f"{METHOD_DOC.name} defines these entries more than once: {duplicates}"
    expected = {f"A{n}" for n in range(1, 21)} | {f"B{n}" for n in range(1, 10)}
    missing = sorted(expected - set(labels), key=lambda s: (s[0], int(s[1:])))
    assert not missing, f"{METHOD_DOC.name} lacks the entries {missing}"


def test_defined_numbers_reads_only_entry_labels():
    sample = "## (a) Forward (A1–A9)\n### A4 — pondering\ntext cites A5 and **B2** here\n#### B9 — Q-exit\n"
    assert defined_numbers(sample) == {"A4", "B2", "B9"}
    assert [c for c, _ in cited_numbers("A100, B200, 0xA1, A3_x, bf16, A11–A13, B4")] == \
        ["A11", "A12", "A13", "B4"]


def test_every_cited_equation_is_defined():
    defined = defined_numbers(_read(METHOD_DOC))
    sources = [p for p in _files({".py"})] + [REPO / name for name in CITING_FILES if (REPO / name).is_file()]
    undefined = []
    for path in sources:
        for label, line in cited_numbers(_read(path)):
            if label not in defined:
                undefined.append(f"{path.relative_to(REPO)}:{line}: {label}")
    assert not undefined, (
        f"{len(undefined)} citation(s) of equation numbers that docs/method.md does not define:\n  "
        + "\n  ".join(undefined)
    )


def test_no_reference_outside_the_repository():
    offending = []
    for path in _files(TEXT_SUFFIXES):
        for number, line in enumerate(_read(path).splitlines(), start=1):
            if OUTSIDE_REFERENCE in line:
                offending.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    assert not offending, (
        f"{len(offending)} line(s) point at the spec outside the repository; cite docs/method.md instead:\n  "
        + "\n  ".join(offending)
    )
