"""What the server benchmarks share (scripts/bench_serve.py, bench_embed.py, bench_ondemand.py,
bench_rpc.py): progress on stderr, a free loopback port, the machine in words, a model's file, a
server started, waited on and stopped, a target's line. Each runs as `python scripts/bench_X.py`,
with this folder first on sys.path."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def target(label: str, value: float | None, limit: float, at_least: bool) -> str:
    """`label: 1.02 (>= 0.95) PASS`: a figure against its target, `n/a` without one."""
    if value is None:
        return f"{label}: n/a"
    ok = value >= limit if at_least else value <= limit
    return f"{label}: {value:.2f} ({'>=' if at_least else '<='} {limit}) {'PASS' if ok else 'FAIL'}"


def machine() -> str:
    """The CPU's model and how many CPUs this process may use, for the figures' heading."""
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return f"{cpu}, {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable)"


def amx() -> bool:
    """Whether this CPU has AMX (Sapphire Rapids and later): the pinned llama.cpp's AMX matmul
    segfaults there on the first batch of more than one token unless its weights are not repacked, so
    llama.cpp's own programs run with --no-repack (as runner loads: runner.engine.llamacpp.cpu_repacks)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return any(line.startswith("flags") and " amx_int8" in line for line in f)
    except OSError:
        return False


def peer_flags() -> list[str]:
    """The flags llama-server (and llama-bench) need on this machine beside the benchmark's own."""
    return ["--no-repack"] if amx() else []


def model_file(model: str) -> Path:
    """The GGUF file runner serves for MODEL, as `runner show` finds it (offline: nothing fetched)."""
    out = subprocess.run(
        [sys.executable, "-m", "runner", "show", model, "--offline", "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(json.loads(out.stdout)["file"])


def start(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    """A server in a session of its own (stopped as a group), its output in `log`."""
    with log.open("wb") as out:  # the child holds its own copy of the descriptor
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


async def wait_ready(client: httpx.AsyncClient, process: subprocess.Popen[bytes], timeout: float) -> float:
    """Seconds until GET /health answers 200; RuntimeError if the server exits or takes too long."""
    began = time.perf_counter()
    while time.perf_counter() - began < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before it was ready")
        with contextlib.suppress(httpx.TransportError):  # not listening yet
            if (await client.get("/health", timeout=2.0)).status_code == 200:
                return time.perf_counter() - began
        await asyncio.sleep(0.1)
    raise RuntimeError(f"server not ready after {timeout:.0f} s")


def interleaved(
    kinds: list[str], rounds: int, prefix: str, measure: Callable[[str, Path], Awaitable[dict[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    """Each kind measured once a round, the kinds in turn (machine noise hits all alike), each with
    a log file of its own in a temporary folder, named when one fails."""
    logs = Path(tempfile.mkdtemp(prefix=prefix))
    progress(f"server logs in {logs}")
    done: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for i in range(rounds):
        for kind in kinds:
            progress(f"round {i + 1}/{rounds}: {kind}")
            log = logs / f"{kind.replace(' ', '')}-{i + 1}.log"
            try:
                done[kind].append(asyncio.run(measure(kind, log)))
            except BaseException:
                progress(f"{kind} failed; its log: {log}")
                raise
    return done
