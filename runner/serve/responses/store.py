"""The responses /v1/responses keeps, reached from the event loop.

They live in runner's conversation store (runner.store, its `responses` table: SQLite, WAL, one
transaction per write). Every call runs on one thread of this module's own, which opens the database
and alone uses it: a write never blocks the event loop, and it happens off the main thread, where
runner.interrupt leaves the server's own signal handlers alone.
"""

from __future__ import annotations

from pathlib import Path

from runner import ui
from runner.serve.shared.storethread import StoreThread
from runner.store import StoredResponse, StoreError, saving_disabled


class ResponseStore(StoreThread):
    """The responses table of one open store; close() when the server is done."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__(path, "responses")

    async def save(self, stored: StoredResponse) -> None:
        await self.call(lambda s: s.save_response(stored))

    async def load(self, response_id: str) -> StoredResponse | None:
        return await self.call(lambda s: s.load_response(response_id))

    async def remove(self, response_id: str) -> bool:
        return await self.call(lambda s: s.remove_response(response_id))


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
