"""Images against llama.cpp's own llama-server --mmproj, on the same model, projector and PNG images:

1. the same greedy answer, token for token: `runner run --image` (one process per image) and
   llama-server's /v1/chat/completions with the image as a data URL (logprobs carry the token ids);
   then runner's one loop with all the images in a batch of sequences at once, each against its
   answer alone;
2. time to first token of a one-image prompt on warm servers (`runner serve --mmproj` and
   llama-server, one slot each, a request answered first), streamed, as a client sees it over
   loopback, --asks of each a server; the same question without an image beside it; rounds
   interleaved;
3. --images clients at once, each sending its own image to `runner serve --mmproj` and to
   llama-server (a slot each): aggregate answer tokens/s, rounds interleaved.

    python scripts/bench_vision.py [--projector mlp|gemma3|idefics3|qwen2vl|qwen25vl] [--images 8]
        [--rounds 5] [--asks 4]
        [--tokens 24]

The projector is scripts/make_test_projector.py's (random weights: answers mean nothing, but every
token must match); with idefics3, the model is a copy of --model's file with SmolVLM's image tokens
(make_test_projector.py --vocab-out), and each 64 x 48 image is 5 image chunks (4 tiles and the whole
image), text between them; with qwen2vl and qwen25vl, a copy written as a qwen2vl model (--mrope-out:
M-RoPE, each image of nx x ny tokens max(nx, ny) positions) and images of 112 x 112 to 224 x 112
(16 to 32 tokens over 4 to 8 positions); the images are random PNGs (PNG: both read the same pixels;
JPEG decoders may differ by a pixel). Sampling: greedy, no penalties, flash attention off in both.
llama-server is a build of the pinned llama.cpp (--llama-server PATH, default
/tmp/peers/build/bin/llama-server). Figures: docs/vision.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

import httpx
from benchlib import free_port, machine, model_file, peer_flags, progress, start, stop, target, wait_ready

ROOT = Path(__file__).resolve().parent.parent
LLAMA_SERVER = Path("/tmp/peers/build/bin/llama-server")
QUESTION = "What is in this picture?"
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


QWEN = ("qwen2vl", "qwen25vl")
QWEN_SIZES = [(112, 112), (224, 112), (112, 224), (168, 112)]  # 4x4, 8x4, 4x8, 6x4 tokens: 4-8 positions
SIZES = [(64, 48)]


def png(seed: int) -> bytes:
    from PIL import Image

    rng = random.Random(seed)
    width, height = SIZES[seed % len(SIZES)]
    image = Image.new("RGB", (width, height))
    image.putdata([tuple(rng.randrange(256) for _ in range(3)) for _ in range(width * height)])
    out = BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def runner_answer(model: str, image: Path | None, projector: Path, tokens: int) -> dict[str, Any]:
    with_image = ["--image", str(image), "--mmproj", str(projector)] if image is not None else []
    done = subprocess.run(
        [sys.executable, "-m", "runner", "run", model, QUESTION, *with_image,
         "--temperature", "0", "--repeat-penalty", "1",
         "--presence-penalty", "0", "--frequency-penalty", "0", "--flash-attn", "off",
         "--max-tokens", str(tokens), "--json", "--logprobs", "0", "--no-prompt-cache"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    data = json.loads(done.stdout)
    return {
        "ids": [t["id"] for t in data["logprobs"]],
        "logprobs": [t["logprob"] for t in data["logprobs"]],
        "text": data["text"],
        "ttft_s": data["timings"]["ttft_s"],
    }


async def server_answer(client: httpx.AsyncClient, image: bytes | None, tokens: int) -> dict[str, Any]:
    content: Any = QUESTION
    if image is not None:
        url = "data:image/png;base64," + base64.b64encode(image).decode()
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": tokens, "logprobs": True, "top_logprobs": 1, "cache_prompt": False, **GREEDY,
    }  # fmt: skip
    reply = (await client.post("/v1/chat/completions", json=body, timeout=300)).json()
    content = reply["choices"][0]["logprobs"]["content"]
    if reply["choices"][0]["finish_reason"] == "stop" and content:
        content = content[:-1]  # llama-server scores the end-of-generation token too; runner does not
    timings = reply.get("timings", {})
    first = timings.get("prompt_ms", 0) + timings.get("predicted_per_token_ms", 0)
    return {
        "ids": [t["id"] for t in content],
        "logprobs": [t["logprob"] for t in content],
        "text": reply["choices"][0]["message"]["content"],
        "ttft_s": first / 1000,
    }


async def with_server(
    args: argparse.Namespace, model: Path, projector: Path, images: list[bytes | None], log: Path
) -> list[dict[str, Any]]:
    port = free_port()
    command = [str(args.llama_server), "-m", str(model), "--mmproj", str(projector), "--port", str(port),
               "-c", "4096", "-np", "1", "-fa", "off", "-t", str(args.threads), "--no-webui",
               *peer_flags()]  # fmt: skip
    server = start(command, log)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            await wait_ready(client, server, 120)
            return [await server_answer(client, image, args.tokens) for image in images]
    finally:
        stop(server)


def batched(model: Path, projector: Path, images: list[bytes], tokens: int) -> list[list[int]]:
    """All the images at once, a sequence each, through runner's one loop (run_batch)."""
    sys.path.insert(0, str(ROOT))
    from runner.engine.batch import run_batch
    from runner.engine.engine import Engine
    from runner.engine.llamacpp import Placement
    from runner.engine.prompt import render_prompt
    from runner.engine.request import Request
    from runner.engine.text.sampling import SamplingConfig
    from runner.engine.text.template import Message
    from runner.gguf import read_header
    from runner.images import load_image

    greedy = SamplingConfig(temperature=0, repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    ids: dict[int, list[int]] = {i: [] for i in range(len(images))}
    with Engine(
        model, n_ctx=4096 * len(images), n_seq=len(images), placement=Placement(flash_attn=False)
    ) as engine:
        engine.attach_projector(projector)
        jobs = []
        for i, data in enumerate(images):
            image = load_image(data, name=str(i))
            prompt = render_prompt(
                engine, read_header(model), [Message("user", engine.vision.marker + QUESTION)],
                images=[image],
            )  # fmt: skip
            jobs.append(Request(prompt, greedy, max_tokens=tokens))
        run_batch(engine, jobs, lambda _result: None, on_token=lambda i, t: ids[i].append(t))
        for answer in ids.values():  # on_token sees the end-of-generation token too: run's ids do not
            if answer and engine.model.is_end(answer[-1]):
                answer.pop()
    return [ids[i] for i in range(len(images))]


def server_command(
    kind: str, args: argparse.Namespace, model: Path, projector: Path, port: int, n: int
) -> list[str]:
    """runner serve or llama-server on the same model and projector, n slots of 2048 tokens."""
    if kind == "runner":
        return [sys.executable, "-m", "runner", "serve", args.model, "--mmproj", str(projector),
                "--port", str(port), "--parallel", str(n), "--ctx", "2048", "--threads", str(args.threads),
                "--flash-attn", "off", "--spec", "none"]  # fmt: skip
    return [str(args.llama_server), "-m", str(model), "--mmproj", str(projector), "--port", str(port),
            "-np", str(n), "-c", str(n * 2048), "-t", str(args.threads), "-fa", "off", "--no-webui",
            *peer_flags()]  # fmt: skip


def request(model: str, image: bytes | None, text: str, tokens: int, stream: bool = False) -> dict[str, Any]:
    content: Any = text
    if image is not None:
        url = "data:image/png;base64," + base64.b64encode(image).decode()
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": tokens,
            "stream": stream, **GREEDY}  # fmt: skip


async def first_token(client: httpx.AsyncClient, body: dict[str, Any]) -> float:
    """Seconds from sending the request to its first streamed piece of answer text (client side), or
    to its end where the first token sampled ended the answer (a random projector's answer may be
    empty: the prompt's work is the same)."""
    began = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content") or choices[0].get("finish_reason"):
                return time.perf_counter() - began
    raise RuntimeError("no answer text came")


async def warm_ttft(
    kind: str, args: argparse.Namespace, model: Path, projector: Path, round_: int, log: Path
) -> tuple[list[float], list[float]]:
    """Times to first token on a warm server (one request answered first), as a client sees it over
    loopback, args.asks of each: a one-image prompt (an image it has not seen), then the same question
    with no image (text it has not seen). Each server keeps what it may of the chat's head (the
    template's text)."""
    port = free_port()
    server = start(server_command(kind, args, model, projector, port, 1), log)
    images, texts = [], []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
            await wait_ready(client, server, 120)
            await first_token(client, request(args.served, png(20_000), QUESTION, 2, stream=True))
            for ask in range(args.asks):
                n = round_ * args.asks + ask
                images.append(
                    await first_token(client, request(args.served, png(30_000 + n), QUESTION, 2, stream=True))
                )
                texts.append(
                    await first_token(client, request(args.served, None, f"{QUESTION} ({n})", 2, stream=True))
                )
            return images, texts
    finally:
        stop(server)


async def clients_at_once(
    kind: str, args: argparse.Namespace, model: Path, projector: Path, images: list[bytes], log: Path
) -> float:
    """Aggregate tokens/s of len(images) clients at once, each one request with its own image (its
    encode, prefill and up to args.tokens answer tokens: both give the same greedy tokens, so the same
    count), on a server with a slot for each."""
    port = free_port()
    server = start(server_command(kind, args, model, projector, port, len(images)), log)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
            await wait_ready(client, server, 120)

            async def one(image: bytes) -> int:
                body = request(args.served, image, QUESTION, args.tokens)
                reply = (await client.post("/v1/chat/completions", json=body)).json()
                return int(reply["usage"]["completion_tokens"])

            await one(png(10_000))  # warm: the first encode allocates the projector's graph
            began = time.perf_counter()
            tokens = sum(await asyncio.gather(*(one(image) for image in images)))
            return tokens / (time.perf_counter() - began)
    finally:
        stop(server)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--projector", choices=("mlp", "gemma3", "idefics3", *QWEN), default="mlp")
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--asks", type=int, default=4, help="measured requests of each kind a server")
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    args = parser.parse_args()
    model = model_file(args.model)
    folder = Path(tempfile.mkdtemp(prefix="bench-vision-"))
    projector = folder / f"{args.projector}.gguf"
    vocab = ["--vocab-out", str(folder / "model.gguf")] if args.projector == "idefics3" else []
    if args.projector in QWEN:  # the model written as qwen2vl: M-RoPE positions
        vocab = ["--mrope-out", str(folder / "model.gguf")]
        SIZES[:] = QWEN_SIZES
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_test_projector.py"), str(projector),
                    "--for", str(model), "--type", args.projector, *vocab],
                   check=True, capture_output=True)  # fmt: skip
    if vocab:  # both run the copy: runner by its path
        model = folder / "model.gguf"
        args.model = str(model)
    args.served = Path(args.model).stem if vocab else args.model  # a file by path is served by its stem
    images = [png(seed) for seed in range(args.images)]
    paths = []
    for i, data in enumerate(images):
        paths.append(folder / f"{i}.png")
        paths[-1].write_bytes(data)
    progress(f"{machine()}; {args.projector} projector, {args.images} images, files in {folder}")

    progress("parity: llama-server")
    theirs = asyncio.run(with_server(args, model, projector, images, folder / "server-parity.log"))
    progress("parity: runner run, one process an image")
    ours = [runner_answer(args.model, p, projector, args.tokens) for p in paths]
    same = sum(a["ids"] == b["ids"] for a, b in zip(ours, theirs, strict=True))
    progress("parity: runner's loop, every image in one batch")
    batch = batched(model, projector, images, args.tokens)
    batch_same = sum(b == a["ids"] for a, b in zip(ours, batch, strict=True))
    progress(f"parity: {same} of {len(ours)} as llama-server's, {batch_same} of {len(batch)} batched")

    progress("time to first token on warm servers, one image and the text alone, interleaved rounds")
    ttft: dict[str, list[float]] = {
        k: [] for k in ("runner", "llama-server", "runner text", "llama-server text")
    }
    for r in range(args.rounds):
        for kind in ("runner", "llama-server"):
            image_s, text_s = asyncio.run(
                warm_ttft(kind, args, model, projector, r, folder / f"t-{kind}-{r}.log")
            )
            ttft[kind].extend(image_s)
            ttft[f"{kind} text"].extend(text_s)

    progress(f"{args.images} clients at once, each its own image, interleaved rounds")
    rates: dict[str, list[float]] = {"runner": [], "llama-server": []}
    for r in range(args.rounds):
        for kind in rates:
            log = folder / f"clients-{kind}-{r}.log"
            rates[kind].append(asyncio.run(clients_at_once(kind, args, model, projector, images, log)))

    print(
        f"# bench_vision: {machine()}; {args.model}, {args.projector} test projector,"
        f" {args.images} PNG images"
    )
    print(f"greedy answers identical to llama-server, token for token: {same} of {len(ours)}"
          f" ({sum(len(a['ids']) for a in ours)} tokens)")  # fmt: skip
    print(
        f"runner's batch of {len(images)} sequences identical to each image alone:"
        f" {batch_same} of {len(batch)}"
    )
    gaps = [
        abs(x - y)
        for a, b in zip(ours, theirs, strict=True)
        for x, y in zip(a["logprobs"], b["logprobs"], strict=False)
    ]
    print(
        f"log-probabilities against llama-server's: largest difference {max(gaps):.1e} ({len(gaps)} tokens)"
    )
    for a, b in zip(ours, theirs, strict=True):
        if a["ids"] != b["ids"]:
            print(f"  differs: runner {a['text']!r} / llama-server {b['text']!r}")
    med = {k: statistics.median(v) for k, v in ttft.items()}
    print(f"TTFT (median of {args.rounds} servers x {args.asks} asks), one image:"
          f" runner {med['runner'] * 1000:.1f} ms,"
          f" llama-server {med['llama-server'] * 1000:.1f} ms; the text alone: runner"
          f" {med['runner text'] * 1000:.1f} ms,"
          f" llama-server {med['llama-server text'] * 1000:.1f} ms")  # fmt: skip
    print(
        target(
            "TTFT runner / llama-server, one image", med["runner"] / med["llama-server"], 1.05, at_least=False
        )
    )
    print(f"TTFT runner / llama-server, the text alone: {med['runner text'] / med['llama-server text']:.2f}")
    agg = {k: statistics.median(v) for k, v in rates.items()}
    print(f"{args.images} clients at once, each its own image (median of {args.rounds}): runner"
          f" {agg['runner']:.1f} tok/s, llama-server {agg['llama-server']:.1f} tok/s")  # fmt: skip
    print(target("aggregate runner / llama-server", agg["runner"] / agg["llama-server"], 1.0, at_least=True))


if __name__ == "__main__":
    main()
