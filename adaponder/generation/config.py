"""What ``model.generate(ids, decoding=DecodingConfig(...))`` runs: a schedule, a draft and compiled steps.

The schedule says which tokens one stack run computes:

- ``"token"``: every row's next token through its passes, token after token (the cached forward's order);
- ``"depth"``: every row at its own pass of its own token, one stack run a tick; a row whose token halts starts
  its next token in the next tick (depth-wise continuous batching);
- ``"pipelined"``: the tokens of one sequence in flight at successive passes, the next token drafted from the
  previous one's first pass and verified when that one finishes.

``draft`` (token schedule only) drafts γ tokens with the first P passes and verifies them with the rest in one
forward. ``compile`` runs the steps on a static cache under ``torch.compile``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..modeling.run_settings import SettingsError, bool_field
from .speculative import SpeculativeConfig

SCHEDULES = ("token", "depth", "pipelined")


@dataclass(frozen=True)
class DecodingConfig:
    """``schedule``: ``"token"``, ``"depth"`` or ``"pipelined"`` (module docstring). ``draft``: a
    :class:`~.speculative.SpeculativeConfig` (draft passes P, draft tokens γ, adaptive or not) or None.
    ``compile``: the steps under ``torch.compile`` on a static cache (the first call of a batch size or cache
    capacity pays the compilation). Which combinations a model takes: :func:`~.support.refusal`."""

    schedule: str = "token"
    draft: SpeculativeConfig | None = None
    compile: bool = False

    def __post_init__(self):
        problems = []
        if self.schedule not in SCHEDULES:
            problems.append(f"schedule must be one of {', '.join(map(repr, SCHEDULES))}, got {self.schedule!r}")
        if self.draft is not None and not isinstance(self.draft, SpeculativeConfig):
            problems.append(f"draft must be a SpeculativeConfig or None, got {type(self.draft).__name__}")
        bool_field(problems, "compile", self.compile)
        if problems:
            raise SettingsError("DecodingConfig", problems)

    def spelled(self) -> str:
        """The config as a user writes it, defaults left out."""
        parts = [f"schedule={self.schedule!r}"] if self.schedule != "token" else []
        if self.draft is not None:
            parts.append("draft=SpeculativeConfig(...)")
        if self.compile:
            parts.append("compile=True")
        return f"DecodingConfig({', '.join(parts)})"


__all__ = ["DecodingConfig", "SCHEDULES"]
