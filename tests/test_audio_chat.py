"""Audio in `runner chat`, with tests/synth.py's random-weight ultravox projector on SmolLM2: `/audio
PATH` attaches a WAV clip to the next message, answered as `runner run --audio` answers it and kept
in the store by its sha256, size and path as an image is; `--resume` reads it again, or says why
not; a bad clip is one line and nothing attached."""

from __future__ import annotations

import hashlib
import io
import re
import wave
from pathlib import Path

import numpy as np
import pytest

from runner.images import ImageRef
from tests.conftest import run_cli
from tests.helpers import GREEDY, conversations
from tests.synth import write_audio_projector

SAME = [*GREEDY, "--max-tokens", "8", "--flash-attn", "off"]


def tone(seconds: float, seed: int = 1) -> bytes:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(t.size)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((x * 32767).astype("<i2").tobytes())
    return out.getvalue()


@pytest.fixture(scope="module")
def ultravox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_audio_projector(tmp_path_factory.mktemp("projector") / "ultravox.gguf", 576, "ultravox")


@pytest.fixture
def note(tmp_path: Path) -> Path:
    path = tmp_path / "note.wav"
    path.write_bytes(tone(2.0))
    return path


def chat(lines: str, *args: str):
    return run_cli("chat", "smollm2", *SAME, *args, input=lines.encode(), timeout=300)


def evaluated(stderr: bytes) -> tuple[int, int]:
    found = re.findall(rb"prompt (\d+) tokens(?:: (\d+) evaluated|, all evaluated)", stderr)
    assert found, stderr
    prompt, done = found[-1]
    return int(prompt), int(done or prompt)


def test_an_attached_clip_is_answered_as_run_answers_it_and_kept(ultravox: Path, note: Path) -> None:
    done = chat(f"/audio {note}\nWhat is said?\nAnd again?\n/stats\n", "--mmproj", str(ultravox))
    assert done.returncode == 0, done.stderr
    assert b"attached note.wav (2.0 s of audio)" in done.stderr
    alone = run_cli("run", "smollm2", "What is said?", "--audio", str(note), "--mmproj", str(ultravox), *SAME)
    assert alone.returncode == 0, alone.stderr
    first = done.stdout.decode().split("\n\n")[0].strip()
    assert first and first == alone.stdout.decode().strip()
    prompt, new = evaluated(done.stderr)  # the second turn keeps the clip's window: its text alone evaluated
    assert new <= 30 and prompt - new > 187, done.stderr
    [conversation] = conversations()
    ref = ImageRef(hashlib.sha256(note.read_bytes()).hexdigest(), note.stat().st_size, str(note))
    assert [m.images for m in conversation.messages] == [(ref,), (), (), ()]
    resumed = run_cli("chat", "--resume", "--mmproj", str(ultravox), *SAME, input=b"/show\n")
    assert b"this conversation refers to 1 image: note.wav (read again)" in resumed.stderr
    note.write_bytes(tone(2.0, seed=2))
    changed = run_cli("chat", "--resume", "--mmproj", str(ultravox), *SAME, input=b"/show\n")
    assert f"{note}: changed since it was attached (its sha256 differs)".encode() in changed.stderr


def test_a_bad_clip_is_one_line_and_nothing_attached(ultravox: Path, tmp_path: Path) -> None:
    mp3 = tmp_path / "a.mp3"
    mp3.write_bytes(b"ID3\x04" + bytes(100))
    cut = tmp_path / "cut.wav"
    cut.write_bytes(tone(1.0)[:-2000])
    done = chat(f"/audio {mp3}\n/audio {cut}\n/image\n", "--mmproj", str(ultravox))
    assert done.returncode == 2, done.stderr  # a piped chat says its refused lines, then exits 2
    assert b"MP3" in done.stderr and b"truncated WAV" in done.stderr and b"Traceback" not in done.stderr
    assert b"no image attached" in done.stderr
