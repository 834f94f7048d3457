"""Moved to :mod:`adaponder.generation.pass_pipeline` (decoding is not shipped with checkpoints); this name still imports."""

from adaponder.generation.pass_pipeline import *  # noqa: F401,F403
from adaponder.generation.pass_pipeline import __all__  # noqa: F401
