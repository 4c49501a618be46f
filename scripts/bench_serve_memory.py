"""Does `runner serve` keep memory per request? Its RSS over 2,000 json_schema requests.

    python scripts/bench_serve_memory.py [--requests 2000] [--concurrency 4] [--control] [--json]

`runner serve MODEL --parallel P --threads 1 --cache-ram 0` (P = --parallel, default 4) is started on a
free port and waited on until GET /health is 200, then sent --requests non-streamed POST
/v1/chat/completions, each a distinct short question with response_format {"type": "json_schema",
"json_schema": {"name": "x", "schema": <an object of 3 properties>}} (compiled by llguidance once and
kept by its text; each request a copy of the matcher), greedy, --max-tokens 12, --concurrency of them
in flight at once (httpx.AsyncClient). The requests go in stretches: after the first 100, then at
every multiple of 250, and at the end, the stretch's requests have all been answered and the
server's resident memory (RSS, psutil) is read, so
each reading is taken with the server idle. The process read is the one serving: `runner serve` without
--rpc serves in the process started (checked: the script names any child it finds, and reads the one
with the most RSS). With --control the same count of plain requests (no response_format) follows, on a
server of its own, for the curve without the grammar. --cache-ram 0: serve keeps the KV state of a
prompt whose sequence a new request takes (docs/serve.md), ~1.5 MB for each of these distinct prompts,
up to its 1G default, so with it on, both kinds of request grew 1.6 MB each and a leak of kilobytes
would not show. The curve (requests answered: RSS in MB) for each, the growth per request after the
first 100, then the targets: RSS at the last request within 2 MB of RSS after the first 100, and with
--control, json_schema requests/s at least 0.8x plain. With --json,
stdout is one JSON object and the table goes to stderr with the progress. The server's own output goes
to a log file in a temporary folder, named when it fails. The model file is `runner show MODEL --offline
--json`'s, printed for the record."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import httpx
import psutil
from benchlib import free_port, machine, model_file, progress, start, stop, target, wait_ready

FIRST = 100  # the reading the others are compared with
EVERY = 250
LIMIT_MB = 2.0
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
}
NAMES = ["Ada", "Ben", "Chloe", "Dev", "Eva", "Finn", "Grace", "Hugo", "Iris", "Jon", "Kira", "Leo"]
CITIES = ["Lisbon", "Oslo", "Porto", "Quito", "Riga", "Seoul", "Turin", "Vienna", "Warsaw", "York"]


def question(i: int) -> str:
    """A distinct question for request i, so no two prompts are the same."""
    name, city = NAMES[i % len(NAMES)], CITIES[(i // len(NAMES)) % len(CITIES)]
    return f"Describe person {i}: {name}, {20 + i % 50} years old, who lives in {city}. Answer as JSON."


def marks(n: int) -> list[int]:
    """Request counts at which RSS is read: the first 100, every 250 after, and the end."""
    return sorted({min(FIRST, n), *range(EVERY, n, EVERY), n})


def served_process(pid: int) -> tuple[psutil.Process, list[str]]:
    """The process that serves (the one with the most RSS among the started one and its children)
    and the children found, by pid and command line."""
    root = psutil.Process(pid)
    children = root.children(recursive=True)
    named = [f"{c.pid} {' '.join(c.cmdline()[:6])}" for c in children]
    return max([root, *children], key=lambda p: p.memory_info().rss), named


async def ask(client: httpx.AsyncClient, model: str, i: int, schema: bool, max_tokens: int) -> int:
    body: dict[str, Any] = {
        "model": model, "messages": [{"role": "user", "content": question(i)}],
        "max_tokens": max_tokens, "temperature": 0, "seed": 1,
    }  # fmt: skip
    if schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    reply = await client.post("/v1/chat/completions", json=body)
    if reply.status_code != 200:
        raise RuntimeError(f"request {i}: HTTP {reply.status_code}: {reply.text[:300]}")
    return int(reply.json()["usage"]["completion_tokens"])


async def series(kind: str, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    """One server, --requests requests of one kind, RSS read at the marks."""
    schema = kind == "json_schema"
    port = free_port()
    command = [sys.executable, "-m", "runner", "serve", args.model, "--port", str(port)]
    command += ["--parallel", str(args.parallel), "--threads", str(args.threads)]
    command += ["--cache-ram", args.cache_ram, *shlex.split(args.runner_args)]
    process = start(command, log)
    limits = httpx.Limits(max_connections=args.concurrency + 2)
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
            ready = await wait_ready(client, process, args.ready_timeout)
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            served, children = served_process(process.pid)
            progress(f"  {kind}: ready in {ready:.1f} s on port {port}, RSS read on pid {served.pid}")
            if children:
                progress(f"  {kind}: runner serve has children: {'; '.join(children)}")
            rss_ready = served.memory_info().rss
            curve: list[tuple[int, float]] = []
            done, tokens, began = 0, 0, time.perf_counter()
            for mark in marks(args.requests):
                pending = iter(range(done, mark))  # the workers share it: each request is sent once

                async def worker(pending: Iterator[int] = pending) -> int:
                    return sum([await ask(client, model, i, schema, args.max_tokens) for i in pending])

                tokens += sum(await asyncio.gather(*(worker() for _ in range(args.concurrency))))
                done = mark
                rss = served.memory_info().rss / 1e6
                curve.append((done, rss))
                rate = done / (time.perf_counter() - began)
                progress(f"  {kind}: {done} requests, RSS {rss:.1f} MB ({rate:.1f} requests/s)")
            wall = time.perf_counter() - began
    finally:
        stop(process)
    base_rss = curve[0][1]
    growth = curve[-1][1] - base_rss
    after = curve[-1][0] - curve[0][0]
    return {
        "pid": served.pid,
        "children": children,
        "rss_ready_mb": rss_ready / 1e6,
        "curve": curve,
        "growth_mb": growth,
        "growth_kb_per_request": growth * 1000 / after if after else None,
        "completion_tokens_per_request": tokens / args.requests,
        "requests_per_s": args.requests / wall,
    }


def report(args: argparse.Namespace, setup: dict[str, str], results: dict[str, Any], out: TextIO) -> None:
    for key, value in setup.items():
        print(f"{key}: {value}", file=out)
    kinds = list(results)
    print(f"| requests answered | {' | '.join(f'{k} RSS MB' for k in kinds)} |", file=out)
    print("|---|" + "---|" * len(kinds), file=out)
    ready = " | ".join(f"{results[k]['rss_ready_mb']:.1f}" for k in kinds)
    print(f"| 0 (ready) | {ready} |", file=out)
    for row, (done, _) in enumerate(results[kinds[0]]["curve"]):
        cells = " | ".join(f"{results[k]['curve'][row][1]:.1f}" for k in kinds)
        print(f"| {done} | {cells} |", file=out)
    for kind in kinds:
        r = results[kind]
        print(
            f"{kind}: {r['growth_mb']:+.2f} MB from request {FIRST} to {args.requests} "
            f"({r['growth_kb_per_request']:+.2f} KB a request), {r['requests_per_s']:.1f} requests/s, "
            f"{r['completion_tokens_per_request']:.1f} completion tokens a request",
            file=out,
        )
    print("targets:", file=out)
    for kind in kinds:
        label = f"{kind}: RSS growth from request {FIRST} to {args.requests}, MB"
        print(f"  {target(label, results[kind]['growth_mb'], LIMIT_MB, False)}", file=out)
    if {"json_schema", "plain"} <= set(kinds):  # issue 35: a schema's cost to a busy server
        ratio = results["json_schema"]["requests_per_s"] / results["plain"]["requests_per_s"]
        print(f"  {target('json_schema requests/s over plain', ratio, 0.8, True)}", file=out)


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--model", default="smollm2", help="runner's model (alias or path)")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight at once")
    parser.add_argument("--parallel", type=int, default=4, help="the server's slots")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="llama.cpp's threads (1: on a CPU shared with other work, 2 threads waiting on each other "
        "at every step ran 30-60x slower; the figure here is memory, not speed)",
    )
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--control", action="store_true", help="then as many plain requests, on a new server")
    parser.add_argument(
        "--cache-ram",
        default="0",
        help="serve's kept prompt states (default 0: none; each distinct prompt's ~1.5 MB state would "
        "fill serve's 1G default and hide a leak of kilobytes)",
    )
    parser.add_argument("--runner-args", default="", help="more flags for runner serve")
    parser.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for /health")
    parser.add_argument("--json", action="store_true", help="print the curves as JSON")
    args = parser.parse_args()
    if args.requests <= FIRST:
        parser.error(f"--requests must be more than {FIRST}")
    found = {"python": sys.version.split()[0]}
    for dist in ("runner", "llama_cpp_python", "httpx"):
        found[dist] = importlib.metadata.version(dist)
    setup = {"machine": machine(), "versions": ", ".join(f"{k} {v}" for k, v in found.items())}
    setup["model"] = str(model_file(args.model))
    setup["settings"] = (
        f"{args.requests} requests, {args.concurrency} at once, {args.parallel} slots, llama.cpp threads: "
        f"{args.threads}, --cache-ram {args.cache_ram}, {args.max_tokens} tokens at most"
        + (f", runner {args.runner_args}" if args.runner_args else "")
    )
    logs = Path(tempfile.mkdtemp(prefix="bench_serve_memory-"))
    progress(f"server logs in {logs}")
    results: dict[str, Any] = {}
    for kind in ("json_schema", "plain") if args.control else ("json_schema",):
        log = logs / f"{kind}.log"
        progress(f"{kind}: {args.requests} requests")
        try:
            results[kind] = asyncio.run(series(kind, args, log))
        except BaseException:
            progress(f"{kind} failed; its log: {log}")
            raise
    # with --json, stdout is the JSON alone and the table goes to stderr
    report(args, setup, results, sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps({**setup, "results": results}, indent=2))


if __name__ == "__main__":
    main()
