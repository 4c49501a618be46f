"""`--rpc`: the command runs in a child process, so that a worker that goes away ends an answer, not runner.

ggml's RPC client aborts its process (GGML_ABORT, SIGABRT) when a worker's connection breaks: no error
comes back to catch. So a command given --rpc checks every worker first (runner.remote.probe, one line
within 3 s), then runs itself again as a child with the same arguments, its stdin, stdout and stderr
the same files: the answer streams as without --rpc, a chat keeps its terminal. The child turns ggml's
abort into a message on a pipe and an exit status of its own (runner.engine.rpc.on_abort: no
backtrace, no core dump). The parent then names the worker that is gone (the ones that no longer
answer a handshake), restores the terminal's settings if the child left them changed, and exits 1.

Ctrl-C reaches the child from the terminal as it would reach runner (the parent then lets it be, so
that it is not delivered twice); a SIGINT sent to the parent alone (no terminal, or one where the
parent is not in the foreground), SIGTERM and SIGHUP are passed on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import Any

from runner.errors import EngineError, WorkerError

GONE_PROBE_S = 1.0


def is_child() -> bool:
    from runner.engine.rpc import CHILD_ENV

    return bool(os.environ.get(CHILD_ENV))


def _no_core() -> None:  # in the child, before exec: an abort that gets past the hook dumps no core
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_child(rpc: str, command: str) -> int:
    """The parent's side: check the workers, run this command line again as the child, wait, and say
    what became of it. Returns the child's exit status; raises WorkerError when a worker went away."""
    from runner import remote
    from runner.engine.rpc import CHILD_ENV, REPORT_ENV, require

    endpoints = remote.parse_endpoints(rpc)
    require("--rpc")  # a build without the backend: said before any worker is asked
    remote.probe_all(endpoints)
    read_end, write_end = os.pipe()
    env = {**os.environ, CHILD_ENV: "1", REPORT_ENV: str(write_end), "GGML_NO_BACKTRACE": "1"}
    saved = _terminal_settings()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    child = subprocess.Popen(
        [sys.executable, "-m", "runner", *sys.argv[1:]],
        env=env,
        pass_fds=(write_end,),
        preexec_fn=_no_core,  # noqa: PLW1509 - no threads run in the parent yet
    )
    os.close(write_end)
    try:
        signal.signal(
            signal.SIGINT, lambda _s, _f: None if _foreground() else child.send_signal(signal.SIGINT)
        )
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    with os.fdopen(read_end, "rb") as pipe:
        report = pipe.read().decode(errors="replace").strip()
    if status == 0:
        return 0
    _restore_terminal(saved)
    from runner.engine.rpc import ABORT_EXIT

    if status == ABORT_EXIT or report:
        gone = [e for e in endpoints if not remote.reachable(e, timeout=GONE_PROBE_S)]
        what = f"worker {', '.join(gone)} went away" if gone else "a worker's connection broke"
        detail = report.rsplit(": ", 1)[-1] if report else "ggml's RPC client stopped"
        kept = "; the conversation is kept: runner chat --resume" if command == "chat" else ""
        raise WorkerError(f"{what} during `runner {command}` ({detail}){kept}")
    if status < 0:
        name = signal.Signals(-status).name
        if -status in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            return 128 - status
        raise EngineError(f"runner {command} over --rpc ended by {name}")
    return status


def _foreground() -> bool:
    """Whether this process's group is its terminal's foreground group: a Ctrl-C typed there reaches
    the child too (the same group), and passing it on would make it a second Ctrl-C."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
    return False


def _terminal_settings() -> Any:
    try:
        import termios

        return termios.tcgetattr(0) if os.isatty(0) else None
    except (ImportError, OSError):
        return None


def _restore_terminal(saved: Any) -> None:
    if saved is None:
        return
    import termios

    with contextlib.suppress(OSError):
        termios.tcsetattr(0, termios.TCSADRAIN, saved)
