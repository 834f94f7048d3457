"""Moved to :mod:`adaponder.generation.static_decoding` (decoding is not shipped with checkpoints); this name still imports."""

from adaponder.generation.static_decoding import *  # noqa: F401,F403
from adaponder.generation.static_decoding import __all__  # noqa: F401
