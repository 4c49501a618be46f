"""A real `runner serve` for a test: started on a free loopback port, ready when /health says so,
stopped by SIGTERM (which must end it with exit 0 and no traceback)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def serving(args: list[str], log: Path, *, ready_s: float = 120) -> Iterator[Server]:
    """`runner serve ARGS --port FREE`, up and answering /health, for the with block."""
    port = free_port()
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runner", "serve", *args, "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    server = Server(proc, port, log)
    try:
        end = time.monotonic() + ready_s
        while time.monotonic() < end and proc.poll() is None:
            try:
                if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert proc.poll() is None, server.stderr()
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, server.stderr()
    assert "Traceback" not in server.stderr(), server.stderr()
