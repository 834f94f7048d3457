"""Moved to :mod:`adaponder.generation.way_choice` (decoding is not shipped with checkpoints); this name still imports."""

from adaponder.generation.way_choice import *  # noqa: F401,F403
from adaponder.generation.way_choice import __all__  # noqa: F401
