"""Ctrl-C by design: inside `deferred()`, SIGINT sets a flag that runner checks at safe points.

Python's default SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be. Inside
a ctypes callback (llama.cpp's log callback fires hundreds of times while a model loads) ctypes prints
"Exception ignored" and swallows it, so a Ctrl-C during the load was lost and generation ran on until
the context filled; in a `finally`, or in the middle of a database write, it leaves work half done.

So wherever llama.cpp runs (load, prefill, decode, teardown) and wherever the conversation store
writes, SIGINT only sets a flag:
  - the token loop checks it between tokens (an answer stops within one token),
  - llama.cpp checks it through its abort callback during a prefill (llama_set_abort_callback) and
    through the progress callback while a model loads,
  - and when the outermost deferred block ends with the flag still set (nobody reported the
    interrupt), KeyboardInterrupt is raised there, at a safe point, for the CLI to turn into exit 130.
Outside these blocks (downloads, start-up) Python's own handler stays: a download stopped by
KeyboardInterrupt keeps its partial file, which is what resuming relies on.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_flag = threading.Event()
_depth = 0
_previous: Any = None


def requested() -> bool:
    """Whether Ctrl-C was pressed since the flag was last cleared."""
    return _flag.is_set()


def clear() -> None:
    """The interrupt was handled (an answer stopped, a chat went back to its prompt)."""
    _flag.clear()


def request() -> None:
    """What SIGINT does inside a deferred block; also how tests interrupt without a signal."""
    _flag.set()


def _handler(_signum: int, _frame: Any) -> None:
    _flag.set()


@contextmanager
def deferred() -> Iterator[None]:
    """SIGINT sets the flag instead of raising, until the outermost block ends; then, if the flag is
    still set, KeyboardInterrupt. Off the main thread (where signals cannot be handled) it only nests."""
    global _depth, _previous
    main = threading.current_thread() is threading.main_thread()
    if _depth == 0 and main:
        _previous = signal.signal(signal.SIGINT, _handler)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and main:
            signal.signal(signal.SIGINT, _previous if _previous is not None else signal.default_int_handler)
            _previous = None
            if _flag.is_set():
                _flag.clear()
                raise KeyboardInterrupt
