"""Models on demand, measured: the time from a request for a model `runner serve` has not loaded to its
first token, against a `runner run` of the same prompt (process start to its first byte of answer).

    python scripts/bench_ondemand.py [--model smollm2] [--rounds 5]

The server serves the model from a --models folder (a link to its file) with --keep-alive 0, so each
request finds it unloaded; each round asks once (streamed) and runs `runner run` once, back to back.
Progress on stderr, the table on stdout. Machine: see the first line."""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from benchlib import free_port, model_file

PROMPT = "Write one sentence about the sea."


def first_token_served(url: str) -> float:
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
        "stream": True,
    }
    start = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                return time.perf_counter() - start
    raise RuntimeError("no token came")


def first_token_run(model: str) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "run", model, PROMPT, "--max-tokens", "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    proc.stdout.read(1)
    took = time.perf_counter() - start
    proc.wait(timeout=120)
    return took


def loaded(url: str) -> list[str]:
    return [m["name"] for m in httpx.get(f"{url}/api/ps").json()["models"]]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} CPUs", file=sys.stderr)
    folder = Path(tempfile.mkdtemp(prefix="bench_ondemand-"))
    (folder / "bench.gguf").symlink_to(model_file(args.model))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = folder / "serve.log"
    with log.open("wb") as err:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runner",
                "serve",
                "--models",
                str(folder),
                "--keep-alive",
                "0",
                "--port",
                str(port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    served, ran = [], []
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        for i in range(args.rounds):
            while loaded(url):  # keep-alive 0: unloaded after each answer (the reaper looks every 0.25 s)
                time.sleep(0.05)
            served.append(first_token_served(url))
            ran.append(first_token_run(args.model))
            print(
                f"round {i + 1}: served (load + first token) {served[-1]:.3f} s, runner run {ran[-1]:.3f} s",
                file=sys.stderr,
            )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    s, r = statistics.median(served), statistics.median(ran)
    print("| figure | seconds |\n|---|---|")
    print(f"| first token, model not loaded (runner serve) | {s:.3f} |")
    print(f"| first byte of answer, `runner run` | {r:.3f} |")
    print(f"| ratio | {s / r:.2f} |")


if __name__ == "__main__":
    main()
