"""What the audio tests share: the peer llama-server, the greedy flags both sides answer with, SmolLM2's
width for test projectors, a seeded WAV, and runner's answer to a clip as JSON."""

from __future__ import annotations

import io
import json
import wave
from pathlib import Path

import numpy as np

from tests.conftest import run_cli

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


def tone(seconds: float, rate: int = 16000, channels: int = 1, seed: int = 1, width: int = 2) -> bytes:
    """A seeded WAV: a 440 Hz tone and some noise, each channel its own."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    x = np.stack(
        [
            0.3 * np.sin(2 * np.pi * (440 + 110 * c) * t) + 0.05 * rng.standard_normal(t.size)
            for c in range(channels)
        ],
        1,
    )
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
