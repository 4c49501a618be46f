"""`runner cache`: the prompt cache on disk (runner.engine.promptcache), shown or cleared."""

from __future__ import annotations

import json
from typing import TextIO

from runner.engine import promptcache


def show_cache(*, clear: bool, as_json: bool, out: TextIO) -> None:
    path = promptcache.folder()
    entries, size = promptcache.clear(path) if clear else promptcache.usage(path)
    if as_json:
        key = "removed" if clear else "entries"
        out.write(json.dumps({"path": str(path), key: entries, "bytes": size}) + "\n")
        return
    if clear:
        out.write(
            f"removed {entries} prompt cache entr{'y' if entries == 1 else 'ies'} ({size / 1e6:,.1f} MB)\n"
        )
        return
    out.write(
        f"{path}\n{entries} entr{'y' if entries == 1 else 'ies'}, {size / 1e6:,.1f} MB "
        f"(limit {promptcache.DEFAULT_LIMIT >> 30} GiB unless --prompt-cache-size says otherwise)\n"
    )
