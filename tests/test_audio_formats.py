"""Audio beyond WAV: MP3, FLAC and Ogg Vorbis decoded by miniaudio (runner.audio_codecs), the decoder
llama-server's libmtmd helper uses, so `runner run --audio`, `runner transcribe` and `runner serve` give
the pinned llama-server's greedy answer token for token on the same file (SmolLM2 and tests/synth.py's
random-weight ultravox projector: the answers mean nothing; the same samples give the same tokens).
Each format's header is read and bounded before a frame is decoded; truncated, lying and unknown clips
are one line and exit 2 on the CLI, a 400 on the server. Test clips are written by soundfile (its
wheel's libsndfile encodes MP3 with LAME, FLAC and Vorbis), seeded."""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import soundfile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner import audio_codecs
from runner.audio import load_audio
from runner.errors import AudioError
from tests.audio_clips import GREEDY, LLAMA_SERVER, llama_server, samples
from tests.conftest import run_cli
from tests.serving import NEAR_TIE, THREADS, Server, model_server, openai_client
from tests.synth import write_audio_projector

SAMPLING = {"temperature": 0, "repeat_penalty": 1, "presence_penalty": 0, "frequency_penalty": 0}
TOKENS = 8
ENCODINGS = {"mp3": ("MP3", "MPEG_LAYER_III"), "flac": ("FLAC", "PCM_16"), "ogg": ("OGG", "VORBIS")}


def clip(ext: str, seconds: float = 3.0, rate: int = 16000, channels: int = 1, seed: int = 1) -> bytes:
    """A seeded clip in `ext`'s format: a tone and some noise, each channel its own."""
    x = samples(seconds, rate, channels, seed).astype(np.float32)
    out = io.BytesIO()
    fmt, subtype = ENCODINGS[ext] if ext != "opus" else ("OGG", "OPUS")
    soundfile.write(out, x, rate, format=fmt, subtype=subtype)
    return out.getvalue()


def as_llama_server(data: bytes, fmt: str, rate: int = 16000) -> np.ndarray:
    """llama-server's recipe for the samples it hands libmtmd (mtmd-helper.cpp decode_audio_from_buf),
    through this miniaudio build: one decoder, f32, one channel, the projector's rate, the header's
    length scaled to it. Runner decodes at the clip's own rate, then resamples when the projector is
    known: the same samples, bit for bit."""
    head = audio_codecs.header(data, fmt)
    frames = audio_codecs.frames_at(rate, head.rate, head.frames)
    return np.frombuffer(audio_codecs.decode(data, fmt, rate, frames, pad=frames), "<f4")


def crashing_ogg() -> bytes:
    """An Ogg Vorbis clip with one byte of its identification header changed: stb_vorbis (miniaudio's
    Vorbis decoder, as the wheel builds it) segfaults opening it. Found by fuzzing."""
    data = bytearray(clip("ogg", 1.0))
    data[165] = 104
    return bytes(data)


def xing_says(data: bytes, frames: int) -> bytes:
    """The MP3 with its Xing header's frame count replaced by `frames`."""
    at = data.index(b"Xing")
    assert data[at + 7] & 1, "a frame count is there"
    return data[: at + 8] + frames.to_bytes(4, "big") + data[at + 12 :]


def without_xing(data: bytes) -> bytes:
    """The MP3 without its Xing frame: a length found only by counting frames."""
    start = audio_codecs.id3_end(data)
    return data[:start] + data[start + audio_codecs.mpeg_frame_bytes(data[start : start + 4]) :]


# -- decoding: in process ----------------------------------------------------------------------------


FAST = pytest.mark.fast  # an Ogg is read in a child process (runner.audio_codecs.APART): slow


@pytest.mark.parametrize(
    ("ext", "rate", "channels", "fmt"),
    [pytest.param("mp3", 16000, 1, "MP3", marks=FAST), pytest.param("flac", 16000, 1, "FLAC", marks=FAST),
     pytest.param("mp3", 44100, 2, "MP3", marks=FAST), pytest.param("flac", 48000, 2, "FLAC", marks=FAST),
     ("ogg", 16000, 1, "Ogg Vorbis"), ("ogg", 22050, 2, "Ogg Vorbis")],
)  # fmt: skip
def test_each_format_decodes_as_llama_servers_recipe_does(
    ext: str, rate: int, channels: int, fmt: str
) -> None:
    data = clip(ext, 1.5, rate, channels)
    audio = load_audio(data, name=f"a.{ext}")
    assert audio.format == fmt and audio.rate == rate and audio.channels == channels
    assert audio.seconds == 1.5  # LAME's delay and padding taken off, as its Info tag says
    ours = np.frombuffer(audio.at(16000), "<f4")
    theirs = as_llama_server(data, fmt)
    assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
    assert 0.1 < np.abs(ours).max() <= 1.0


@pytest.mark.fast
def test_a_resampled_wav_is_resampled_as_llama_servers_recipe_does() -> None:
    """A WAV off the projector's rate: numpy's samples, then miniaudio's resampler (llama-server's)."""
    out = io.BytesIO()
    x = np.random.default_rng(3).uniform(-0.5, 0.5, (44100, 2)).astype(np.float32)
    soundfile.write(out, x, 44100, format="WAV", subtype="PCM_16")
    data = out.getvalue()
    assert np.array_equal(
        np.frombuffer(load_audio(data, name="s.wav").at(16000), "<f4"), as_llama_server(data, "WAV")
    )


@pytest.mark.fast
def test_an_mp3_without_a_xing_header_is_counted_frame_by_frame() -> None:
    data = without_xing(clip("mp3", 2.0))
    assert b"Xing" not in data[:2000]
    audio = load_audio(data, name="n.mp3")
    assert 2.0 <= audio.seconds < 2.2  # the encoder's delay and padding are samples now


def flac_at_0_hz() -> bytes:
    """A FLAC whose STREAMINFO says 0 Hz, 1 channel, 16 bits, 1,000 samples (42 bytes)."""
    packed = (0 << 44 | 0 << 41 | 15 << 36 | 1000).to_bytes(8, "big")
    info = (4096).to_bytes(2, "big") * 2 + bytes(6) + packed + bytes(16)
    return b"fLaC" + bytes([0x80, 0, 0, len(info)]) + info


def test_a_96_khz_flac_decodes_at_48_khz_and_an_ogg_child_ignores_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compressed clip's samples are bounded by a rate of 48 kHz (a FLAC of silence at 384 kHz is a
    few kB and 0.9 GB at its own rate); the Ogg decoder's child does not import from the working
    directory (a json.py there)."""
    high = load_audio(clip("flac", seconds=1.0, rate=96000), name="hi.flac")
    assert high.rate == 48000 and abs(len(high.samples) // 4 - 48000) <= 1  # miniaudio counts one more
    (tmp_path / "json.py").write_text("raise SystemExit('the working directory was imported')\n")
    monkeypatch.chdir(tmp_path)
    assert load_audio(clip("ogg", seconds=1.0), name="c.ogg").rate == 16000


BAD_CLIPS = [  # (the bytes from MP3, what the refusal says)
    (lambda mp3: mp3[: len(mp3) - 150], "is a truncated MP3 file: its last frame is cut short"),
    (lambda mp3: xing_says(mp3, 4_000_000), "is 2400.0 minutes long, over the 10.0 minutes"),
    (lambda mp3: xing_says(mp3, 200), "is a truncated MP3 file: its header says"),
    (lambda mp3: JUNK_AFTER_ID3, "ID3 tag followed by no MP3"),
    (lambda mp3: b"ID3\x04\x00\x00\x00\x00\x00\x20" + bytes(32), "ID3 tag with no audio after it"),
    (lambda mp3: without_xing(mp3)[:-100], "is a truncated MP3 file: its last frame is cut short"),
    (lambda mp3: b"\xff\xf1\x50\x80" + bytes(300), "looks like AAC audio (ADTS)"),
    (lambda mp3: clip("flac")[:-2000], "is a truncated FLAC file: its header says 48,000 frames"),
    (lambda mp3: clip("ogg")[:-1500], "is a truncated Ogg file: its last page is cut short or missing"),
    (lambda mp3: clip("opus", rate=48000), "looks like Ogg Opus audio, which runner does not decode"),
    (lambda mp3: b"fLaC" + bytes(60), "is not FLAC runner can decode"),
    (lambda mp3: flac_at_0_hz(), "is not FLAC runner can decode"),  # dr_flac takes it, then divides by 0
    (lambda mp3: crashing_ogg(), "is Ogg Vorbis whose decoder fails on it (a malformed stream)"),
    (lambda mp3: b"OggS" + bytes(60), "is an Ogg file whose stream is not Vorbis"),
]


@pytest.mark.parametrize(
    ("make", "problem"),
    [pytest.param(m, p, marks=() if "decoder fails" in p else FAST) for m, p in BAD_CLIPS],
)
def test_bad_clips_are_one_line(make: Any, problem: str) -> None:
    with pytest.raises(AudioError) as refused:
        load_audio(make(MP3), name="c.mp3")
    assert problem in str(refused.value) and "\n" not in str(refused.value), refused.value


@pytest.mark.fast
def test_an_hour_long_header_is_refused_before_a_frame_is_decoded() -> None:
    lying = xing_says(MP3, 3_000_000)  # 3M frames of 576 samples: 30 hours
    start = time.perf_counter()
    with pytest.raises(AudioError, match="is 1800.0 minutes long"):
        load_audio(lying, name="h.mp3")
    assert time.perf_counter() - start < 0.05  # llama-server would size a buffer for 30 hours: 6.9 GB
    with pytest.raises(AudioError, match="is 3.0 s long, over the 2.0 s"):
        load_audio(MP3, name="a.mp3", max_seconds=2)


MP3 = clip("mp3")
JUNK_AFTER_ID3 = b"ID3\x04\x00\x00\x00\x00\x00\x20" + bytes(32) + b"no frames here" * 20
FUZZED = {"mp3": MP3, "flac": clip("flac", 1.0), "ogg": clip("ogg", 1.0)}


@pytest.mark.fast
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ext=st.sampled_from(["flac", "mp3"]),
    cut=st.integers(0, 4000),
    flips=st.lists(st.tuples(st.integers(0, 8000), st.integers(0, 255)), max_size=10),
)
def test_fuzzed_mp3_and_flac_decode_or_are_refused_in_one_line(
    ext: str, cut: int, flips: list[tuple[int, int]]
) -> None:
    """A real clip cut and flipped (its headers most often): finite samples, or an AudioError."""
    check_fuzzed(ext, cut, flips)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cut=st.integers(0, 4000),
    flips=st.lists(st.tuples(st.integers(0, 8000), st.integers(0, 255)), max_size=10),
)
def test_fuzzed_oggs_decode_or_are_refused_in_one_line(cut: int, flips: list[tuple[int, int]]) -> None:
    """The same for Ogg, whose decoder may crash: it crashes a child process (runner.audio_codecs.APART),
    not this one."""
    check_fuzzed("ogg", cut, flips)


def check_fuzzed(ext: str, cut: int, flips: list[tuple[int, int]]) -> None:
    data = bytearray(FUZZED[ext])
    for at, value in flips:
        data[at % 200 if at % 2 else at % len(data)] = value
    data = data[: max(0, len(data) - cut)]
    try:
        audio = load_audio(bytes(data), name="fuzz", max_seconds=5)
    except AudioError as exc:
        assert "\n" not in str(exc)
        return
    assert audio.frames > 0 and np.isfinite(np.frombuffer(audio.at(16000), "<f4")).all()


# -- through the loop, against llama-server ----------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("formats")
    made = {"ultravox": write_audio_projector(folder / "ultravox.gguf", 576, "ultravox")}
    for name, data in (
        ("a.mp3", MP3),
        ("a.flac", clip("flac")),
        ("a.ogg", clip("ogg")),
        ("s44.mp3", clip("mp3", 2.0, 44100, 2, seed=2)),
    ):
        made[name] = folder / name
        made[name].write_bytes(data)
    # llama-server's helper takes WAV, MP3 and FLAC (mtmd-helper.cpp is_audio_file), not Ogg: it hears
    # the Ogg clip as the float WAV of the samples miniaudio decodes from it
    made["ogg.wav"] = folder / "ogg.wav"
    samples = as_llama_server(made["a.ogg"].read_bytes(), "Ogg Vorbis")
    soundfile.write(made["ogg.wav"], samples, 16000, format="WAV", subtype="FLOAT")
    return made


@pytest.fixture(scope="module")
def peer(
    files: dict[str, Path], smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if not LLAMA_SERVER.exists():
        pytest.skip("the pinned llama-server is not built here")
    log = tmp_path_factory.mktemp("peer") / "llama-server.log"
    args = ["-m", str(smollm2_path), "--mmproj", str(files["ultravox"]), "-c", "4096", "-np", "1",
            "-fa", "off", "-t", "2", "--no-webui"]  # fmt: skip
    with llama_server(args, log) as url:
        yield url


def audio_part(data: bytes, fmt: str) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def peer_chat(url: str, data: bytes, fmt: str) -> tuple[list[int], list[str], int]:
    """llama-server's greedy answer (token ids, and pieces) and prompt tokens for an input_audio part."""
    content = [audio_part(data, fmt), {"type": "text", "text": "Transcribe this."}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": TOKENS, "logprobs": True,
            "top_logprobs": 1, "cache_prompt": False, **SAMPLING}  # fmt: skip
    chat = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).json()
    theirs = chat["choices"][0]["logprobs"]["content"]
    if chat["choices"][0]["finish_reason"] == "stop":
        theirs = theirs[:-1]  # llama-server scores the end-of-generation token too; runner does not
    return [t["id"] for t in theirs], [t["token"] for t in theirs], chat["usage"]["prompt_tokens"]


def same_unless_near_tie(ours: list[dict[str, Any]], theirs: list[Any]) -> bool:
    """Runner's answer (--json --logprobs 2) against llama-server's token ids for an MP3: the same, or
    parting where llama-server's token is runner's runner-up by less than NEAR_TIE. The miniaudio wheel
    is compiled with -ffast-math, so its MP3 synthesis rounds a few samples one 16-bit step apart from
    llama-server's build (measured: 38 of 48,000 in a.mp3); a random-weight projector turns that into a
    near tie at most. Anywhere else, an AssertionError. Never assert its value."""
    ids = [t["id"] for t in ours]
    k = next((j for j, (a, b) in enumerate(zip(ids, theirs, strict=True)) if a != b), None)
    if k is None:
        return True
    best, second = ours[k]["top_logprobs"][:2]
    assert second["id"] == theirs[k] and best["logprob"] - second["logprob"] < NEAR_TIE, (k, ours[k], theirs)
    return False


def peer_transcription(url: str, name: str, data: bytes) -> str:
    form = {"model": "x", "temperature": "0", "max_tokens": str(TOKENS)}
    said = httpx.post(f"{url}/v1/audio/transcriptions", data=form, files={"file": (name, data)}, timeout=300)
    return said.json()["text"].strip()


@pytest.mark.parametrize(
    ("name", "peer_file"),
    [("a.mp3", "a.mp3"), ("a.flac", "a.flac"), ("a.ogg", "ogg.wav"), ("s44.mp3", "s44.mp3")],
)
def test_run_audio_gives_llama_servers_answer(
    files: dict[str, Path], peer: str, name: str, peer_file: str
) -> None:
    done = run_cli(
        "run", "smollm2", "Transcribe this.", "--audio", str(files[name]), "--mmproj", str(files["ultravox"]),
        *GREEDY, "--flash-attn", "off", "--max-tokens", str(TOKENS), "--json", "--logprobs", "2",
        "--no-prompt-cache", timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ours = json.loads(done.stdout)
    fmt = "wav" if peer_file.endswith(".wav") else peer_file.rsplit(".", 1)[1]
    ids, _, prompt_tokens = peer_chat(peer, files[peer_file].read_bytes(), fmt)
    assert ours["usage"]["prompt_tokens"] == prompt_tokens and len(ids) == TOKENS
    if name.endswith(".mp3"):
        same_unless_near_tie(ours["logprobs"], ids)
    else:  # FLAC: llama-server's very samples; Ogg: it hears runner's, as a float WAV
        assert [t["id"] for t in ours["logprobs"]] == ids


def test_transcribe_an_mp3_as_llama_server_does(files: dict[str, Path], peer: str) -> None:
    done = run_cli("transcribe", "smollm2", str(files["a.mp3"]), "--mmproj", str(files["ultravox"]),
                   "--max-tokens", str(TOKENS), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == peer_transcription(peer, "a.mp3", MP3)


def test_bad_clips_and_max_audio_seconds_are_one_line_and_exit_2(
    files: dict[str, Path], tmp_path: Path
) -> None:
    cut, hours, junk = tmp_path / "cut.mp3", tmp_path / "hours.mp3", tmp_path / "junk.mp3"
    cut.write_bytes(MP3[:-150])
    hours.write_bytes(xing_says(MP3, 10_000_000))
    junk.write_bytes(JUNK_AFTER_ID3)
    uv = str(files["ultravox"])
    cases = [
        (("run", "smollm2", "Hi", "--audio", str(cut), "--mmproj", uv), "truncated MP3"),
        (("run", "smollm2", "Hi", "--audio", str(hours), "--mmproj", uv), "over the 10.0 minutes"),
        (("run", "smollm2", "Hi", "--audio", str(junk), "--mmproj", uv), "ID3 tag followed by no MP3"),
        (("run", "smollm2", "Hi", "--audio", str(files["a.mp3"]), "--mmproj", uv, "--max-audio-seconds", "2"),
         "is 3.0 s long, over the 2.0 s a clip may be"),
        (("transcribe", "smollm2", str(hours), "--mmproj", uv), "over the 10.0 minutes"),
    ]  # fmt: skip
    for args, said in cases:
        done = run_cli(*args, "--max-tokens", "2", timeout=300)
        err = done.stderr.decode()
        assert done.returncode == 2 and done.stdout == b"", (args, err)
        assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, (args, err)


def test_input_rows_bound_their_clips_by_max_audio_seconds(files: dict[str, Path], tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "Transcribe this.", "audio": [str(files["a.mp3"])]}) + "\n")
    done = run_cli("run", "smollm2", "--input", str(rows), "--mmproj", str(files["ultravox"]), "--jsonl",
                   "--max-tokens", "2", "--max-audio-seconds", "2", timeout=300)  # fmt: skip
    [row] = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert "a.mp3: is 3.0 s long, over the 2.0 s a clip may be" in row["error"], row


def test_chat_bounds_a_clip_by_max_audio_seconds(files: dict[str, Path]) -> None:
    lines = f"/audio {files['a.mp3']}\n/bye\n".encode()
    uv = str(files["ultravox"])
    done = run_cli("chat", "smollm2", "--mmproj", uv, "--max-audio-seconds", "2", "--no-save", input=lines,
                   timeout=300)  # fmt: skip
    err = done.stderr.decode()
    assert "a.mp3: is 3.0 s long, over the 2.0 s a clip may be" in err, err
    done = run_cli("chat", "smollm2", "--mmproj", uv, "--no-save", input=lines, timeout=300)
    assert "attached a.mp3 (3.0 s of audio)" in done.stderr.decode(), done.stderr.decode()


# -- runner serve ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = ["--mmproj", str(files["ultravox"]), "--flash-attn", "off", "--parallel", "1", *THREADS]
    with model_server(tmp_path_factory.mktemp("serve"), *args) as started:
        yield started


def test_serve_takes_an_mp3_as_llama_server_does(server: Server, peer: str) -> None:
    client = openai_client(server)
    content: Any = [audio_part(MP3, "mp3"), {"type": "text", "text": "Transcribe this."}]
    ours = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": content}], max_tokens=TOKENS, logprobs=True,
        top_logprobs=2, temperature=0, extra_body={k: v for k, v in SAMPLING.items() if k != "temperature"},
    )  # fmt: skip
    _, pieces, prompt_tokens = peer_chat(peer, MP3, "mp3")
    scored = [
        {"id": t.token, "top_logprobs": [{"id": a.token, "logprob": a.logprob} for a in t.top_logprobs]}
        for t in ours.choices[0].logprobs.content
    ]
    assert ours.usage.prompt_tokens == prompt_tokens and len(scored) == len(pieces) == TOKENS
    same_unless_near_tie(scored, pieces)  # pieces for ids: the client's logprobs name no ids
    said = client.audio.transcriptions.create(
        model="smollm2", file=("a.mp3", MP3), temperature=0, extra_body={"max_tokens": TOKENS}
    )
    assert said.text == peer_transcription(peer, "a.mp3", MP3)


def test_serve_refuses_bad_clips_with_a_400_and_goes_on(server: Server) -> None:
    client = openai_client(server)
    http = httpx.Client(base_url=server.url, timeout=120)
    for data, says in (
        (MP3[:-150], "truncated MP3"),
        (xing_says(MP3, 10_000_000), "over the 10.0 minutes"),
        (JUNK_AFTER_ID3, "ID3 tag followed by no MP3"),
        (crashing_ogg(), "whose decoder fails on it"),  # a segfault in a child, not in the server
    ):
        with pytest.raises(openai.BadRequestError, match=says):
            client.audio.transcriptions.create(model="smollm2", file=("a.mp3", data))
        body = {"messages": [{"role": "user", "content": [audio_part(data, "mp3")]}], "max_tokens": 2}
        got = http.post("/v1/chat/completions", json=body)
        error = got.json()["error"]
        assert got.status_code == 400 and says in error["message"], got.text
        assert error["param"] == "messages[0].content[0].input_audio.data"
    assert http.get("/health").status_code == 200
