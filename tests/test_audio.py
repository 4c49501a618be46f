"""Audio in: WAV bytes decoded and bounded (runner.audio), audio projectors checked before libmtmd
opens them (runner.gguf.audio_projector), and clips through the one loop: `runner run --audio` and
`runner transcribe` give llama-server --mmproj's greedy answer token for token, on SmolLM2 with the
random-weight audio projectors of tests/synth.py (answers mean nothing; the same input gives the
same tokens). Every bad input is one line and exit 2."""

from __future__ import annotations

import io
import json
import re
import struct
import wave
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.audio import MAX_AUDIO_SECONDS, load_audio
from runner.engine.batch import run_batch
from runner.engine.engine import Engine
from runner.engine.prompt import Prompt, render_prompt
from runner.engine.request import Request
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.template import Message
from runner.errors import AudioError, InvalidModelFile
from runner.gguf import read_header
from runner.gguf.audio_projector import check_audio_projector
from runner.gguf.projector import read_key_types
from tests.audio_clips import GREEDY, LLAMA_SERVER, WIDTH, runner_answer, server_answers, tone
from tests.conftest import run_cli
from tests.helpers import random_png
from tests.synth import audio_projector_spec, write_audio_projector


def float_wav(samples: np.ndarray, rate: int = 16000) -> bytes:
    data = samples.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = (
        b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    )
    return b"RIFF" + struct.pack("<I", len(body)) + body


# -- decoding: pure functions on hand-made bytes ----------------------------------------------------


@pytest.mark.fast
def test_a_16_bit_wav_becomes_the_samples_miniaudio_gives() -> None:
    data = tone(0.5)
    clip = load_audio(data, name="a.wav")
    with wave.open(io.BytesIO(data)) as w:
        ints = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    assert clip.rate == 16000 and clip.frames == 8000 and clip.seconds == 0.5
    assert np.array_equal(np.frombuffer(clip.samples, "<f4"), ints.astype(np.float32) / 32768)
    assert clip.at(16000) is clip.samples  # at the projector's rate: as they are


@pytest.mark.fast
def test_stereo_at_44k_is_mixed_to_mono_and_resampled() -> None:
    clip = load_audio(tone(1.0, rate=44100, channels=2), name="s.wav")
    assert clip.channels == 2 and clip.rate == 44100 and clip.frames == 44100
    at16 = np.frombuffer(clip.at(16000), "<f4")
    assert len(at16) == 16000 and np.isfinite(at16).all() and 0.1 < np.abs(at16).max() <= 1.0


@pytest.mark.fast
def test_8_bit_and_float_wavs_decode() -> None:
    assert load_audio(tone(0.2, width=1), name="u8.wav").frames == 3200
    x = np.linspace(-1, 1, 1600, dtype=np.float32)
    assert np.array_equal(np.frombuffer(load_audio(float_wav(x), name="f.wav").samples, "<f4"), x)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"", "is empty"),
        (random_png(1), "looks like a PNG image"),
        (b"ID3\x04\x00" + bytes(100), "MP3"),
        (b"\xff\xfb\x90\x00" + bytes(100), "MP3"),
        (b"fLaC" + bytes(100), "FLAC"),
        (b"OggS" + bytes(100), "Ogg"),
        (b"just some words, not audio", "looks like text"),
        (tone(1.0)[:-5000], "truncated WAV"),
        (tone(1.0)[:30], "truncated WAV"),
        (tone(0.0), "holds no audio"),
        (float_wav(np.array([0.1, np.nan] * 400)), "not finite"),
    ],
)
def test_bad_audio_is_one_line(data: bytes, problem: str) -> None:
    with pytest.raises(AudioError) as caught:
        load_audio(data, name="x")
    assert problem in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.fast
def test_a_two_hour_header_is_refused_before_decoding() -> None:
    data = bytearray(tone(0.1))
    at = data.index(b"data")
    struct.pack_into("<I", data, at + 4, 2 * 3600 * 16000 * 2)  # 2 hours of 16-bit mono, 3 KB there
    with pytest.raises(AudioError, match="is 120.0 minutes long, over the 10.0 minutes"):
        load_audio(bytes(data), name="long.wav")
    with pytest.raises(AudioError, match="over the 100 bytes"):
        load_audio(tone(0.1), name="big.wav", max_bytes=100)
    assert MAX_AUDIO_SECONDS == 600


# -- projector files: checked before libmtmd opens them ----------------------------------------------


def _spec_file(tmp_path: Path, name: str, edit=None, **kw) -> Path:
    keys, tensors = audio_projector_spec(kw.pop("kind", "ultravox"), WIDTH, **kw)
    if edit is not None:
        edit(keys, tensors)
    return write_audio_projector(tmp_path / f"{name}.gguf", WIDTH, spec=(keys, tensors))


def _check(path: Path):
    header = read_header(path)
    return check_audio_projector(header, read_key_types(path), text_n_embd=WIDTH)


@pytest.mark.fast
@pytest.mark.parametrize("kind", ["ultravox", "voxtral", "qwen2a"])
def test_the_synthetic_projectors_pass_and_say_what_a_clip_costs(tmp_path: Path, kind: str) -> None:
    info = _check(_spec_file(tmp_path, kind, kind=kind))
    # 3000 mel frames a window, halved by the conv: stacked by 8 (ultravox), by 4 and pooled (voxtral),
    # pooled (qwen2a): what llama-server's prompt counts
    assert info.window_tokens == {"ultravox": 187, "voxtral": 187, "qwen2a": 750}[kind]
    assert (
        info.windows(3.0) == 1 and info.windows(30.0) == 2 and info.clip_tokens(60) == 3 * info.window_tokens
    )


def _drop(name: str):
    return lambda k, t: t.pop(name)


def _set_key(key: str, value, vtype):
    return lambda k, t: k.__setitem__(key, (value, vtype))


@pytest.mark.fast
@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_drop("a.position_embd.weight"), "no tensor a.position_embd.weight"),
        (
            lambda k, t: t.__setitem__("a.position_embd.weight", t["a.position_embd.weight"][:1000]),
            "1500 or more",
        ),
        (_set_key("clip.audio.num_mel_bins", 128.0, "f32"), "num_mel_bins is f32"),
        (_set_key("clip.audio.num_mel_bins", 80, "u32"), "a.conv1d.1.weight has shape"),
        (_set_key("clip.audio.attention.layer_norm_epsilon", 1e-5, "f64"), "epsilon is f64"),
        (lambda k, t: t.__setitem__("a.blk.0.attn_k.bias", t["a.blk.0.attn_q.bias"]), "attn_k.bias"),
        (_drop("a.blk.1.attn_v.bias"), "no tensor a.blk.1.attn_v.bias"),
        (
            lambda k, t: t.__setitem__("a.conv1d.1.bias", t["a.conv1d.1.bias"][:, 0]),
            "a.conv1d.1.bias has shape",
        ),
        (
            lambda k, t: t.__setitem__("mm.a.mlp.2.weight", t["mm.a.mlp.2.weight"].T.copy()),
            "mm.a.mlp.2.weight",
        ),
        (_set_key("clip.projector_type", "whisper-of-my-own", "str"), "not one runner takes audio through"),
    ],
)
def test_a_malformed_projector_is_one_line(tmp_path: Path, edit, problem: str) -> None:
    from gguf import GGUFValueType

    TYPES = {"f32": GGUFValueType.FLOAT32, "f64": GGUFValueType.FLOAT64, "u32": GGUFValueType.UINT32,
             "str": GGUFValueType.STRING}  # fmt: skip

    def typed(keys, tensors):
        edit(keys, tensors)
        for key, (value, vtype) in list(keys.items()):
            if isinstance(vtype, str):
                keys[key] = (value, TYPES[vtype])

    with pytest.raises(InvalidModelFile) as caught:
        _check(_spec_file(tmp_path, "bad", typed))
    assert problem in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.fast
def test_a_width_whose_frame_stacking_is_a_row_off_is_refused(tmp_path: Path) -> None:
    """build_stack's GGML_PAD is a bit mask: ultravox (8 frames a row) at widths 32, 48, 64 and 96
    aborts llama-server at the first clip (measured: "expected output 187 tokens, got 188"); 40 and 80
    do not, nor whisper-large's 1280; voxtral's 4 divides a window's 1500 rows exactly."""
    from runner.gguf.audio_projector import stacked_rows

    assert [stacked_rows(e, 8) for e in (32, 40, 48, 64, 80, 96, 768, 1280)] == [
        188,
        187,
        188,
        188,
        187,
        188,
        188,
        187,
    ]
    for width in (32, 48):
        with pytest.raises(InvalidModelFile, match="gives? 188 rows a window where it expects 187"):
            _check(_spec_file(tmp_path, f"w{width}", width=width))
    assert _check(_spec_file(tmp_path, "w80", width=80)).width == 80
    assert _check(_spec_file(tmp_path, "v32", kind="voxtral", width=32)).width == 32
    assert _check(_spec_file(tmp_path, "q32", kind="qwen2a", width=32)).width == 32  # no stacking


# -- through the loop, against llama-server ----------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("audio")
    made = {
        kind: write_audio_projector(folder / f"{kind}.gguf", WIDTH, kind)
        for kind in ("ultravox", "voxtral", "qwen2a")
    }
    for name, data in (("a.wav", tone(3.0)), ("b.wav", tone(2.0, seed=2)), ("s44.wav", tone(2.0, 44100, 2))):
        made[name] = folder / name
        made[name].write_bytes(data)
    return made


@pytest.mark.skipif(not LLAMA_SERVER.exists(), reason="the pinned llama-server is not built here")
@pytest.mark.parametrize("kind", ["ultravox", "voxtral"])
def test_run_audio_and_transcribe_give_llama_servers_answer(
    files: dict[str, Path], smollm2_path: Path, tmp_path: Path, kind: str
) -> None:
    ours = runner_answer(files[kind], files["a.wav"])
    chat, heard = server_answers(smollm2_path, files[kind], files["a.wav"], tmp_path / "llama-server.log")
    theirs = chat["choices"][0]["logprobs"]["content"]
    if chat["choices"][0]["finish_reason"] == "stop":
        theirs = theirs[:-1]  # llama-server scores the end-of-generation token too; runner does not
    assert [t["id"] for t in ours["logprobs"]] == [t["id"] for t in theirs]
    assert ours["usage"]["prompt_tokens"] == chat["usage"]["prompt_tokens"]
    done = run_cli(
        "transcribe",
        "smollm2",
        str(files["a.wav"]),
        "--mmproj",
        str(files[kind]),
        "--max-tokens",
        "8",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == heard.strip()


def test_transcribe_several_files_and_stdin(files: dict[str, Path]) -> None:
    uv = str(files["ultravox"])
    done = run_cli("transcribe", "smollm2", str(files["a.wav"]), "-", "--mmproj", uv, "--max-tokens", "4",
                   "--jsonl",
                   input=files["s44.wav"].read_bytes(), timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [r["file"] for r in rows] == [str(files["a.wav"]), "-"]
    assert rows[0]["duration_s"] == 3.0 and rows[1]["duration_s"] == 2.0
    assert all(r["text"] and r["usage"]["completion_tokens"] == 4 for r in rows)
    tab = run_cli("transcribe", "smollm2", str(files["a.wav"]), str(files["b.wav"]), "--mmproj", uv,
                  "--max-tokens", "4", timeout=300)  # fmt: skip
    lines = tab.stdout.decode().splitlines()
    assert tab.returncode == 0 and [line.split("\t")[0] for line in lines] == [
        str(files["a.wav"]),
        str(files["b.wav"]),
    ]


def test_bad_input_is_one_line_and_exit_2(files: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.wav"
    bad.write_bytes(tone(1.0)[:-3000])
    png = tmp_path / "p.wav"
    png.write_bytes(random_png(1))
    mp3 = tmp_path / "a.mp3"
    mp3.write_bytes(b"ID3\x04" + bytes(200))
    vision = tmp_path / "bad-projector.gguf"
    vision.write_bytes(b"GGUF" + bytes(64))
    broken = _spec_file(tmp_path, "nopos", _drop("a.position_embd.weight"))
    cases = [
        (("--audio", str(bad), "--mmproj", str(files["ultravox"])), "truncated WAV"),
        (("--audio", str(png), "--mmproj", str(files["ultravox"])), "looks like a PNG image"),
        (("--audio", str(mp3), "--mmproj", str(files["ultravox"])), "MP3"),
        (("--audio", str(tmp_path / "none.wav"), "--mmproj", str(files["ultravox"])), "no such file"),
        (("--audio", str(files["a.wav"]), "--mmproj", str(broken)), "no tensor a.position_embd.weight"),
        (("--image", str(tmp_path / "x.png"), "--mmproj", str(files["ultravox"])), "x.png"),
    ]
    for args, said in cases:
        done = run_cli("run", "smollm2", "Hi", *args, "--max-tokens", "2", timeout=300)
        err = done.stderr.decode()
        assert done.returncode == 2, (args, err)
        assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, (args, err)


def test_an_image_to_an_audio_projector_and_audio_to_a_text_model(
    files: dict[str, Path], tmp_path: Path
) -> None:
    picture = tmp_path / "x.png"
    picture.write_bytes(random_png(3))
    done = run_cli("run", "smollm2", "Hi", "--image", str(picture), "--mmproj", str(files["ultravox"]),
                   "--max-tokens", "2", timeout=300)  # fmt: skip
    assert done.returncode == 2 and "takes no images" in done.stderr.decode()
    done = run_cli("run", "smollm2", "Hi", "--audio", str(files["a.wav"]), "--max-tokens", "2", timeout=300)
    assert done.returncode == 2 and "projector" in done.stderr.decode()


@pytest.mark.fast
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cuts=st.lists(st.integers(0, 20_000), max_size=3),
    flips=st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, 255)), max_size=12),
    head=st.binary(max_size=64),
)
def test_fuzzed_audio_bytes_decode_or_are_refused_in_one_line(
    cuts: list[int], flips: list[tuple[int, int]], head: bytes
) -> None:
    """Any bytes, a real WAV's cut and flipped (its header most often): a clip of finite samples, or
    an AudioError; nothing else is raised."""
    data = bytearray(FUZZ_WAV)
    for at, value in flips:
        data[at % 64 if at % 3 else at % len(data)] = value
    for cut in cuts:
        data = data[: max(0, len(data) - cut)]
    for sample in (bytes(data), head + bytes(data[len(head) :])):
        try:
            clip = load_audio(sample, name="fuzz", max_seconds=5)
        except AudioError as exc:
            assert "\n" not in str(exc)
            continue
        x = np.frombuffer(clip.samples, "<f4")
        assert (
            clip.frames > 0
            and np.isfinite(x).all()
            and np.isfinite(np.frombuffer(clip.at(16000), "<f4")).all()
        )


FUZZ_WAV = tone(0.5, rate=22050, channels=2)


def test_input_rows_name_their_clips(files: dict[str, Path], tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    a, b = str(files["a.wav"]), str(files["b.wav"])
    lines = [
        {"prompt": "Transcribe this.", "audio": [a]},
        {"prompt": "Hi", "audio": [b]},
        {"prompt": "x", "audio": "a"},
    ]
    rows.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    done = run_cli(
        "run", "smollm2", "--input", str(rows), "--mmproj", str(files["ultravox"]), "--jsonl", *GREEDY,
        "--flash-attn", "off", "--max-tokens", "8", "--parallel", "2", timeout=300,
    )  # fmt: skip
    out = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert len(out) == 3 and "must be a list of audio file paths" in out[2]["error"], out
    alone = runner_answer(files["ultravox"], files["a.wav"])
    assert (
        out[0]["text"] == alone["text"]
        and out[0]["usage"]["prompt_tokens"] == alone["usage"]["prompt_tokens"]
    )
    assert out[1]["text"] and out[1]["usage"]["prompt_tokens"] > 187


# -- in the loop: a batch of clips, a kept prefix over turns ----------------------------------------

GREEDY_CONFIG = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def audio_engine(files: dict[str, Path], smollm2_path: Path):
    with Engine(smollm2_path, n_ctx=8192, n_threads=2, n_seq=8) as engine:
        engine.attach_projector(files["ultravox"])
        yield engine


def clip_prompt(engine: Engine, path: Path, turns: list[Message], clips: list[bytes]) -> Prompt:
    audio = [load_audio(c, name="t") for c in clips]
    first = Message(turns[0].role, engine.vision.marker * len(clips) + turns[0].content)
    return render_prompt(engine, read_header(path), [first, *turns[1:]], images=audio)


@pytest.mark.model
def test_a_batch_of_8_clips_gives_each_ones_answer(audio_engine: Engine, smollm2_path: Path) -> None:
    engine = audio_engine
    clips = [tone(1.0 + seed / 4, seed=seed) for seed in range(8)]
    ask = [Message("user", "What is said?")]
    alone = []
    for clip in clips:
        engine.context.reset()
        p = clip_prompt(engine, smollm2_path, ask, [clip])
        alone.append(engine.generate(p.tokens, GREEDY_CONFIG, max_tokens=8, media=p.media).text)
    engine.context.reset()
    done: dict[int, str] = {}
    prompts = [clip_prompt(engine, smollm2_path, ask, [clip]) for clip in clips]
    run_batch(
        engine,
        [Request(p, GREEDY_CONFIG, max_tokens=8) for p in prompts],
        lambda r: done.__setitem__(r.index, r.text),
    )
    assert [done[i] for i in range(8)] == alone
    assert len(set(alone)) > 1  # the clips differ, and so do the answers


@pytest.mark.model
def test_turn_5_re_sending_a_clip_evaluates_only_its_new_text(
    audio_engine: Engine, smollm2_path: Path
) -> None:
    engine = audio_engine
    engine.context.reset()
    clip = tone(2.0, seed=7)
    turns = [Message("user", "Listen.")]
    for n in range(5):
        prompt = clip_prompt(engine, smollm2_path, turns, [clip])
        result = engine.answer(Request(prompt, GREEDY_CONFIG, max_tokens=4))
        t = result.timings
        if n == 0:
            assert t.prefill_tokens == t.prompt_tokens  # the clip's window evaluated once, with its text
        else:
            kept = t.prompt_tokens - t.prefill_tokens
            window = next(i for i, tok in enumerate(prompt.tokens) if tok < 0) + 187
            assert kept >= window, (n, t)  # the clip is kept: only the new turn's text is evaluated
            assert t.prefill_tokens < 40, (n, t)
        turns += [Message("assistant", result.text), Message("user", f"And now, part {n + 2}?")]


@pytest.mark.parametrize("flash", ["on", "off"])
def test_the_encoder_compute_buffer_is_planned_within_5_percent(files: dict[str, Path], flash: str) -> None:
    """runner.memory.audio_projector's window buffer against what libmtmd's log says it reserved."""
    from runner.memory.audio_projector import window_compute_bytes

    done = run_cli("run", "smollm2", "Hi", "--audio", str(files["a.wav"]), "--mmproj", str(files["ultravox"]),
                   "--max-tokens", "1", "--debug", "--flash-attn", flash, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = re.findall(rb"reserve_compute_meta: +CPU compute buffer size = +([\d.]+) MiB", done.stderr)
    assert found, done.stderr[-2000:]
    info = _check(files["ultravox"])
    planned = window_compute_bytes(info, flash_attn=flash == "on")
    assert abs(planned - float(found[-1]) * 2**20) <= 0.05 * planned, (planned, found)


def test_transcribe_bounds_a_clip_by_max_audio_seconds(files: dict[str, Path]) -> None:
    done = run_cli("transcribe", "smollm2", str(files["a.wav"]), "--mmproj", str(files["ultravox"]),
                   "--max-audio-seconds", "2", timeout=300)  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 2 and "is 3.0 s long, over the 2.0 s a clip may be" in err, err
    assert len(err.strip().splitlines()) == 1 and done.stdout == b""


def test_a_clip_over_the_context_is_refused_with_the_numbers(files: dict[str, Path], tmp_path: Path) -> None:
    """35 s is two 30-second windows (2 x 187 tokens): over a 256-token context, said before any of it
    is evaluated."""
    long = tmp_path / "long.wav"
    long.write_bytes(tone(35.0))
    done = run_cli("run", "smollm2", "Hi", "--audio", str(long), "--mmproj", str(files["ultravox"]),
                   "--ctx", "256", "--max-tokens", "4", timeout=300)  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 2 and done.stdout == b"", err
    assert re.search(r"the prompt is (\d+) tokens but the context is 256", err), err
    assert int(re.search(r"the prompt is (\d+)", err)[1]) > 2 * 187
