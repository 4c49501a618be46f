"""Ctrl-C by design: inside `deferred()`, SIGINT sets a flag that runner checks at safe points; SIGTERM
and SIGHUP do the same, and then end the process.

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

SIGTERM (`timeout`, `kill`, a service stopping) and SIGHUP (the terminal closed) take the same path:
the answer stops within one token and what came of it is kept, as after a Ctrl-C. But they end the
process where a Ctrl-C only ends an answer (a chat on a terminal returns to its prompt): the first
deferred block to end after one raises `Stopped`, which no `except KeyboardInterrupt` catches, and the
CLI exits 128 + the signal's number (143, 129). Outside the blocks, `install()` (the CLI's start)
makes them raise `Stopped` at once, as Python's handler raises KeyboardInterrupt (a download keeps its
partial file the same way). A second one is ignored: the process is already on its way out, and the
saving of what came is not cut short. From the signal on, a stdout or stderr that is gone (a hung-up
terminal, a pipe nobody reads) writes to /dev/null, so the last words neither fail nor print a
traceback. A signal the parent chose to ignore (nohup's SIGHUP) stays ignored.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))

_flag = threading.Event()
_depth = 0
_previous: dict[int, Any] = {}  # each signal's handler before the outermost deferred block
_stop: int | None = None  # SIGTERM or SIGHUP, once one came: the process is ending
_stop_raised = False  # Stopped was raised for it
_hook_before: Any = None  # sys.unraisablehook before install()
_lost: int | None = None  # the errno of an answer's output that went away (output_lost)


class Stopped(BaseException):
    """SIGTERM or SIGHUP came: the process ends, with 128 + `signum`, once what came is kept.

    Beside KeyboardInterrupt rather than below it, so that what resumes after a Ctrl-C (a chat's
    prompt) lets it through."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def wrapped(error: BaseException) -> bool:
    """Whether `error` is a Ctrl-C (or Stopped) that Python wrapped on its way up.

    Python 3.11 turns any exception from a class body's `__set_name__` into "RuntimeError: Error
    calling __set_name__", with the KeyboardInterrupt as its cause: a Ctrl-C that lands while a
    module defines a dataclass came out as a RuntimeError and a traceback instead of exit 130."""
    seen = 0
    cause = error.__cause__
    while cause is not None and seen < 8:
        if isinstance(cause, (KeyboardInterrupt, Stopped)):
            return True
        cause, seen = cause.__cause__, seen + 1
    return False


def requested() -> bool:
    """Whether Ctrl-C (or SIGTERM, SIGHUP) came since the flag was last cleared."""
    return _flag.is_set()


def clear() -> None:
    """The interrupt was handled (an answer stopped, a chat went back to its prompt)."""
    _flag.clear()


def request() -> None:
    """What SIGINT does inside a deferred block; also how tests interrupt without a signal."""
    _flag.set()


def stopping() -> int | None:
    """The SIGTERM or SIGHUP that is ending the process, if one came."""
    return _stop


def output_lost(error: OSError) -> None:
    """An answer's reader went away mid-answer (a pipe closed: EPIPE; a terminal hung up: EIO, which a
    write can see before the SIGHUP that comes with it is handled): the answer stops at the next token,
    and what came is kept, as after a Ctrl-C; the exit code says what happened (exit_code)."""
    global _lost
    if _lost is None:
        _lost = error.errno
    _flag.set()


def exit_code() -> int:
    """The exit code of an interrupted run: 130 after Ctrl-C, 143 after SIGTERM, 129 after SIGHUP (or a
    terminal gone), 141 after a pipe nobody reads any more (as a shell reports `yes | head`)."""
    if _stop is None and _lost == errno.EPIPE:
        return 128 + signal.SIGPIPE
    if _stop is None and _lost == errno.EIO:
        return 128 + signal.SIGHUP
    return 128 + (_stop or signal.SIGINT)


def install() -> None:
    """At the CLI's start: SIGTERM and SIGHUP raise Stopped wherever no deferred block defers them,
    and a Ctrl-C Python could not raise where it landed is kept (_unraisable)."""
    global _hook_before
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _raise)
    if sys.unraisablehook is not _unraisable:
        _hook_before, sys.unraisablehook = sys.unraisablehook, _unraisable


def _unraisable(info: Any) -> None:
    """A KeyboardInterrupt raised where Python cannot raise (a callback: importlib's module-lock
    weakref during an import, seen in CI; a ctypes one): Python printed "Exception ignored ...
    Traceback ... KeyboardInterrupt" and dropped the Ctrl-C. It is kept instead, as inside a deferred
    block: the flag set, honoured at the next safe point (the token loop, a deferred block's end)."""
    if isinstance(info.exc_value, KeyboardInterrupt):
        _flag.set()
        return
    (_hook_before or sys.__unraisablehook__)(info)


def uninstall() -> None:
    """Their defaults back, for Python's finalization (a late one ends the process by the signal).
    SIGINT too: left at Python's own handler, a Ctrl-C during finalization raised KeyboardInterrupt
    in threading._shutdown, and Python printed "Exception ignored ... Traceback" (CI saw it once)."""
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is _raise:
            signal.signal(signum, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.unraisablehook is _unraisable:
        sys.unraisablehook = _hook_before or sys.__unraisablehook__


def _handler(signum: int, _frame: Any) -> None:
    if signum == signal.SIGINT or _noted(signum):
        _flag.set()


def _raise(signum: int, _frame: Any) -> None:
    global _stop_raised
    if _noted(signum):
        _stop_raised = True
        raise Stopped(signum)


def _noted(signum: int) -> bool:
    """Note a SIGTERM or SIGHUP; False for a second one, which changes nothing."""
    global _stop
    if _stop is not None:
        return False
    _stop = signum
    _silence_lost_outputs()
    return True


def _silence_lost_outputs() -> None:
    """Point stdout and stderr at /dev/null where their reader is gone (a hung-up terminal, a pipe
    with no reader: poll says POLLHUP or POLLERR), so that the writes still to come succeed."""
    if not hasattr(select, "poll"):
        return
    poll = select.poll()
    for fd in (1, 2):
        poll.register(fd, select.POLLOUT)
    lost = [fd for fd, events in poll.poll(0) if events & (select.POLLHUP | select.POLLERR)]
    if not lost:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in lost:
        os.dup2(devnull, fd)
    os.close(devnull)


@contextmanager
def deferred() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP set the flag instead of raising, until the outermost block ends;
    then, if the flag is still set or a SIGTERM or SIGHUP was not yet raised, KeyboardInterrupt or
    Stopped. Off the main thread (where signals cannot be handled) it only nests."""
    global _depth, _stop_raised
    main = threading.current_thread() is threading.main_thread()
    if _depth == 0 and main:
        for signum in (signal.SIGINT, *STOP_SIGNALS):
            previous = signal.getsignal(signum)
            if signum == signal.SIGINT or previous is not signal.SIG_IGN:
                _previous[signum] = signal.signal(signum, _handler)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and main:
            for signum, previous in _previous.items():
                default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
                signal.signal(signum, previous if previous is not None else default)
            _previous.clear()
            interrupted = _flag.is_set()
            _flag.clear()
            if _stop is not None and not _stop_raised:
                _stop_raised = True
                raise Stopped(_stop)
            if interrupted:
                raise KeyboardInterrupt


def waiting(call: Callable[[], T], on_interrupt: Callable[[], None]) -> T:
    """call() on a thread of its own while this one waits for it: for a C call that cannot be stopped
    part-way (an image's encode in libmtmd). Python runs a signal's handler only between the main
    thread's bytecodes, so a Ctrl-C during such a call would be seen only once it returned; waiting
    here, it is seen at once, and on_interrupt() (once) says why nothing stops yet. Off the main thread
    or outside a deferred block (where SIGINT would raise here, the call still running): call() itself."""
    if _depth == 0 or threading.current_thread() is not threading.main_thread():
        return call()
    done: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            done.append(call())
        except BaseException as exc:  # handed to the waiting thread
            failed.append(exc)

    worker = threading.Thread(target=run, name="runner-uninterruptible", daemon=True)
    worker.start()
    said = False
    while worker.is_alive():
        worker.join(0.05)  # returns as soon as the call does; meanwhile, signal handlers run
        if not said and _flag.is_set():
            said = True
            on_interrupt()
    if failed:
        raise failed[0]
    return done[0]
