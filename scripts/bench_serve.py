"""Serving side by side: `runner serve` against llama.cpp's own llama-server, same model, same machine.

    python scripts/bench_serve.py [--rounds 3] [--clients 1,8,32] [--requests 1] [--only runner|llama-server]
                                  [--json]

Each server in turn (runner, llama-server, runner, ... interleaved in rounds) is started on a free
port with the same slots, per-slot context and threads (`runner serve MODEL --parallel N --ctx C
--threads T`; `llama-server -m PATH -np N -c N*C -t T`), waited on until GET /health is 200, warmed
with one request, measured, and stopped (SIGTERM to its process group, SIGKILL after a timeout).
Every request is a streaming POST /v1/chat/completions, greedy, seed 1; completion tokens are counted
from the usage chunk (stream_options.include_usage), so a server that stops early shows in the mean.
  sequential    the prompts of the largest load one after another: aggregate completion tok/s
  N clients     N concurrent clients, each sending --requests distinct prompts one after another (from
                the sequential run's first on; with --fresh, prompts no server has seen, so no prompt
                cache holds them; one client's figure wants many: --clients 1 --requests 16), --max-tokens
                with ignore_eos: aggregate tok/s (tokens / first send to last end), TTFT p50 and
                p99 (send to the first non-empty content delta), and the aggregate against the
                sequential baseline
  chat          one client, 10 turns over a ~200-token system prompt, the whole history re-sent each
                turn: TTFT at turn 2 and turn 10 (prefix reuse keeps their ratio near 1), the
                median of --conversations such chats, one after another; and the engine's limit
                for that ratio: a raw llama_decode of the two turns' new tokens at their positions
Medians across rounds (and, beside the ratio of the medians, the median of each round's own ratio: a
round runs the two servers back to back, so the machine's drift between rounds leaves it), then three
targets on the medians: aggregate tok/s at the most clients >= 1.0x llama-server's,
TTFT p50 at 8 clients <= 1.2x llama-server's, runner's turn-10 TTFT <= 1.2x its turn 2. With --json,
stdout is one JSON object (settings, medians, every round) and the table goes to stderr with the
progress. The servers' own output goes to log files in a temporary folder, named when one fails.
The model file is `runner show MODEL --offline --json`'s (--model-path to override); llama-server is
a build of the pinned llama.cpp (--llama-server PATH), started with --no-repack on a CPU with AMX,
where it segfaults at load otherwise (benchlib.peer_flags).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
from benchlib import (
    free_port,
    interleaved,
    machine,
    model_file,
    peer_flags,
    progress,
    start,
    stop,
    target,
    wait_ready,
)

LLAMA_SERVER = Path("/tmp/peers/build/bin/llama-server")
SERVERS = ("runner", "llama-server")
TOPICS = [
    "a lighthouse keeper", "a lost robot", "a dragon who cannot fly", "a city under the sea",
    "a time traveller's mistake", "a talking cat", "the last tree on Earth", "a haunted library",
    "a chef on Mars", "a forgotten birthday", "a river that flows uphill", "a clockmaker's apprentice",
    "a desert caravan", "a ghost who is afraid of people", "a snowman in summer", "a pirate's parrot",
    "a train that never stops", "a garden on the moon", "a shy giant", "an old violin",
    "a secret tunnel", "a lonely satellite", "a bakery at midnight", "a mountain rescue dog",
    "a broken compass", "a village of inventors", "a whale who sings opera", "a stolen painting",
    "the first day of school", "a storm at sea", "a map with no edges", "a knight who hates swords",
]  # fmt: skip
SYSTEM = (
    "You are Harbour, the assistant of a small public library in a coastal town. You answer visitors' "
    "questions about books, opening hours, events and local history. Keep answers short and friendly, "
    "no longer than three sentences, and never invent facts: when you do not know something, say so "
    "and suggest asking the librarian at the front desk. The library opens from nine in the morning "
    "to six in the evening on weekdays, and from ten to four on Saturdays; it is closed on Sundays "
    "and public holidays. Members may borrow up to eight books at a time for three weeks, renew them "
    "twice online, and reserve titles that are out on loan. The reading room on the first floor has "
    "quiet desks, power sockets and free wireless internet. Every Tuesday afternoon there is a story "
    "hour for children, and on the last Thursday of each month a book club meets in the garden room. "
    "The local history collection holds maps, photographs and ship records from the old harbour, "
    "which visitors may consult but not take home. Printing costs ten cents a page."
)
QUESTIONS = [
    "Hello! When are you open on Saturday?", "How many books can I borrow?", "Can I renew them online?",
    "Is there wireless internet?", "What happens on Tuesdays?", "When does the book club meet?",
    "Can I take the old harbour maps home?", "How much is printing?", "Are you open on Sundays?",
    "Thank you, anything else I should know?",
]  # fmt: skip

Messages = list[dict[str, str]]


@dataclass
class Reply:
    ttft: float  # send to the first non-empty content delta (to the end when there was none)
    end: float  # send to the last byte
    tokens: int  # completion tokens, from the usage chunk (content deltas when it is missing)
    prompt_tokens: int
    text: str
    usage: bool  # whether the server sent a usage chunk


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    low, high = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def server_command(kind: str, args: argparse.Namespace, port: int) -> list[str]:
    threads = args.threads
    if kind == "runner":
        command = [sys.executable, "-m", "runner", "serve", args.model, "--port", str(port)]
        command += ["--parallel", str(args.parallel), "--ctx", str(args.ctx), "--threads", str(threads)]
        return command + shlex.split(args.runner_args)
    command = [str(args.llama_server), "-m", str(args.model_path), "--port", str(port)]
    command += ["-np", str(args.parallel), "-c", str(args.parallel * args.ctx), "-t", str(threads)]
    return command + peer_flags() + (["--no-webui"] if args.no_webui else [])


async def chat(client: httpx.AsyncClient, model: str, messages: Messages, max_tokens: int) -> Reply:
    body = {
        "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "seed": 1,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
    }  # fmt: skip
    sent = time.perf_counter()
    ttft, parts, deltas, usage = None, [], 0, None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if content:
                    ttft = time.perf_counter() - sent if ttft is None else ttft
                    parts.append(content)
                    deltas += 1
    end = time.perf_counter() - sent
    tokens = usage["completion_tokens"] if usage else deltas
    prompt = usage.get("prompt_tokens", 0) if usage else 0
    return Reply(end if ttft is None else ttft, end, tokens, prompt, "".join(parts), usage is not None)


def prompt(i: int) -> Messages:
    topic = TOPICS[i % len(TOPICS)] + (f" (number {i // len(TOPICS) + 1})" if i >= len(TOPICS) else "")
    return [{"role": "user", "content": f"Write a short story about {topic}."}]


async def sequential(
    client: httpx.AsyncClient, model: str, n: int, max_tokens: int, first: int = 0
) -> dict[str, float]:
    start = time.perf_counter()
    replies = [await chat(client, model, prompt(first + i), max_tokens) for i in range(n)]
    wall = time.perf_counter() - start
    tokens = sum(r.tokens for r in replies)
    missing = sum(not r.usage for r in replies)
    return {"tok_s": tokens / wall, "tokens_per_request": tokens / n, "wall_s": wall, "no_usage": missing}


async def concurrent(
    client: httpx.AsyncClient, model: str, n: int, max_tokens: int, first: int = 0, requests: int = 1
) -> dict[str, float]:
    async def one_client(i: int) -> list[Reply]:  # its requests one after another, each prompt its own
        return [await chat(client, model, prompt(first + i + k * n), max_tokens) for k in range(requests)]

    start = time.perf_counter()
    replies = [r for each in await asyncio.gather(*(one_client(i) for i in range(n))) for r in each]
    wall = time.perf_counter() - start
    tokens = sum(r.tokens for r in replies)
    ttfts = [r.ttft for r in replies]
    return {
        "tok_s": tokens / wall, "ttft_p50_s": percentile(ttfts, 0.5), "ttft_p99_s": percentile(ttfts, 0.99),
        "tokens_per_request": tokens / len(replies), "wall_s": wall,
        "no_usage": sum(not r.usage for r in replies),
    }  # fmt: skip


async def conversations(
    client: httpx.AsyncClient, model: str, max_tokens: int, n: int
) -> dict[str, list[float]]:
    """n conversations one after another, each its own (no head in common with another, so none
    finds another's cells): each turn's TTFT is their median, the tokens are the first's."""
    talks = [await conversation(client, model, max_tokens, k) for k in range(n)]
    first = talks[0]
    first["ttft_s"] = [statistics.median(t["ttft_s"][i] for t in talks) for i in range(len(QUESTIONS))]
    return first


async def conversation(
    client: httpx.AsyncClient, model: str, max_tokens: int, k: int
) -> dict[str, list[float]]:
    messages = [{"role": "system", "content": f"Desk {k + 1}. {SYSTEM}"}]
    ttft, prompt_tokens, completion_tokens = [], [], []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        reply = await chat(client, model, messages, max_tokens)
        messages.append({"role": "assistant", "content": reply.text})
        ttft.append(reply.ttft)
        prompt_tokens.append(float(reply.prompt_tokens))
        completion_tokens.append(float(reply.tokens))
    return {"ttft_s": ttft, "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}


def served_name(model: str) -> str:
    """The name `runner serve MODEL` serves MODEL under: a file's name without .gguf, else MODEL."""
    return Path(model).stem if Path(model).expanduser().is_file() else model


def engine_limit(
    args: argparse.Namespace, chat: dict[str, list[float]], repeats: int = 7
) -> dict[str, float]:
    """The engine's limit for the chat rows: a raw llama_decode of each turn's new tokens (its prompt
    less the previous prompt and answer, but the answer's last token, sampled and never decoded) at
    that turn's position, in a context shaped as the servers' (slots x context, threads), nothing
    else: how much of turn 10 against turn 2 is llama.cpp's own."""
    from runner.engine.engine import Engine
    from runner.engine.llamacpp import llama

    lib, times = llama(), {}
    with Engine(
        args.model_path, n_ctx=args.parallel * args.ctx, n_threads=args.threads, n_seq=args.parallel
    ) as e:
        batch = lib.llama_batch_init(args.ctx, 0, 1)

        def decode(at: int, n: int) -> float:
            batch.n_tokens = n
            for i in range(n):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = 100 + (at + i) % 1000, at + i, 1
                batch.seq_id[i][0], batch.logits[i] = 0, int(i == n - 1)
            start = time.perf_counter()
            assert lib.llama_decode(e.context.ctx, batch) == 0
            lib.llama_synchronize(e.context.ctx)
            return time.perf_counter() - start

        prompts, answers = chat["prompt_tokens"], chat["completion_tokens"]
        for turn in (2, len(prompts)):
            total = int(prompts[turn - 1])
            new = total - int(prompts[turn - 2] + answers[turn - 2]) + 1
            samples = []
            for _ in range(repeats):
                lib.llama_memory_seq_rm(e.context.memory, 0, -1, -1)
                for at in range(0, total - new, 512):
                    decode(at, min(512, total - new - at))
                samples.append(decode(total - new, new))
            times[f"turn {turn}"] = statistics.median(samples)
            times[f"turn {turn} new tokens"] = new
        lib.llama_batch_free(batch)
    return times


async def measure(kind: str, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    port = free_port()
    process = start(server_command(kind, args, port), log)
    model = served_name(args.model) if kind == "runner" else str(args.model_path)
    # a connection per request, as from separate clients: llama-server closes a kept-alive connection
    # after a few requests, and a request sent on it as it closes fails
    limits = httpx.Limits(max_connections=max(args.clients) + 4, max_keepalive_connections=0)
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
            ready = await wait_ready(client, process, args.ready_timeout)
            progress(f"  {kind}: ready in {ready:.1f} s on port {port}")
            await chat(client, model, prompt(0), 8)  # warm-up
            result: dict[str, Any] = {"ready_s": ready}
            most = max(args.clients)
            result["sequential"] = seq = await sequential(client, model, most, args.max_tokens)
            progress(f"  {kind}: sequential {seq['tok_s']:.1f} tok/s")
            loads = {}
            for k, n in enumerate(args.clients):
                # --fresh: prompts no server has seen (each load's after the last one's)
                first = (k + 1) * most * args.requests if args.fresh else 0
                load = await concurrent(client, model, n, args.max_tokens, first, args.requests)
                loads[str(n)] = load
                load["vs_sequential"] = load["tok_s"] / seq["tok_s"]
                progress(
                    f"  {kind}: {n} clients {load['tok_s']:.1f} tok/s, TTFT p50 {load['ttft_p50_s']:.3f} s"
                )
            result["clients"] = loads
            if any(x["no_usage"] for x in (seq, *loads.values())):
                progress(f"  warning: {kind} sent no usage chunk; content deltas counted as tokens")
            result["chat"] = talk = await conversations(client, model, 32, args.conversations)
            progress(
                f"  {kind}: chat TTFT turn 2 {talk['ttft_s'][1]:.3f} s, turn 10 {talk['ttft_s'][-1]:.3f} s"
            )
            return result
    finally:
        stop(process)


def flatten(result: dict[str, Any]) -> dict[str, float]:
    """One round's figures, by row name, in the table's order."""
    rows = {
        "sequential tok/s": result["sequential"]["tok_s"],
        "sequential tokens/request": result["sequential"]["tokens_per_request"],
    }
    for n, load in result["clients"].items():
        rows[f"{n} clients tok/s"] = load["tok_s"]
        rows[f"{n} clients vs sequential"] = load["vs_sequential"]
        rows[f"{n} clients TTFT p50 s"] = load["ttft_p50_s"]
        rows[f"{n} clients TTFT p99 s"] = load["ttft_p99_s"]
        rows[f"{n} clients tokens/request"] = load["tokens_per_request"]
    ttft = result["chat"]["ttft_s"]
    rows["chat TTFT turn 2 s"], rows["chat TTFT turn 10 s"] = ttft[1], ttft[-1]
    rows["chat turn 10 / turn 2"] = ttft[-1] / ttft[1]
    rows["chat prompt tokens turn 10"] = result["chat"]["prompt_tokens"][-1]
    return rows


def versions(args: argparse.Namespace) -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for dist in ("runner", "llama_cpp_python", "httpx"):
        found[dist] = importlib.metadata.version(dist)
    if "llama-server" in args.only:
        out = subprocess.run([str(args.llama_server), "--version"], capture_output=True, text=True)
        lines = [x for x in (out.stdout + out.stderr).splitlines() if x.startswith("version")]
        found["llama-server"] = lines[0].split(":", 1)[1].strip() if lines else "unknown"
    return found


Rounds = dict[str, list[dict]]


def report(
    args: argparse.Namespace, setup: dict[str, str], rounds: Rounds, limit: dict[str, float], out: TextIO
) -> dict:
    """The table and the targets, on `out`; returns the medians."""
    medians = {}
    for kind in args.only:
        flat = [flatten(r) for r in rounds[kind]]
        medians[kind] = {row: statistics.median(f[row] for f in flat) for row in flat[0]}
    for key, value in setup.items():
        print(f"{key}: {value}", file=out)
    print(f"{args.rounds} rounds, medians", file=out)
    both = len(args.only) == 2
    ratios = " runner / llama-server | each round's ratio, median |" if both else ""
    print(f"| figure | {' | '.join(args.only)} |" + ratios, file=out)
    print("|---|" + "---|" * (len(args.only) + 2 * both), file=out)
    for row in medians[args.only[0]]:
        cells = " | ".join(f"{medians[k][row]:.3f}" for k in args.only)
        ratio = ""
        if both:  # a round's two servers ran back to back: their ratio leaves out the drift between rounds
            pairs = zip(rounds["runner"], rounds["llama-server"], strict=True)
            paired = statistics.median(flatten(a)[row] / flatten(b)[row] for a, b in pairs)
            ratio = f" {medians['runner'][row] / medians['llama-server'][row]:.3f} | {paired:.3f} |"
        print(f"| {row} | {cells} |{ratio}", file=out)
    runner, peer = medians.get("runner"), medians.get("llama-server")
    top = f"{max(args.clients)} clients"

    def versus(row: str) -> float | None:
        if runner is None or peer is None or row not in runner:
            return None
        return runner[row] / peer[row]

    turns = runner["chat turn 10 / turn 2"] if runner else None
    last = max(int(k.split()[1]) for k in limit if k.endswith("new tokens"))
    print(
        f"engine limit, raw llama_decode of the chat's new tokens: turn 2 {limit['turn 2'] * 1000:.1f} ms "
        f"({limit['turn 2 new tokens']:.0f} tokens), turn {last} {limit[f'turn {last}'] * 1000:.1f} ms "
        f"({limit[f'turn {last} new tokens']:.0f} tokens): {limit[f'turn {last}'] / limit['turn 2']:.2f}x",
        file=out,
    )
    print("targets:", file=out)
    for line in (
        target(f"aggregate tok/s at {top}, runner / llama-server", versus(f"{top} tok/s"), 1.0, True),
        target("TTFT p50 at 8 clients, runner / llama-server", versus("8 clients TTFT p50 s"), 1.2, False),
        target("runner's chat TTFT turn 10 / turn 2", turns, 1.2, False),
    ):
        print(f"  {line}", file=out)
    return medians


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--model", default="smollm2", help="runner's model (alias or path)")
    parser.add_argument("--model-path", type=Path, help="the GGUF file (default: `runner show MODEL`'s)")
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--only", choices=SERVERS, help="measure one server alone")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="1,8,32", help="concurrent clients, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--parallel", type=int, default=8, help="slots")
    parser.add_argument("--ctx", type=int, default=2048, help="context per slot")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=3, help="10-turn chats a round (TTFT: median)")
    parser.add_argument("--runner-args", default="", help="more flags for runner serve: '--flash-attn off'")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="each load's prompts unseen before (default: the sequential run's, as a server's prompt "
        "cache may hold them)",
    )
    parser.add_argument(
        "--requests", type=int, default=1, help="requests each client sends one after another (default 1)"
    )
    parser.add_argument("--ready-timeout", type=float, default=180.0, help="seconds to wait for /health")
    parser.add_argument("--json", action="store_true", help="print medians and every round as JSON")
    args = parser.parse_args()
    args.clients = [int(n) for n in args.clients.split(",")]
    args.only = [args.only] if args.only else list(SERVERS)
    if args.model_path is None:
        args.model_path = model_file(args.model)
    elif args.model == "smollm2":
        args.model = str(args.model_path)
    args.no_webui = False
    if "llama-server" in args.only:
        help_text = subprocess.run([str(args.llama_server), "--help"], capture_output=True, text=True)
        args.no_webui = "--no-webui" in help_text.stdout + help_text.stderr
    setup = {"machine": machine(), "versions": ", ".join(f"{k} {v}" for k, v in versions(args).items())}
    setup["model"] = str(args.model_path)
    setup["settings"] = (
        f"{args.parallel} slots x {args.ctx} context each, {args.threads} threads, "
        f"{args.max_tokens} tokens a request, clients {','.join(map(str, args.clients))}, "
        + (
            "each load's prompts unseen before (--fresh)"
            if args.fresh
            else "the loads' prompts the sequential run's"
        )
        + (f", runner {args.runner_args}" if args.runner_args else "")
    )
    rounds = interleaved(
        list(args.only), args.rounds, "bench_serve-", lambda kind, log: measure(kind, args, log)
    )
    first = rounds[args.only[0]][0]["chat"]
    progress("engine limit: raw llama_decode of the chat's turn 2 and turn 10 new tokens")
    limit = engine_limit(args, first)
    # with --json, stdout is the JSON alone and the table goes to stderr
    medians = report(args, setup, rounds, limit, sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps({**setup, "medians": medians, "engine_limit": limit, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
