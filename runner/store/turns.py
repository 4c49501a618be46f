"""A stored conversation held by one process at a time: a turn (runner.commands.session) holds it
from the question to the answer, so runners continuing one conversation at once take turns."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from runner import interrupt, ui
from runner.store.conversations import Store, StoreError


@contextmanager
def holding(store: Store, conversation: int) -> Iterator[None]:
    """The stored conversation to this process alone while the block runs: a runner continuing it
    meanwhile waits here (one line on stderr; Ctrl-C, SIGTERM or SIGHUP stop the wait). A lock on a file
    beside the database (filelock: flock), which the kernel drops when the process ends, however it
    ends (kill -9, a worker's abort), so a turn that died never keeps the conversation from the next."""
    from filelock import FileLock, Timeout

    folder = store.path.with_name(store.path.name + "-turns")
    lock, told = FileLock(str(folder / f"{conversation}.lock")), False
    while not lock.is_locked:
        try:
            folder.mkdir(exist_ok=True)
            lock.acquire(timeout=0.1 if told else 0)
        except Timeout:
            if interrupt.requested():  # inside deferred(): the flag, which the block's end raises
                raise KeyboardInterrupt from None
            if not told:
                ui.info(f"conversation {conversation} is answering in another runner; this turn waits for it")
            told = True
        except OSError as exc:
            raise StoreError(f"{folder}: cannot hold conversation {conversation}: {exc}") from exc
    try:
        yield
    finally:
        lock.release()
