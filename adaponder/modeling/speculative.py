"""Moved to :mod:`adaponder.generation.speculative` (decoding is not shipped with checkpoints); this name still imports."""

from adaponder.generation.speculative import *  # noqa: F401,F403
from adaponder.generation.speculative import __all__  # noqa: F401
