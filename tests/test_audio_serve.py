"""Audio through `runner serve MODEL --mmproj AUDIO-PROJECTOR`, with the real openai client, on a real
server of SmolLM2 and tests/synth.py's random-weight ultravox projector: an `input_audio` part and
`POST /v1/audio/transcriptions` give the pinned llama-server's answers for the same WAV; every bad
clip is a 4xx in the API's own shape and the server goes on; Ollama and Anthropic requests carrying
audio are refused naming the field (their APIs define none)."""

from __future__ import annotations

import base64
import io
import re
import socket
import subprocess
import sys
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.audio_clips import LLAMA_SERVER, llama_server
from tests.helpers import random_png
from tests.serving import THREADS, Server, model_server, openai_client
from tests.synth import write_audio_projector

GREEDY = {"temperature": 0, "repeat_penalty": 1, "presence_penalty": 0, "frequency_penalty": 0}
TOKENS = 8


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


def audio_part(data: bytes, fmt: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def chat_body(content: Any, role: str = "user") -> dict[str, Any]:
    return {"messages": [{"role": role, "content": content}], "max_tokens": TOKENS, **GREEDY}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("audio")
    made = {"ultravox": write_audio_projector(folder / "ultravox.gguf", 576, "ultravox")}
    made["a.wav"] = folder / "a.wav"
    made["a.wav"].write_bytes(tone(3.0))
    return made


@pytest.fixture(scope="module")
def server(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = ["--mmproj", str(files["ultravox"]), "--flash-attn", "off", "--parallel", "1", *THREADS]
    with model_server(tmp_path_factory.mktemp("serve"), *args) as started:
        yield started


def peer_answers(model: Path, projector: Path, wav: bytes, log: Path) -> tuple[dict[str, Any], str]:
    """llama-server's chat answer to an input_audio part and its /v1/audio/transcriptions text."""
    args = ["-m", str(model), "--mmproj", str(projector), "-c", "4096", "-np", "1", "-fa", "off", "-t", "1",
            "--no-webui"]  # fmt: skip
    with llama_server(args, log) as url:
        body = {
            **chat_body([audio_part(wav), {"type": "text", "text": "Transcribe this."}]),
            "logprobs": True,
        }
        chat = httpx.post(
            f"{url}/v1/chat/completions", json={**body, "cache_prompt": False}, timeout=300
        ).json()
        form = {"model": "x", "temperature": "0", "max_tokens": str(TOKENS)}
        heard = httpx.post(
            f"{url}/v1/audio/transcriptions", data=form, files={"file": ("a.wav", wav)}, timeout=300
        )
        return chat, heard.json()["text"]


@pytest.mark.skipif(not LLAMA_SERVER.exists(), reason="the pinned llama-server is not built here")
def test_input_audio_and_transcriptions_answer_as_llama_server(
    server: Server, files: dict[str, Path], smollm2_path: Path, tmp_path: Path
) -> None:
    wav = files["a.wav"].read_bytes()
    chat, heard = peer_answers(smollm2_path, files["ultravox"], wav, tmp_path / "llama-server.log")
    client = openai_client(server)
    content: Any = [audio_part(wav), {"type": "text", "text": "Transcribe this."}]
    ours = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": content}], max_tokens=TOKENS, logprobs=True,
        temperature=0, extra_body={k: v for k, v in GREEDY.items() if k != "temperature"},
    )  # fmt: skip
    theirs = chat["choices"][0]["logprobs"]["content"]
    if chat["choices"][0]["finish_reason"] == "stop":
        theirs = theirs[:-1]  # llama-server scores the end-of-generation token too
    assert [t.token for t in ours.choices[0].logprobs.content] == [t["token"] for t in theirs]
    assert ours.usage.prompt_tokens == chat["usage"]["prompt_tokens"]
    said = client.audio.transcriptions.create(
        model="smollm2", file=("a.wav", wav), temperature=0, extra_body={"max_tokens": TOKENS}
    )
    assert said.text == heard.strip()
    streamed = client.audio.transcriptions.create(
        model="smollm2", file=("a.wav", wav), temperature=0, stream=True, extra_body={"max_tokens": TOKENS}
    )
    events = list(streamed)
    assert [e.type for e in events] == ["transcript.text.delta"] * (len(events) - 1) + [
        "transcript.text.done"
    ]
    assert "".join(e.delta for e in events[:-1]).strip() == events[-1].text == said.text
    text = client.audio.transcriptions.create(
        model="smollm2", file=("a.wav", wav), response_format="text", extra_body={"max_tokens": TOKENS}
    )
    assert str(text).strip() == said.text


def declared_gigabyte(server: Server) -> bytes:
    """The reply to a multipart request whose Content-Length says 1 GB (a few bytes are sent)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as conn:
        conn.sendall(
            b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
            b"boundary=b\r\nContent-Length: 1073741824\r\n\r\n--b\r\n"
        )
        return conn.recv(4096)


def test_bad_clips_are_400s_in_openais_shape(server: Server, files: dict[str, Path]) -> None:
    wav = files["a.wav"].read_bytes()
    http = httpx.Client(base_url=server.url, timeout=120)
    transcriptions = [
        ({"file": ("a.mp3", b"ID3\x04" + bytes(300))}, {}, "file", "MP3"),
        ({"file": ("a.wav", wav[:-500])}, {}, "file", "truncated WAV"),
        ({"file": ("a.png", random_png(1))}, {}, "file", "looks like a PNG image"),
        ({"file": ("e.wav", b"")}, {}, "file", "is empty"),
        ({}, {"model": "smollm2"}, "file", "file: required"),
        ({"file": ("a.wav", wav)}, {"response_format": "srt"}, "response_format", "json, text, verbose_json"),
        ({"file": ("a.wav", wav)}, {"temperature": "hot"}, "temperature", "must be a number"),
    ]
    for upload, form, param, says in transcriptions:
        got = http.post("/v1/audio/transcriptions", files=upload or {"x": ("x", b"")}, data=form)
        error = got.json()["error"]
        assert got.status_code == 400 and error["param"] == param and says in error["message"], got.text
    got = http.post("/v1/audio/transcriptions", json={"file": "a.wav"})
    assert got.status_code == 400 and "multipart/form-data" in got.json()["error"]["message"]
    assert declared_gigabyte(server).startswith(b"HTTP/1.1 413"), "a 1 GB body is refused by its header"
    chats = [
        (chat_body([audio_part(wav[:40])]), "messages[0].content[0].input_audio.data", "truncated WAV"),
        (
            chat_body([{"type": "input_audio", "input_audio": {"data": "!!", "format": "wav"}}]),
            None,
            "base64",
        ),
        (
            chat_body([audio_part(wav, "aac")]),
            "messages[0].content",
            "format must be one of wav, mp3, flac, ogg",
        ),
        (chat_body([audio_part(wav)], role="assistant"), "messages[0].content", "go in user messages"),
    ]
    for body, param, says in chats:
        got = http.post("/v1/chat/completions", json=body)
        error = got.json()["error"]
        assert got.status_code == 400 and says in error["message"], got.text
        assert param is None or error["param"] == param, got.text
    assert http.get("/health").status_code == 200
    client = openai_client(server)
    with pytest.raises(openai.BadRequestError, match="MP3"):
        client.audio.transcriptions.create(model="smollm2", file=("a.mp3", b"ID3\x04" + bytes(300)))


def test_ollama_takes_a_wav_in_images_and_refuses_an_audio_field(
    server: Server, files: dict[str, Path]
) -> None:
    """Ollama's API has no audio field (it drops `audio` and `audios`, ollama#17730); it takes a WAV
    clip in `images` for its audio models (ollama#15427): so does runner, and the answer is the
    OpenAI API's for the same clip and question."""
    wav = files["a.wav"].read_bytes()
    data = base64.b64encode(wav).decode()
    http = httpx.Client(base_url=server.url, timeout=120)
    options = {"temperature": 0, "num_predict": TOKENS, "repeat_penalty": 1}
    message = {"role": "user", "content": "Transcribe this.", "images": [data]}
    got = http.post(
        "/api/chat", json={"model": "smollm2", "stream": False, "messages": [message], "options": options}
    )
    content: Any = [audio_part(wav), {"type": "text", "text": "Transcribe this."}]
    ours = http.post("/v1/chat/completions", json={"model": "smollm2", **chat_body(content)}).json()
    assert got.status_code == 200, got.text
    assert got.json()["message"]["content"] == ours["choices"][0]["message"]["content"]
    assert got.json()["prompt_eval_count"] == ours["usage"]["prompt_tokens"]
    for field in ("audio", "audios"):
        bad = {**message, field: [data]}
        got = http.post("/api/chat", json={"model": "smollm2", "stream": False, "messages": [bad]})
        assert got.status_code == 400 and field in got.json()["error"] and "images" in got.json()["error"]


def test_anthropic_refuses_an_audio_part_naming_it(server: Server, files: dict[str, Path]) -> None:
    data = base64.b64encode(files["a.wav"].read_bytes()).decode()
    http = httpx.Client(base_url=server.url, timeout=120)
    for kind in ("input_audio", "audio"):
        part = {"type": kind, "source": {"type": "base64", "media_type": "audio/wav", "data": data}}
        body = {"model": "smollm2", "max_tokens": 4, "messages": [{"role": "user", "content": [part]}]}
        got = http.post("/v1/messages", json=body)
        error = got.json()["error"]
        assert (
            got.status_code == 400 and error["type"] == "invalid_request_error" and kind in error["message"]
        )
    assert http.get("/health").status_code == 200


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    cut=st.integers(0, 96_000),
    flips=st.lists(st.tuples(st.integers(0, 63), st.integers(0, 255)), max_size=6),
)
def test_fuzzed_clips_never_give_a_5xx(server: Server, files: dict[str, Path], cut: int, flips: list) -> None:
    data = bytearray(files["a.wav"].read_bytes()[: max(0, 96_044 - cut)])
    for at, value in flips:
        if at < len(data):
            data[at] = value
    http = httpx.Client(base_url=server.url, timeout=120)
    got = http.post(
        "/v1/audio/transcriptions", files={"file": ("f.wav", bytes(data))}, data={"max_tokens": "1"}
    )
    assert got.status_code in (200, 400), got.text
    part = audio_part(bytes(data))
    got = http.post("/v1/chat/completions", json={**chat_body([part]), "max_tokens": 1})
    assert got.status_code in (200, 400), got.text


def test_the_docs_examples_run(server: Server, files: dict[str, Path], tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "audio.md").read_text()
    section = page.split("\n## runner serve\n", 1)[1].split("\n## ", 1)[0]
    examples = re.findall(r"```py\n(.*?)```", section, re.DOTALL)
    assert len(examples) == 2
    (tmp_path / "note.wav").write_bytes(files["a.wav"].read_bytes())
    for code in examples:
        code = code.replace("127.0.0.1:8080", server.address).replace('"ultravox"', '"smollm2"')
        code = code.replace("max_tokens=64", "max_tokens=4")
        code = code.replace("file=f)", 'file=f, extra_body={"max_tokens": 4})')
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, timeout=180)
        assert done.returncode == 0, done.stderr.decode()
        assert done.stdout.strip(), code
    [curl] = [line for line in section.splitlines() if line.startswith("curl ")]
    words = curl.replace("127.0.0.1:8080", server.address).split() + ["-F", "max_tokens=4", "-sS", "-f"]
    done = subprocess.run(words, cwd=tmp_path, capture_output=True, timeout=180)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr.decode()


def test_the_model_lists_say_it_takes_audio(server: Server) -> None:
    http = httpx.Client(base_url=server.url, timeout=120)
    [model] = http.get("/v1/models").json()["data"]
    assert model["meta"]["audio"] is True and model["meta"]["vision"] is False
    shown = http.post("/api/show", json={"model": "smollm2"}).json()
    assert "audio" in shown["capabilities"] and "vision" not in shown["capabilities"]


def test_responses_take_an_input_audio_part_as_chat_does(server: Server, files: dict[str, Path]) -> None:
    wav = files["a.wav"].read_bytes()
    client = openai_client(server)
    heard: Any = [audio_part(wav), {"type": "input_text", "text": "Transcribe this."}]
    said = client.responses.create(
        model="smollm2", temperature=0, max_output_tokens=TOKENS, store=False,
        input=[{"role": "user", "content": heard}],
    )  # fmt: skip
    asked: Any = [audio_part(wav), {"type": "text", "text": "Transcribe this."}]
    chat = client.chat.completions.create(
        model="smollm2", temperature=0, max_tokens=TOKENS, messages=[{"role": "user", "content": asked}]
    )
    assert said.output_text and said.output_text == chat.choices[0].message.content
    assert said.usage.input_tokens == chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError, match="MP3"):
        client.responses.create(
            model="smollm2", max_output_tokens=2,
            input=[{"role": "user", "content": [audio_part(b"ID3\x04" + bytes(200), "mp3")]}],
        )  # fmt: skip
