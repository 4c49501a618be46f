"""A real `runner serve` for a test: started on a free loopback port, ready when /health says so,
stopped by SIGTERM (which must end it with exit 0 and no traceback)."""

from __future__ import annotations

import re
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


ACCESS = re.compile(
    r"runner: (?P<method>[A-Z]+) (?P<path>\S+) (?P<status>\d+|-)"
    r"(?: prompt=(?P<prompt>\d+) completion=(?P<completion>\d+) ttft=(?P<ttft>[\d.]+)s)?"
    r" total=[\d.]+s(?: finish=(?P<finish>\w+))?"
)


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
        return self.log.read_text(encoding="utf-8", errors="replace")

    def mark(self) -> int:
        """Where the log is now: access_lines(since=mark) are the lines written after it."""
        return len(self.stderr())

    def access_lines(self, since: int = 0) -> list[re.Match[str]]:
        return [m for line in self.stderr()[since:].splitlines() if (m := ACCESS.match(line))]

    def wait_for_access(self, since: int, path: str, timeout: float = 15) -> re.Match[str]:
        """The first access line for `path` written after `since`, waiting up to `timeout` for it."""
        deadline = time.monotonic() + timeout
        while True:
            found = [m for m in self.access_lines(since) if m["path"] == path]
            if found:
                return found[0]
            assert time.monotonic() < deadline, f"no access line for {path} in {timeout} s:\n{self.stderr()}"
            time.sleep(0.1)


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
