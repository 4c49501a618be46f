"""`runner cache`: the prompt cache on disk (runner.engine.promptcache), shown or cleared."""

from __future__ import annotations

import json
from typing import TextIO

from runner import ui
from runner.engine import promptcache


def show_cache(*, clear: bool, as_json: bool, out: TextIO) -> None:
    path = promptcache.folder()
    entries, size = promptcache.clear(path) if clear else promptcache.usage(path)
    if as_json:
        key = "removed" if clear else "entries"
        out.write(json.dumps({"path": str(path), key: entries, "bytes": size}) + "\n")
        return
    noun = "entry" if entries == 1 else "entries"
    if clear:
        out.write(f"removed {entries} prompt cache {noun} ({ui.human_bytes(size)})\n")
        return
    out.write(
        f"{path}\n{entries} {noun}, {ui.human_bytes(size)} "
        f"(limit {ui.human_bytes(promptcache.DEFAULT_LIMIT)} unless --prompt-cache-size says otherwise)\n"
    )
