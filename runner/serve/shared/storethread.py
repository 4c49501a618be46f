"""runner's conversation store reached from the event loop: every call on one thread of its own,
which opens the database and alone uses it, so a write never blocks the event loop and happens off
the main thread (where runner.interrupt leaves the server's own signal handlers alone)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from runner.store import Store

T = TypeVar("T")


class StoreThread:
    """One open store on its thread; close() when the server is done."""

    def __init__(self, path: Path | None, name: str) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        try:
            self._store = self._thread.submit(Store.open, path).result()
        except BaseException:
            self._thread.shutdown()
            raise
        self.path = self._store.path

    async def call(self, work: Callable[[Store], T]) -> T:
        """work(store) on the store's thread."""
        return await asyncio.wrap_future(self._thread.submit(work, self._store))

    def close(self) -> None:
        self._thread.submit(self._store.close).result()
        self._thread.shutdown()
