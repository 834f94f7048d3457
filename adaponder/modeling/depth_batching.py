"""Moved to :mod:`adaponder.generation.depth_batching` (decoding is not shipped with checkpoints); this name still imports."""

from adaponder.generation.depth_batching import *  # noqa: F401,F403
from adaponder.generation.depth_batching import __all__  # noqa: F401
