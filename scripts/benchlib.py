"""What the server benchmarks share (scripts/bench_serve.py, bench_embed.py, bench_ondemand.py,
bench_rpc.py): progress on stderr, a free loopback port, the machine in words, a model's file, a
target's line. Each runs as `python scripts/bench_X.py`, with this folder first on sys.path."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


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


def model_file(model: str) -> Path:
    """The GGUF file runner serves for MODEL, as `runner show` finds it (offline: nothing fetched)."""
    out = subprocess.run(
        [sys.executable, "-m", "runner", "show", model, "--offline", "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(json.loads(out.stdout)["file"])
