"""runner worker: this machine's device offered to runner on other machines, as llama.cpp's RPC server.

It is ggml-rpc's own server (runner.engine.rpc.start_server), serving one client at a time. Its tensor
cache (on unless --no-cache) keeps the weights a client sent, by hash, so the next load of the same model
sends hashes instead of weights. ggml-rpc checks no key and encrypts nothing: a worker binds 127.0.0.1
unless told otherwise, and another address gets a warning with the SSH tunnel that avoids exposing it.

One line on stderr when it starts (endpoint, device, memory offered, cache), then one per allocation a
client makes (the worker's own account of what a load placed on it: `runner fit --rpc` is checked
against it), read from ggml-rpc's debug log.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import sys
import threading
from dataclasses import dataclass

from runner import ui
from runner.errors import EngineError, UsageError
from runner.limits import MAX_THREADS, check_range
from runner.paths import cache_dir

LOOPBACK = ("127.0.0.1", "::1", "localhost")
ALLOC_LINE = re.compile(r"\[alloc_buffer\] device: \d+, size: (\d+) -> remote_ptr: ([0-9a-f]+)")
FREE_LINE = re.compile(r"\[free_buffer\] remote_ptr: ([0-9a-f]+)")
NEW_CLIENT = "[hello] version"


@dataclass(frozen=True)
class WorkerRequest:
    host: str = "127.0.0.1"
    port: int = 50052
    threads: int | None = None
    cache: str | None = None  # a folder; None: runner's own (cache_dir()/rpc)
    no_cache: bool = False


def tensor_cache(request: WorkerRequest) -> str | None:
    if request.no_cache:
        return None
    folder = os.path.expanduser(request.cache) if request.cache else str(cache_dir() / "rpc")
    os.makedirs(folder, exist_ok=True)
    return folder


def _check_port(host: str, port: int) -> None:
    """A port in use is one line (ggml's server would print "Failed to create server socket")."""
    check_range(port, "--port", 1, 65535)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    except OSError as exc:
        raise UsageError(f"--host {host}: {exc.strerror or exc}") from None
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ggml's own socket does
        try:
            probe.bind(infos[0][4])
        except OSError as exc:
            why = "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise UsageError(f"port {port} on {host}: {why}; pick another with --port") from None


class _Ledger:
    """What the current client holds on this worker, from ggml-rpc's debug log."""

    def __init__(self) -> None:
        self.buffers: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, _level: int, text: str) -> None:
        if NEW_CLIENT in text:
            with self.lock:
                self.buffers.clear()  # the last client's buffers went with its connection
            return
        found = ALLOC_LINE.search(text)
        if found:
            size, ptr = int(found.group(1)), found.group(2)
            with self.lock:
                self.buffers[ptr] = size
                held, count = sum(self.buffers.values()), len(self.buffers)
            ui.echo(
                f"runner worker: a client allocated {ui.human_bytes(size)} "
                f"(it holds {ui.human_bytes(held)} in {count} buffer{'s' * (count != 1)} here)"
            )
            return
        found = FREE_LINE.search(text)
        if found:
            with self.lock:
                self.buffers.pop(found.group(1), None)


def worker(request: WorkerRequest) -> None:
    """Serve until Ctrl-C or SIGTERM (exit 0)."""
    if request.threads is not None:
        check_range(request.threads, "--threads", 1, MAX_THREADS)
    host = request.host
    _check_port(host, request.port)
    os.environ.setdefault("GGML_RPC_DEBUG", "1")  # read once, as libggml-rpc loads: the ledger's lines
    from runner.engine import rpc
    from runner.engine.llamacpp import LLAMA_LOG, default_threads

    rpc.require("runner worker")
    device, description, free, total = rpc.local_device()
    cache = tensor_cache(request)
    threads = request.threads or default_threads()
    endpoint = f"[{host}]:{request.port}" if ":" in host else f"{host}:{request.port}"
    if host not in LOOPBACK:
        ui.warn(
            f"a worker checks no key and encrypts nothing: anyone who can reach {endpoint} can use this "
            f"machine's {description.split(' ')[0]} and read what runs on it. Safer: keep the default "
            f"127.0.0.1 and reach it from the other machine through SSH: ssh -N -L {request.port}:127.0.0.1:"
            f"{request.port} THIS_HOST, then --rpc 127.0.0.1:{request.port} there"
        )
    LLAMA_LOG.listeners.append(_Ledger())
    # ggml's server prints its own banner and a line per connection on stdout: runner's line replaces it
    devnull = os.open(os.devnull, os.O_WRONLY)
    sys.stdout.flush()
    os.dup2(devnull, 1)
    failed = threading.Event()

    def serve() -> None:
        rpc.start_server(endpoint, cache, threads, device)
        failed.set()  # it returns only when it could not start

    threading.Thread(target=serve, name="ggml-rpc-server", daemon=True).start()
    offered = f"{ui.human_bytes(free)} of {ui.human_bytes(total)}" if free != total else ui.human_bytes(total)
    # Ctrl-C and SIGTERM stop it from here on: set before the line that says so (a Ctrl-C just after
    # it, before a try block began, exited 130 where every other stop exits 0: CI saw it once)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    ui.echo(
        f"runner worker on {endpoint}: {description}, {offered} offered, {ui.count(threads, 'thread')}, "
        f"tensor cache {cache or 'off'}; Ctrl-C stops it"
    )
    while not stop.is_set() and not failed.is_set():
        stop.wait(0.2)
    if failed.is_set():
        raise EngineError(f"ggml-rpc could not serve on {endpoint}")
    sys.stderr.flush()
    os._exit(0)  # the server thread is in accept() in C: nothing to join
