"""The responses /v1/responses keeps, reached from the event loop.

They live in runner's conversation store (runner.store, its `responses` table: SQLite, WAL, one
transaction per write). Every call runs on one thread of this module's own, which opens the database
and alone uses it: a write never blocks the event loop, and it happens off the main thread, where
runner.interrupt leaves the server's own signal handlers alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from runner import ui
from runner.store import Store, StoredResponse, StoreError, saving_disabled

T = TypeVar("T")


class ResponseStore:
    """The responses table of one open store; close() when the server is done."""

    def __init__(self, path: Path | None = None) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="responses")
        try:
            self._store = self._thread.submit(Store.open, path).result()
        except BaseException:
            self._thread.shutdown()
            raise
        self.path = self._store.path

    async def _call(self, work: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self._thread.submit(work))

    async def save(self, stored: StoredResponse) -> None:
        await self._call(lambda: self._store.save_response(stored))

    async def load(self, response_id: str) -> StoredResponse | None:
        return await self._call(lambda: self._store.load_response(response_id))

    async def remove(self, response_id: str) -> bool:
        return await self._call(lambda: self._store.remove_response(response_id))

    def close(self) -> None:
        self._thread.submit(self._store.close).result()
        self._thread.shutdown()


def open_responses() -> ResponseStore | None:
    """The store `runner serve` keeps responses in; None (said once) when saving is off (RUNNER_NO_SAVE)
    or the database cannot be opened: the server then answers and keeps nothing."""
    if saving_disabled():
        ui.info("responses are not stored (RUNNER_NO_SAVE)")
        return None
    try:
        return ResponseStore()
    except StoreError as exc:
        ui.warn(f"responses are not stored: {exc}")
        return None
