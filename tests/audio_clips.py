"""What the audio tests share: the peer llama-server (started, and its answers to a clip), the greedy
flags both sides answer with, SmolLM2's width for test projectors, a seeded WAV, and runner's answer to
a clip as JSON."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import time
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

from tests.conftest import run_cli
from tests.serving import free_port

LLAMA_SERVER = Path("/tmp/peers/build/bin/llama-server")
GREEDY = (
    "--temperature",
    "0",
    "--repeat-penalty",
    "1",
    "--presence-penalty",
    "0",
    "--frequency-penalty",
    "0",
)
WIDTH = 576  # SmolLM2's embeddings


def samples(seconds: float, rate: int = 16000, channels: int = 1, seed: int = 1) -> np.ndarray:
    """Seeded samples (frames x channels, in [-1, 1]): a 440 Hz tone and some noise, each channel its
    own (a channel c sounds 440 + 110 c Hz)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    return np.stack(
        [
            0.3 * np.sin(2 * np.pi * (440 + 110 * c) * t) + 0.05 * rng.standard_normal(t.size)
            for c in range(channels)
        ],
        1,
    )


def tone(seconds: float, rate: int = 16000, channels: int = 1, seed: int = 1, width: int = 2) -> bytes:
    """A seeded WAV of `samples`."""
    x = samples(seconds, rate, channels, seed)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        if width == 1:
            w.writeframes((x * 127 + 128).astype(np.uint8).tobytes())
        else:
            w.writeframes((x * 32767).astype("<i2").tobytes())
    return out.getvalue()


def runner_answer(projector: Path, wav: Path, tokens: int = 8) -> dict:
    """`runner run --audio` greedy, as JSON with each token's log-probability."""
    done = run_cli(
        "run", "smollm2", "Transcribe this.", "--audio", str(wav), "--mmproj", str(projector), *GREEDY,
        "--flash-attn", "off", "--max-tokens", str(tokens), "--json", "--logprobs", "0", "--no-prompt-cache",
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@contextmanager
def llama_server(args: list[str], log: Path, ready_s: float = 120) -> Iterator[str]:
    """The pinned llama-server with ARGS on a free port, answering /health, for the with block: its
    URL. Its output goes to `log`."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(LLAMA_SERVER), *args, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + ready_s
        while time.monotonic() < end and proc.poll() is None:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        assert proc.poll() is None, log.read_text(errors="replace")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def server_answers(
    model: Path, projector: Path, wav: Path, log: Path, *, flash_attn: str = "off", image: Path | None = None
) -> tuple[dict, str]:
    """llama-server's greedy chat answer to an input_audio part (after an image part, where given, as
    `run --image --audio` orders them), each token scored, and its /v1/audio/transcriptions text."""
    args = ["-m", str(model), "--mmproj", str(projector), "-c", "4096", "-np", "1", "-fa", flash_attn,
            "-t", "2", "--no-webui"]  # fmt: skip
    clip = base64.b64encode(wav.read_bytes()).decode()
    content: list[dict] = [{"type": "input_audio", "input_audio": {"data": clip, "format": "wav"}},
                           {"type": "text", "text": "Transcribe this."}]  # fmt: skip
    if image is not None:
        picture = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
        content.insert(0, {"type": "image_url", "image_url": {"url": picture}})
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0,
            "logprobs": True, "top_logprobs": 1, "cache_prompt": False, "repeat_penalty": 1,
            "presence_penalty": 0, "frequency_penalty": 0}  # fmt: skip
    with llama_server(args, log) as url:
        chat = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).json()
        form = {"model": "x", "temperature": "0", "max_tokens": "8"}
        files = {"file": ("a.wav", wav.read_bytes())}
        heard = httpx.post(f"{url}/v1/audio/transcriptions", data=form, files=files, timeout=300).json()
    return chat, heard["text"]
