"""Audio against llama.cpp's own llama-server --mmproj, on the same model, audio projector and WAVs:

1. time to first token of a 10-second clip on a warm server (one clip answered first), streamed, as a
   client sees it over loopback, runner serve and llama-server in interleaved rounds (target: runner
   at most 1.05x llama-server's);
2. 8 clients at once, each its own clip, on a server with a slot each: aggregate answer tokens/s
   (target: at least 1.0x llama-server's);
3. the real-time factor of `runner transcribe` (seconds of audio a second of wall time, the model's
   load apart) on the clips, one process; and on paper, for a real 1B model, from an encode and a
   decode cost given on the command line (--encode-ms, --tokens-per-s: measure them on the machine
   that has the model).

The projector is tests/synth.py's random-weight one (ultravox by default: width 40, 2 blocks), so the
encoder costs almost nothing beside the 187 embeddings a window decodes into the text model: the
figures measure runner's path (decode, media chunk, loop), not a real encoder. llama-server is a
build of the pinned llama.cpp (--llama-server PATH). Figures: docs/audio.md.

    python scripts/bench_audio.py [--model smollm2] [--type ultravox] [--rounds 3] [--clients 8]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from benchlib import free_port, machine, model_file, peer_flags, progress, start, stop, target, wait_ready

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
LLAMA_SERVER = Path("/tmp/peers/build/bin/llama-server")
QUESTION = "What is said here?"
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def clip(seconds: float, seed: int) -> bytes:
    """A seeded 16 kHz mono WAV: a tone and noise, different for each seed."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    x = 0.3 * np.sin(2 * np.pi * (220 + 40 * seed) * t) + 0.05 * rng.standard_normal(t.size)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((x * 32767).astype("<i2").tobytes())
    return out.getvalue()


def request(model: str, wav: bytes, tokens: int, stream: bool = False) -> dict[str, Any]:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
    content = [part, {"type": "text", "text": QUESTION}]
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": tokens,
            "stream": stream, **GREEDY}  # fmt: skip


def server_command(
    kind: str, args: argparse.Namespace, model: Path, projector: Path, port: int, n: int
) -> list[str]:
    if kind == "runner":
        return [sys.executable, "-m", "runner", "serve", args.model, "--mmproj", str(projector),
                "--port", str(port), "--parallel", str(n), "--ctx", "2048", "--threads", str(args.threads),
                "--flash-attn", "off", "--spec", "none", "--max-images", "8"]  # fmt: skip
    return [str(args.llama_server), "-m", str(model), "--mmproj", str(projector), "--port", str(port),
            "-np", str(n), "-c", str(n * 2048), "-t", str(args.threads), "-fa", "off", "--no-webui",
            *peer_flags()]  # fmt: skip


async def first_token(client: httpx.AsyncClient, body: dict[str, Any]) -> float:
    """Seconds from sending to the first streamed piece of answer (or the end, if the answer is empty)."""
    began = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content") or choices[0].get("finish_reason"):
                return time.perf_counter() - began
    raise RuntimeError("no answer came")


async def warm_ttft(
    kind: str, args: argparse.Namespace, model: Path, projector: Path, round_: int, log: Path
) -> list[float]:
    port = free_port()
    server = start(server_command(kind, args, model, projector, port, 1), log)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
            await wait_ready(client, server, 180)
            await first_token(client, request(args.served, clip(10.0, 900), 2, stream=True))
            return [
                await first_token(
                    client, request(args.served, clip(10.0, 1000 + round_ * 10 + i), 2, stream=True)
                )
                for i in range(args.asks)
            ]
    finally:
        stop(server)


async def clients_at_once(
    kind: str, args: argparse.Namespace, model: Path, projector: Path, log: Path
) -> float:
    port = free_port()
    server = start(server_command(kind, args, model, projector, port, args.clients), log)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=900) as client:
            await wait_ready(client, server, 180)

            async def one(seed: int) -> int:
                reply = (
                    await client.post(
                        "/v1/chat/completions", json=request(args.served, clip(10.0, seed), args.tokens)
                    )
                ).json()
                return int(reply["usage"]["completion_tokens"])

            await one(500)
            began = time.perf_counter()
            tokens = sum(await asyncio.gather(*(one(seed) for seed in range(args.clients))))
            return tokens / (time.perf_counter() - began)
    finally:
        stop(server)


def real_time_factor(args: argparse.Namespace, projector: Path, folder: Path) -> float:
    """Seconds of audio per second of wall time for `runner transcribe` over the clips (load apart:
    the sum of each file's total_s)."""
    paths = []
    for i in range(args.clients):
        paths.append(folder / f"rtf-{i}.wav")
        paths[-1].write_bytes(clip(10.0, 2000 + i))
    done = subprocess.run(
        [sys.executable, "-m", "runner", "transcribe", args.model, *map(str, paths),
         "--mmproj", str(projector), "--jsonl", "--max-tokens", str(args.tokens),
         "--threads", str(args.threads)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    return sum(r["duration_s"] for r in rows) / sum(r["timings"]["total_s"] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--type", choices=("ultravox", "voxtral", "qwen2a"), default="ultravox")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--asks", type=int, default=3, help="measured requests a warm server")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--encode-ms", type=float, default=None, help="a real encoder's ms per 30 s window")
    parser.add_argument("--tokens-per-s", type=float, default=None, help="a real model's decode tokens/s")
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    args = parser.parse_args()
    from runner.gguf import read_header
    from tests.synth import write_audio_projector

    model = model_file(args.model)
    width = read_header(model).arch_get("embedding_length")
    folder = Path(tempfile.mkdtemp(prefix="bench-audio-"))
    projector = write_audio_projector(folder / f"{args.type}.gguf", int(width), args.type)
    args.served = args.model
    progress(f"{machine()}; {args.type} test projector, files in {folder}")

    progress("time to first token of a 10 s clip on warm servers, interleaved rounds")
    ttft: dict[str, list[float]] = {"runner": [], "llama-server": []}
    for r in range(args.rounds):
        for kind in ttft:
            ttft[kind] += asyncio.run(
                warm_ttft(kind, args, model, projector, r, folder / f"t-{kind}-{r}.log")
            )
    progress(f"{args.clients} clients at once, each its own 10 s clip, interleaved rounds")
    rates: dict[str, list[float]] = {"runner": [], "llama-server": []}
    for r in range(args.rounds):
        for kind in rates:
            rates[kind].append(
                asyncio.run(clients_at_once(kind, args, model, projector, folder / f"c-{kind}-{r}.log"))
            )
    progress("runner transcribe's real-time factor")
    rtf = real_time_factor(args, projector, folder)

    med = {k: statistics.median(v) for k, v in ttft.items()}
    agg = {k: statistics.median(v) for k, v in rates.items()}
    print(f"# bench_audio: {machine()}; {args.model}, {args.type} test projector, 10 s WAV clips")
    print(f"TTFT of a 10 s clip (median of {args.rounds} servers x {args.asks} asks): runner"
          f" {med['runner'] * 1000:.0f} ms, llama-server {med['llama-server'] * 1000:.0f} ms")  # fmt: skip
    print(
        target(
            "TTFT runner / llama-server, a 10 s clip",
            med["runner"] / med["llama-server"],
            1.05,
            at_least=False,
        )
    )
    print(f"{args.clients} clients at once (median of {args.rounds}): runner {agg['runner']:.1f} tok/s,"
          f" llama-server {agg['llama-server']:.1f} tok/s")  # fmt: skip
    print(target("aggregate runner / llama-server", agg["runner"] / agg["llama-server"], 1.0, at_least=True))
    print(f"runner transcribe, real-time factor (s of audio per s, load apart): {rtf:.1f}x")
    if args.encode_ms and args.tokens_per_s:
        # a 10 s clip is one window: its encode, its 187 embeddings decoded as a prompt (at ~8x the
        # answer's rate, a batch), and ~30 words of answer
        seconds = args.encode_ms / 1000 + 187 / (8 * args.tokens_per_s) + 40 / args.tokens_per_s
        print(f"on paper, a real model at {args.encode_ms:.0f} ms a window and {args.tokens_per_s:.0f} tok/s:"
              f" {10 / seconds:.1f}x real time for 10 s clips")  # fmt: skip


if __name__ == "__main__":
    main()
