"""llama.cpp's RPC backend (ggml-rpc), reached through ctypes: other machines' devices joining a model.

llama-cpp-python binds none of it and builds no `rpc-server`, but a build with -DGGML_RPC=ON ships
libggml-rpc beside libllama and registers the backend as "RPC": its functions come through
ggml_backend_reg_get_proc_address, as llama.cpp's own tools reach them (common/arg.cpp). Two uses:

- the client (`--rpc`): each worker's devices added and registered, then given to a load as its
  offload devices (runner.engine.llamacpp.model_params), in the plan's split;
- the worker (`runner worker`): ggml_backend_rpc_start_server with this machine's device.

ggml's RPC client aborts the process (GGML_ABORT) when a worker goes away. on_abort() turns that abort
into a report the parent of an `--rpc` process reads (runner.supervise), instead of a core dump; an
answer under way first keeps what came of it (`if_lost`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

from runner.engine.llamacpp import DEVICE_CPU, DEVICE_GPU, device_name, ggml_libs, has_backend
from runner.errors import EngineError, UsageError
from runner.install import rebuild

CHILD_ENV = "RUNNER_RPC_CHILD"  # set in a process its parent runs for --rpc (runner.supervise)
REPORT_ENV = "RUNNER_RPC_REPORT_FD"  # where such a process reports ggml's abort (default: stderr)
ABORT_EXIT = 86  # an --rpc child's status after ggml aborted: its parent names the worker that went away
REBUILD = rebuild()  # the command that gives a build with the RPC backend


def available() -> bool:
    """Whether the installed llama.cpp was built with its RPC backend."""
    return has_backend("RPC")


def require(what: str) -> None:
    """UsageError (exit 2) naming the rebuild, on a build without the RPC backend."""
    if not available():
        raise UsageError(
            f"{what} needs llama.cpp built with its RPC backend, which this one lacks; rebuild: {REBUILD}"
        )


def _proc(name: str, restype: Any, argtypes: list[Any]) -> Any:
    ggml, _ = ggml_libs()
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    address = ggml.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None
    if not address:
        raise UsageError(f"this llama.cpp build has no {name}; rebuild: {REBUILD}")
    return ctypes.CFUNCTYPE(restype, *argtypes)(address)


@functools.cache
def add_worker(endpoint: str) -> tuple[int, ...]:
    """The worker's devices, registered with ggml (ggml_backend_rpc_add_server connects to it, and
    aborts if it cannot: the caller has checked it with runner.remote.probe first)."""
    ggml, _ = ggml_libs()
    add = _proc("ggml_backend_rpc_add_server", ctypes.c_void_p, [ctypes.c_char_p])
    reg = add(endpoint.encode())
    if not reg:
        raise EngineError(f"worker {endpoint} offers no device")
    ggml.ggml_backend_register(reg)
    return tuple(ggml.ggml_backend_reg_dev_get(reg, i) for i in range(ggml.ggml_backend_reg_dev_count(reg)))


def local_device() -> tuple[int, str, int, int]:
    """(device, description, free bytes, total bytes): what a worker offers, a GPU when the build has
    one, else the CPU."""
    ggml, _ = ggml_libs()
    device = ggml.ggml_backend_dev_by_type(DEVICE_GPU) or ggml.ggml_backend_dev_by_type(DEVICE_CPU)
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    ggml.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
    name = device_name(device)
    description = (ggml.ggml_backend_dev_description(device) or b"").decode(errors="replace").strip()
    return device, f"{name} ({description})" if description else name, free.value, total.value


def start_server(endpoint: str, cache_dir: str | None, threads: int, device: int) -> None:
    """ggml_backend_rpc_start_server: serves one client at a time until the process ends; returns only
    if it could not start (it prints why on stdout)."""
    start = _proc(
        "ggml_backend_rpc_start_server",
        None,
        [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p],
    )
    devices = (ctypes.c_void_p * 1)(device)
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, threads, 1, devices)


_ABORT_HOOK: Any = None  # the ctypes callback, kept alive for the process
_LAST_WORDS: list[Callable[[str], None]] = []  # if_lost's, innermost last


@contextlib.contextmanager
def if_lost(last_words: Callable[[str], None]) -> Iterator[None]:
    """While the block runs, a worker that goes away (ggml's abort, with on_abort's hook set) first
    calls last_words(why), then the process ends: how an answer keeps what came of it (printed,
    stored) as after a Ctrl-C. It runs on the thread that aborted, ggml-rpc's dispatcher thread (the
    pinned ggml-rpc.cpp sends every command from there, `rpc_dispatcher::work`), while the main thread
    waits in llama.cpp for a reply that never comes: so it must not wait for the main thread, and it
    uses connections of its own (a database's is bound to the thread that opened it)."""
    _LAST_WORDS.append(last_words)
    try:
        yield
    finally:
        _LAST_WORDS.remove(last_words)


def lost_reason(message: str) -> str:
    """ggml's abort message as a reason: 'a worker's connection broke (Remote RPC server crashed …)'."""
    detail = message.strip().rsplit(": ", 1)[-1] if message.strip() else "ggml's RPC client stopped"
    return f"a worker's connection broke ({detail})"


def on_abort(report: Callable[[str], None]) -> None:
    """Instead of ggml's abort (a message, a backtrace, SIGABRT and maybe a core dump): the last words
    of the blocks `if_lost` runs in (innermost first), report(message), then the process ends at once
    with exit status ABORT_EXIT. report runs on whichever thread aborted (ggml-rpc's dispatcher thread)
    and must not raise."""
    global _ABORT_HOOK
    _, base = ggml_libs()

    def hook(message: bytes) -> None:
        text = message.decode(errors="replace") if message else ""
        try:
            for last_words in reversed(list(_LAST_WORDS)):
                with contextlib.suppress(Exception):  # whatever fails, the next words, the report, the exit
                    last_words(lost_reason(text))
            report(text)
        finally:
            os._exit(ABORT_EXIT)

    _ABORT_HOOK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)(hook)
    base.ggml_set_abort_callback(ctypes.cast(_ABORT_HOOK, ctypes.c_void_p))


def report_aborts() -> None:
    """ggml's abort reported as one line on $RUNNER_RPC_REPORT_FD (the parent's pipe) or stderr, then
    exit ABORT_EXIT: how a process that loads across workers ends when one goes away."""
    fd = int(os.environ.get(REPORT_ENV) or 2)

    def report(message: str) -> None:
        with contextlib.suppress(OSError):
            os.write(fd, (message.strip() + "\n").encode(errors="replace"))

    on_abort(report)
