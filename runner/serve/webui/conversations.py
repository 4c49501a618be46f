"""The conversation store as the page reaches it from the event loop: every call on one thread of its
own, which opens the database and alone uses it (as runner.serve.responses.store does), so a write
never blocks the event loop; each write is the store's own transaction inside runner.interrupt.deferred().

A turn holds its conversation with the terminal's lock (runner.store.turns.holding) from the question
to the answer: a `runner chat` continuing it meanwhile waits, and so does a second tab.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, TypeVar

from runner import ui
from runner.serve.shared.storethread import StoreThread
from runner.store import Store, StoredConversation, StoredMessage, StoreError, Summary, saving_disabled
from runner.store.turns import holding

T = TypeVar("T")


class Conversations(StoreThread):
    """One open store, reached from the event loop; close() when the server is done."""

    def __init__(self, path: Path | None = None) -> None:
        super().__init__(path, "conversations")

    async def summaries(self) -> list[Summary]:
        return await self.call(lambda s: s.summaries())

    async def load(self, conversation: int) -> StoredConversation | None:
        return await self.call(lambda s: s.load(conversation))

    async def add(self, conversation: int, message: StoredMessage) -> int:
        return await self.call(lambda s: s.add_message(conversation, message))

    async def hold(self, conversation: int) -> Held:
        """The conversation held for a turn (waiting while another runner's or tab's turn holds it)."""
        held = Held(self._store, conversation)
        try:
            await held.taken
        except BaseException:
            held.release()  # the client left while it waited: given back as soon as it is taken
            raise
        return held


class Held:
    """runner.store.turns.holding on a thread of its own: the lock is a file lock, taken and given back
    by the same thread (filelock's are thread-local), while the event loop goes on."""

    def __init__(self, store: Store, conversation: int) -> None:
        loop = asyncio.get_running_loop()
        self.taken: asyncio.Future[None] = loop.create_future()
        self._done = threading.Event()

        def take() -> None:
            try:
                with holding(store, conversation):
                    loop.call_soon_threadsafe(_settle, self.taken, None)
                    self._done.wait()
            except BaseException as exc:  # StoreError: the lock's folder cannot be written
                loop.call_soon_threadsafe(_settle, self.taken, exc)

        threading.Thread(target=take, name=f"turn-{conversation}", daemon=True).start()

    def release(self) -> None:
        self._done.set()


def _settle(future: asyncio.Future[None], exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is None:
        future.set_result(None)
    else:
        future.set_exception(exc if isinstance(exc, Exception) else StoreError(str(exc)))


def open_conversations() -> Conversations | None:
    """The store the page keeps chats in; None (said once) when saving is off (RUNNER_NO_SAVE) or the
    database cannot be opened: the page then says so, and the APIs answer as before."""
    if saving_disabled():
        ui.info("the chat page keeps nothing (RUNNER_NO_SAVE): it is off")
        return None
    try:
        return Conversations()
    except StoreError as exc:
        ui.warn(f"the chat page is off: {exc}")
        return None


def as_json(message: StoredMessage) -> dict[str, Any]:
    """A message as the page reads it: the store's JSON form with its id, time and stats."""
    data = message.to_json()
    data["id"] = message.id
    data["created"] = message.created
    if message.stats:
        data["stats"] = message.stats
    if message.images:  # the page shows each by its digest (GET /runner/v1/images/SHA), never its path
        data["images"] = [{"sha256": i.sha256, "size": i.size} for i in message.images]
    return data
