"""Models by name: a local checkpoint folder, or a Hugging Face hub id with a revision, resolved through the
Hugging Face cache.

``resolve_pretrained("EleutherAI/pythia-2.8b-deduped", "step143000")`` returns the local snapshot folder of
that revision (downloading it when online; with ``HF_HUB_OFFLINE=1`` / ``TRANSFORMERS_OFFLINE=1`` only the cache
is read, and a revision not in it is a :class:`HubError` naming the id, the revision and the variable).
``resolve_pretrained("/path/to/ckpt")`` checks the folder holds ``config.json`` and returns it.

Pythia's intermediate checkpoints are git branches of each model repository (``step0`` … ``step143000``;
``main`` is ``step143000``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# What a model load needs (weights, config, tokenizer, remote code), not the whole repository.
MODEL_FILES = ["*.json", "*.safetensors", "*.bin", "*.model", "*.txt", "*.py", "*.tiktoken"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TRUE = ("1", "true", "yes", "on")


class HubError(ValueError):
    """A model name that cannot be resolved to a local folder (missing, not cached offline, not found)."""


def offline() -> bool:
    """Whether hub downloads are off (``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``), read now, not at import."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def is_hub_id(name: str | os.PathLike[str]) -> bool:
    """``org/name`` that is not an existing local path (local folders win)."""
    s = os.fspath(name)
    return bool(_REPO_ID.match(s)) and not Path(s).expanduser().exists()


def describe(name: str, revision: str | None) -> str:
    return f"{name}" + (f" (revision {revision})" if revision else "")


def resolve_pretrained(name_or_path: str | os.PathLike[str], revision: str | None = None, *,
                       allow_patterns: list[str] | None = None) -> Path:
    """The local folder of a checkpoint given as a folder or as a hub id (+ ``revision``); see the module doc."""
    s = os.fspath(name_or_path)
    local = Path(s).expanduser()
    if not is_hub_id(s):
        if revision:
            raise HubError(f"{s}: a revision ({revision}) applies to a Hugging Face hub id (org/name), not to a local "
                           "folder")
        if not local.is_dir():
            raise HubError(f"{s}: no such checkpoint folder, and not a Hugging Face hub id (org/name)")
        if not (local / "config.json").is_file():
            raise HubError(f"{s}: not a Hugging Face checkpoint folder (no config.json)")
        return local
    # huggingface_hub only for a hub id: every command imports this module (through adaponder.errors), and a local
    # folder or --help must not pay for it
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    off = offline()
    try:
        path = snapshot_download(s, revision=revision, local_files_only=off,
                                 allow_patterns=allow_patterns or MODEL_FILES)
    except LocalEntryNotFoundError as err:
        if off:
            raise HubError(
                f"{describe(s, revision)} is not in the Hugging Face cache and HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE "
                f"is set, so it cannot be downloaded; fetch it once online (huggingface-cli download {s}"
                + (f" --revision {revision}" if revision else "") + "), point HF_HUB_CACHE at a cache that holds it, "
                "or give a local checkpoint folder") from err
        raise HubError(f"{describe(s, revision)}: cannot download from the Hugging Face hub ({err})") from err
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise HubError(f"{describe(s, revision)}: cannot resolve on the Hugging Face hub "
                       f"({type(err).__name__}: {err})") from err
    path = Path(path)
    if not (path / "config.json").is_file():
        raise HubError(f"{describe(s, revision)}: the snapshot {path} has no config.json (not a model repository?)")
    return path


def checkpoint_source(name_or_path: str | os.PathLike[str], revision: str | None = None) -> str | os.PathLike[str]:
    """What a model loader reads: a hub id (+ ``revision``) resolved to its local snapshot folder through
    :func:`resolve_pretrained` (so every loader reports an uncached id offline the same way); any other path is
    returned unchanged for the loader's own folder checks. A ``revision`` with a local path is a :class:`HubError`."""
    if is_hub_id(name_or_path) or revision:
        return resolve_pretrained(name_or_path, revision)
    return name_or_path


__all__ = ["HubError", "resolve_pretrained", "checkpoint_source", "is_hub_id", "offline", "MODEL_FILES"]
