"""Embeddings served: texts per second through POST /v1/embeddings, all in one request against one
request per text, on `runner serve` and, beside it, llama.cpp's own llama-server on the same model.

    python scripts/bench_embed.py [--texts 256] [--clients 16] [--rounds 1] [--only runner|llama-server]

Each server in turn is started on a free port, waited on until GET /health is 200, warmed with one
request, then measured on the same --texts short sentences (distinct, 9-14 tokens each):
  batched       one request with every text: texts / wall time
  one by one    one request per text, one after another
  N clients     one request per text, --clients of them in flight at once
runner: `runner serve MODEL --threads T` (its embedding context: 512 tokens a pass, mean pooling for a
model that declares none, flash attention off). llama-server: `-m PATH --embeddings --pooling mean -fa
off -np N -c N*512 --kv-unified -b 512 -ub 512 -t T` (the same pooling and pass size, N = --clients
slots; without --kv-unified, llama.cpp splits a pass into equal lengths per sequence and pools a longer
text over its tail only). The vectors of both are compared (how many agree to a cosine of 0.9999,
the lowest cosine). The
table gives texts/s, batched against one by one, and runner against llama-server. The model file is
`runner show MODEL --offline --json`'s (--model-path to override); llama-server is a build of the
pinned llama.cpp (--llama-server PATH).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from benchlib import free_port, model_file, peer_flags, progress, start, stop, wait_ready

LLAMA_SERVER = Path("/tmp/peers/build/bin/llama-server")
SERVERS = ("runner", "llama-server")
SUBJECTS = ["The cat", "A small boat", "The old library", "My neighbour", "The river", "A red kite",
            "The market", "Our train", "The violin", "A storm"]  # fmt: skip
VERBS = ["waited by the door", "drifted past the harbour at dawn", "closed early on Sunday",
         "planted tomatoes in the garden", "flooded the lower fields", "rose above the hills"]  # fmt: skip
PLACES = ["in spring", "last night", "after the rain", "near the station", "this morning", "at noon"]


def texts(n: int) -> list[str]:
    """n distinct short sentences."""
    out = []
    for i in range(n):
        subject, verb = SUBJECTS[i % len(SUBJECTS)], VERBS[(i // len(SUBJECTS)) % len(VERBS)]
        out.append(f"{subject} {verb} {PLACES[(i // 60) % len(PLACES)]}, number {i}.")
    return out


def server_command(kind: str, args: argparse.Namespace, port: int) -> list[str]:
    if kind == "runner":
        return [
            sys.executable,
            "-m",
            "runner",
            "serve",
            args.model,
            "--port",
            str(port),
            "--threads",
            str(args.threads),
        ]
    slots = args.clients
    command = [str(args.llama_server), "-m", str(args.model_path), "--port", str(port), "--embeddings"]
    command += ["--pooling", "mean", "-fa", "off", "-np", str(slots), "-c", str(slots * 512), "--kv-unified"]
    return command + ["-b", "512", "-ub", "512", "-t", str(args.threads), "--no-webui", *peer_flags()]


async def embed(client: httpx.AsyncClient, model: str, inputs: list[str]) -> list[list[float]]:
    reply = await client.post("/v1/embeddings", json={"model": model, "input": inputs}, timeout=600)
    reply.raise_for_status()
    return [d["embedding"] for d in sorted(reply.json()["data"], key=lambda d: d["index"])]


def served_name(model: str) -> str:
    """The name `runner serve MODEL` serves MODEL under: a file's name without .gguf, else MODEL."""
    return Path(model).stem if Path(model).expanduser().is_file() else model


async def measure(kind: str, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    port = free_port()
    process = start(server_command(kind, args, port), log)
    model = served_name(args.model) if kind == "runner" else "model"
    sentences = texts(args.texts)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            await wait_ready(client, process, args.ready_timeout)
            await embed(client, model, sentences[:4])  # warm-up
            start_s = time.perf_counter()
            vectors = await embed(client, model, sentences)
            batched = time.perf_counter() - start_s
            start_s = time.perf_counter()
            for text in sentences:
                await embed(client, model, [text])
            sequential = time.perf_counter() - start_s
            gate = asyncio.Semaphore(args.clients)

            async def one(text: str) -> None:
                async with gate:
                    await embed(client, model, [text])

            start_s = time.perf_counter()
            await asyncio.gather(*(one(text) for text in sentences))
            concurrent = time.perf_counter() - start_s
    finally:
        stop(process)
    n = len(sentences)
    return {
        "batched": n / batched,
        "one by one": n / sequential,
        "clients": n / concurrent,
        "vectors": vectors,
    }


def compare(a: list[list[float]], b: list[list[float]]) -> str:
    cosines = [sum(x * y for x, y in zip(v, w, strict=True)) for v, w in zip(a, b, strict=True)]
    close = sum(c >= 0.9999 for c in cosines)
    return f"{close} of {len(cosines)} within cosine 0.9999, lowest cosine {min(cosines):.6f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2", help="runner's model (alias or path)")
    parser.add_argument("--model-path", type=Path, help="the GGUF file (default: `runner show MODEL`'s)")
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--only", choices=SERVERS, help="measure one server alone")
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--clients", type=int, default=16, help="requests in flight at once (and slots)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ready-timeout", type=float, default=180.0)
    args = parser.parse_args()
    args.model_path = args.model_path or model_file(args.model)
    kinds = [args.only] if args.only else [k for k in SERVERS if k == "runner" or args.llama_server.exists()]
    logs = Path(tempfile.mkdtemp(prefix="bench_embed-"))
    progress(f"server logs in {logs}")
    rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for i in range(args.rounds):
        for kind in kinds:  # interleaved: a noisy moment falls on both
            progress(f"round {i + 1}/{args.rounds}: {kind}")
            rounds[kind].append(asyncio.run(measure(kind, args, logs / f"{kind}-{i + 1}.log")))
    modes = ("batched", "one by one", "clients")
    medians = {k: {m: statistics.median(r[m] for r in rs) for m in modes} for k, rs in rounds.items()}
    names = {"batched": f"batched ({args.texts} in 1 request)", "one by one": "1 request per text, in turn"}
    names["clients"] = f"1 request per text, {args.clients} at once"
    print(f"{args.texts} texts, {args.threads} threads, {args.model_path.name}, medians of {args.rounds}")
    header = f"| {'texts/s':<32} | " + " | ".join(f"{k:>12}" for k in kinds)
    if len(kinds) == 2:
        header += " | runner / llama-server"
    print(header)
    for mode in modes:
        row = f"| {names[mode]:<32} | " + " | ".join(f"{medians[k][mode]:>12.1f}" for k in kinds)
        if len(kinds) == 2:
            row += f" | {medians['runner'][mode] / medians['llama-server'][mode]:.2f}x"
        print(row)
    for kind in kinds:
        m = medians[kind]
        print(f"{kind}: batched / one by one {m['batched'] / m['one by one']:.2f}x, "
              f"batched / {args.clients} at once {m['batched'] / m['clients']:.2f}x")  # fmt: skip
    if len(kinds) == 2:
        print("vectors, runner against llama-server:", compare(*(rounds[k][-1]["vectors"] for k in kinds)))


if __name__ == "__main__":
    main()
