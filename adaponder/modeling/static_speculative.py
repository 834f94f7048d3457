"""Moved to :mod:`adaponder.generation.static_speculative` (decoding is not shipped with checkpoints); this name still imports."""

from adaponder.generation.static_speculative import *  # noqa: F401,F403
from adaponder.generation.static_speculative import __all__  # noqa: F401
