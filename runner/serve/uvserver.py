"""uvicorn's Server with runner's signals, for `runner serve` and the front of `serve --rpc`.

uvicorn's own handling re-raises the signal once it has stopped (exit 130 or 143, not 0); here the first
SIGINT or SIGTERM calls `on_stop` (the answers in flight end now) and stops accepting, and a second
Ctrl-C exits at once (uvicorn's force_exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterator
from typing import Any


def make_server(
    config: Any,
    on_stop: Callable[[Any], None],
    beside: Callable[[Any], Awaitable[None]] | None = None,
) -> Any:
    """A uvicorn.Server for `config`. on_stop(server) runs at each stopping signal, before uvicorn
    hears of it; beside(server), if given, runs on the server's event loop while it serves."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {s: signal.signal(s, self._stop) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

        def _stop(self, signum: int, frame: Any) -> None:
            on_stop(self)
            self.handle_exit(signum, frame)

        async def main_loop(self) -> None:
            task = asyncio.ensure_future(beside(self)) if beside is not None else None
            try:
                await super().main_loop()
            finally:
                if task is not None:
                    task.cancel()

    return Server(config)
