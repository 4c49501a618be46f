"""Audio projector types beyond whisper's own (tests/test_audio.py: ultravox, voxtral, qwen2a):
qwen2.5o, Qwen2.5-Omni's one file with a vision and an audio encoder, and qwen3a, Qwen3-ASR's. Each
test projector (scripts/make_test_projector.py --type qwen25o|qwen3a, random weights) passes the
header check, gives llama-server --mmproj's greedy answer token for token through `runner run --audio`
(the omni one with an image too) and its transcription through `runner transcribe`, and its encoder's
compute buffer is planned within 5% of libmtmd's; a malformed one is one line and exit 2, before
libmtmd opens it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFValueType

from runner.errors import InvalidModelFile
from runner.gguf import read_header
from runner.gguf.audio_projector import AudioProjectorInfo, OmniProjectorInfo
from runner.memory.audio_projector import estimate_audio_projector
from runner.projector import check, memory
from tests.audio_clips import GREEDY, LLAMA_SERVER, WIDTH, runner_answer, server_answers, tone
from tests.conftest import run_cli
from tests.helpers import load_script, random_png

mtp = load_script("make_test_projector")


def _write(path: Path, kind: str, edit: Any = None) -> Path:
    kvs, tensors = mtp.projector_spec(kind, WIDTH)
    if edit is not None:
        kvs, tensors = edit(kvs, tensors)
    return mtp.write_projector(path, kvs, tensors)


class _Smollm2:
    """SmolLM2's header as runner.projector.check reads it: its embedding width."""

    def arch_get(self, key: str) -> int | None:
        return WIDTH if key == "embedding_length" else None


def _checked(path: Path) -> Any:
    return check(path, _Smollm2())  # type: ignore[arg-type]


def _key(key: str, value: Any, vtype: GGUFValueType | None = None):
    def edit(kvs: list, tensors: dict) -> tuple[list, dict]:
        kept = [kv for kv in kvs if kv.key != key]
        if value is not None:
            sub = GGUFValueType.INT32 if vtype == GGUFValueType.ARRAY else None
            kept.append(mtp.KV(key, value, vtype or GGUFValueType.UINT32, sub))
        return kept, tensors

    return edit


def _tensor(name: str, array: Any):
    def edit(kvs: list, tensors: dict) -> tuple[list, dict]:
        changed = dict(tensors)
        if array is None:
            changed.pop(name)
        else:
            changed[name] = array(tensors) if callable(array) else array
        return kvs, changed

    return edit


# -- qwen2.5o: both encoders in one file ------------------------------------------------------------


@pytest.mark.fast
def test_an_omni_projector_is_checked_as_both_halves(tmp_path: Path) -> None:
    info = _checked(_write(tmp_path / "omni.gguf", "qwen25o"))
    assert isinstance(info, OmniProjectorInfo)
    assert info.audio.projector_type == "qwen2.5o" and info.audio.window_tokens == 750  # pooled, as qwen2a
    assert info.vision.projector_type == "qwen2.5vl_merger" and info.vision.mrope
    assert info.audio.projection_width == info.vision.projection_width == WIDTH
    from runner.memory.audio_projector import window_compute_bytes
    from runner.memory.projector import estimate_projector

    header = read_header(tmp_path / "omni.gguf")
    planned, vision = memory(tmp_path / "omni.gguf"), estimate_projector(header, info.vision)
    # an image's cost is the vision half's; both encoders' buffers are held, one clip context each
    assert planned.image_tokens == vision.image_tokens == 4096 and planned.sized
    assert planned.compute_cpu == vision.compute_cpu + window_compute_bytes(info.audio, flash_attn=True)
    assert planned.weights_cpu > vision.weights_cpu  # the patch kernels, loaded by both contexts
    assert planned.per_image() == f"{vision.per_image()}; 1,500 audio tokens a minute of audio"  # both


@pytest.mark.fast
@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_key("clip.vision.n_wa_pattern", None), "no clip.vision.n_wa_pattern"),  # the vision half
        (_key("clip.use_silu", 1), "clip.use_silu is u32"),
        (_tensor("a.position_embd.weight", None), "no tensor a.position_embd.weight"),  # the audio half
        (_tensor("a.blk.0.attn_k.bias", np.zeros(40, np.float32)), "a.blk.0.attn_k.bias"),
        (_tensor("mm.a.fc.weight", lambda t: t["mm.a.fc.weight"].T.copy()), "mm.a.fc.weight"),
        (_key("clip.audio.num_mel_bins", None), "no clip.audio.num_mel_bins"),
        (_key("clip.audio.num_mel_bins", 128.0, GGUFValueType.FLOAT32), "num_mel_bins is f32"),
        (_key("clip.projector_type", "qwen2.5vl_merger", GGUFValueType.STRING), "both in one file only"),
        (_key("clip.projector_type", [1, 2], GGUFValueType.ARRAY), "clip.projector_type is arr"),
        (_tensor("v.patch_embd.weight.1", None), "no tensor v.patch_embd.weight.1"),
    ],
)
def test_a_malformed_omni_projector_is_one_line(tmp_path: Path, edit: Any, problem: str) -> None:
    with pytest.raises(InvalidModelFile) as caught:
        _checked(_write(tmp_path / "bad.gguf", "qwen25o", edit))
    assert problem in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


# -- qwen3a: Qwen3-ASR's encoder ---------------------------------------------------------------------


@pytest.mark.fast
def test_a_qwen3a_projector_passes_and_costs_13_tokens_a_started_second(tmp_path: Path) -> None:
    info = _checked(_write(tmp_path / "q3a.gguf", "qwen3a"))
    assert isinstance(info, AudioProjectorInfo) and info.projector_type == "qwen3a"
    # windows of 800 frames (8 s), each in chunks of 100 frames (1 s) of 13 tokens; frames: 1 per 10 ms + 1
    assert info.window_tokens == 104 and info.windows(3.0) == 1 and info.windows(10.0) == 2
    assert [info.clip_tokens(s) for s in (0.5, 3.0, 7.99, 8.0, 10.0, 60.0)] == [13, 52, 104, 117, 143, 793]
    assert info.per_minute().startswith("793 audio tokens a minute")
    assert memory(tmp_path / "q3a.gguf").image_tokens == 403  # what show and fit say 30 s cost
    assert memory(tmp_path / "q3a.gguf").per_image() == "403 audio tokens every 30 s of audio, 793 a minute"


def _conv2(t: dict) -> Any:
    return t["a.conv2d.2.weight"][:, :4].copy()  # 4 input channels where the first gives 8


@pytest.mark.fast
@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_tensor("a.conv2d.2.weight", _conv2), "a.conv2d.2.weight has shape"),  # ggml_conv_2d asserts
        (_tensor("a.conv_out.weight", None), "no tensor a.conv_out.weight"),
        (_key("clip.audio.num_mel_bins", 80), "a.conv_out.weight has shape"),  # 10 rows left, not 16
        (_tensor("a.position_embd.weight", lambda t: t["a.position_embd.weight"][:12].copy()), "13 or more"),
        # ggml-cpu's add takes no F16 beside F32: llama-server aborts at the first clip (measured)
        (_tensor("a.position_embd.weight", lambda t: t["a.position_embd.weight"].astype(np.float16)), "F16"),
        (_tensor("mm.a.mlp.2.bias", None), "no tensor mm.a.mlp.2.bias"),
        (_tensor("mm.a.mlp.1.weight", lambda t: t["mm.a.mlp.1.weight"].T.copy()), "mm.a.mlp.1"),
        (_tensor("a.conv2d.1.bias", lambda t: t["a.conv2d.1.bias"][:4].copy()), "a.conv2d.1.bias has shape"),
        (_key("clip.audio.projector.stack_factor", 4), "stack_factor is given"),
        (_key("clip.audio.projector_type", "qwen3-asr-of-my-own", GGUFValueType.STRING), "not one runner"),
    ],
)
def test_a_malformed_qwen3a_projector_is_one_line(tmp_path: Path, edit: Any, problem: str) -> None:
    with pytest.raises(InvalidModelFile) as caught:
        _checked(_write(tmp_path / "bad.gguf", "qwen3a", edit))
    assert problem in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


@pytest.mark.fast
def test_a_qwen3a_projector_may_have_1_d_conv_biases_and_a_k_bias(tmp_path: Path) -> None:
    """What libmtmd takes as well: a bias of [C] reshaped as [1, 1, C], an attn_k bias (build_vit's
    biases are optional)."""

    def edit(kvs: list, tensors: dict) -> tuple[list, dict]:
        tensors = {**tensors, "a.blk.0.attn_k.bias": np.zeros(40, np.float32)}
        tensors["a.conv2d.3.bias"] = tensors["a.conv2d.3.bias"].reshape(-1).copy()
        return kvs, tensors

    assert _checked(_write(tmp_path / "ok.gguf", "qwen3a", edit)).projector_type == "qwen3a"


@pytest.mark.fast
def test_gemma_4s_projector_is_refused_by_name(tmp_path: Path) -> None:
    """Gemma 4's file (gemma4v and gemma4a, each named by its own key): not taken yet, said so."""

    def edit(kvs: list, tensors: dict) -> tuple[list, dict]:
        kept = [kv for kv in kvs if kv.key != "clip.projector_type"]
        string = GGUFValueType.STRING
        kept += [mtp.KV("clip.vision.projector_type", "gemma4v", string),
                 mtp.KV("clip.audio.projector_type", "gemma4a", string)]  # fmt: skip
        return kept, tensors

    with pytest.raises(InvalidModelFile) as caught:
        _checked(_write(tmp_path / "gemma4.gguf", "qwen25o", edit))
    said = str(caught.value)
    assert "'gemma4v' for vision and 'gemma4a' for audio" in said and "qwen2.5o" in said, said
    audio_only = _write(
        tmp_path / "gemma4a.gguf",
        "qwen3a",
        _key("clip.audio.projector_type", "gemma4a", GGUFValueType.STRING),
    )
    with pytest.raises(InvalidModelFile, match="'gemma4a' is not one runner takes audio through"):
        _checked(audio_only)


@pytest.mark.fast
def test_whisper_position_embeddings_in_f16_are_refused(tmp_path: Path) -> None:
    """An F16 a.position_embd aborts libmtmd at the first clip (ggml-cpu's add: f32 + f16 is
    unsupported; measured with an ultravox file); the converter writes it F32."""

    def edit(kvs: list, tensors: dict) -> tuple[list, dict]:
        return kvs, {
            **tensors,
            "a.position_embd.weight": tensors["a.position_embd.weight"].astype(np.float16),
        }

    with pytest.raises(InvalidModelFile, match="a.position_embd.weight is F16; it takes F32"):
        _checked(_write(tmp_path / "omni16.gguf", "qwen25o", edit))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("audio-types")
    made = {kind: _write(folder / f"{kind}.gguf", kind) for kind in mtp.AUDIO_KINDS}
    made["a.wav"] = folder / "a.wav"
    made["a.wav"].write_bytes(tone(3.0))
    made["ten.wav"] = folder / "ten.wav"
    made["ten.wav"].write_bytes(tone(10.0, seed=3))
    made["x.png"] = folder / "x.png"
    made["x.png"].write_bytes(random_png(3))
    return made


@pytest.mark.skipif(not LLAMA_SERVER.exists(), reason="the pinned llama-server is not built here")
@pytest.mark.parametrize("kind", ["qwen25o", "qwen3a"])
def test_run_audio_and_transcribe_give_llama_servers_answer(
    files: dict[str, Path], smollm2_path: Path, tmp_path: Path, kind: str
) -> None:
    """Flash attention on at both ends: it moves the logits (qwen3a's test projector answers
    "universe" with it and "game" without, at a margin of 0.17), so both must have it alike."""
    done = run_cli("run", "smollm2", "Transcribe this.", "--audio", str(files["a.wav"]), "--mmproj",
                   str(files[kind]), *GREEDY, "--flash-attn", "on", "--max-tokens", "8", "--json",
                   "--logprobs", "0", "--no-prompt-cache", timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    ours = json.loads(done.stdout)
    chat, heard = server_answers(
        smollm2_path, files[kind], files["a.wav"], tmp_path / "llama-server.log", flash_attn="on"
    )
    theirs = chat["choices"][0]["logprobs"]["content"]
    if chat["choices"][0]["finish_reason"] == "stop":
        theirs = theirs[:-1]  # llama-server scores the end-of-generation token too; runner does not
    assert [t["id"] for t in ours["logprobs"]] == [t["id"] for t in theirs]
    assert len(theirs) >= 4  # words, not the end at once: a comparison that can fail
    assert ours["usage"]["prompt_tokens"] == chat["usage"]["prompt_tokens"]
    done = run_cli("transcribe", "smollm2", str(files["a.wav"]), "--mmproj", str(files[kind]),
                   "--max-tokens", "8", timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().strip() == heard.strip()


@pytest.mark.skipif(not LLAMA_SERVER.exists(), reason="the pinned llama-server is not built here")
def test_an_omni_projector_takes_an_image_and_a_clip_in_one_prompt(
    files: dict[str, Path], smollm2_path: Path, tmp_path: Path
) -> None:
    done = run_cli("run", "smollm2", "Transcribe this.", "--image", str(files["x.png"]), "--audio",
                   str(files["a.wav"]), "--mmproj", str(files["qwen25o"]), *GREEDY, "--flash-attn", "on",
                   "--max-tokens", "8", "--json", "--logprobs", "0", "--no-prompt-cache",
                   timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    ours = json.loads(done.stdout)
    chat, _ = server_answers(
        smollm2_path,
        files["qwen25o"],
        files["a.wav"],
        tmp_path / "llama-server.log",
        flash_attn="on",
        image=files["x.png"],
    )
    theirs = chat["choices"][0]["logprobs"]["content"]
    if chat["choices"][0]["finish_reason"] == "stop":
        theirs = theirs[:-1]
    assert [t["id"] for t in ours["logprobs"]] == [t["id"] for t in theirs] and len(theirs) >= 4
    alone = runner_answer(files["qwen25o"], files["a.wav"], tokens=1)
    both = ours["usage"]["prompt_tokens"]
    assert (
        both == chat["usage"]["prompt_tokens"] >= alone["usage"]["prompt_tokens"] + 8
    )  # 40 x 30 px: 8 at least


@pytest.mark.parametrize(
    ("kind", "edit", "said"),
    [
        ("qwen25o", _tensor("a.position_embd.weight", None), "no tensor a.position_embd.weight"),  # segfault
        # libmtmd aborts at the first clip (f32 + f16 add)
        ("qwen3a", _tensor("a.position_embd.weight", lambda t: t["a.position_embd.weight"].astype("f2")),
         "a.position_embd.weight is F16"),
    ],
)  # fmt: skip
def test_a_malformed_projector_is_exit_2(
    files: dict[str, Path], tmp_path: Path, kind: str, edit: Any, said: str
) -> None:
    bad = _write(tmp_path / "bad.gguf", kind, edit)
    done = run_cli("run", "smollm2", "Hi", "--audio", str(files["a.wav"]), "--mmproj", str(bad),
                   "--max-tokens", "2", timeout=300)  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 2 and said in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("kind", ["qwen25o", "qwen3a"])
def test_the_audio_encoder_compute_buffer_is_planned_within_5_percent(
    files: dict[str, Path], kind: str
) -> None:
    """runner.memory.audio_projector's buffer against what libmtmd's log says it reserved for the
    audio encoder (an omni file's vision one is reserved at its first image), for a 10-second clip:
    qwen3a's first window is then its longest, 8 chunks (its buffer grows to the longest encoded)."""
    done = run_cli("run", "smollm2", "Hi", "--audio", str(files["ten.wav"]), "--mmproj", str(files[kind]),
                   "--max-tokens", "1", "--debug", "--flash-attn", "off", "--json", timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = re.findall(rb"reserve_compute_meta: +CPU compute buffer size = +([\d.]+) MiB", done.stderr)
    assert found, done.stderr[-2000:]
    info = _checked(files[kind])
    audio: AudioProjectorInfo = info.audio if isinstance(info, OmniProjectorInfo) else info
    planned = estimate_audio_projector(read_header(files[kind]), audio).compute_gpu  # flash attention off
    assert abs(planned - float(found[-1]) * 2**20) <= 0.05 * planned, (planned, found)
    # what a clip costs, as counted before decoding it: the 10 s clip's prompt against a 3 s one's
    short = run_cli("run", "smollm2", "Hi", "--audio", str(files["a.wav"]), "--mmproj", str(files[kind]),
                    "--max-tokens", "1", "--json", timeout=300)  # fmt: skip
    tokens = [json.loads(out.stdout)["usage"]["prompt_tokens"] for out in (done, short)]
    assert tokens[0] - tokens[1] == audio.clip_tokens(10.0) - audio.clip_tokens(3.0), tokens


def test_show_says_what_an_omni_projector_and_a_minute_of_audio_cost(
    smollm2_path: Path, tmp_path: Path
) -> None:
    omni, asr = _write(tmp_path / "omni.gguf", "qwen25o"), _write(tmp_path / "q3a.gguf", "qwen3a")
    shown = run_cli("show", str(smollm2_path), "--mmproj", str(omni))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.decode().splitlines()
    vision = next(line for line in lines if line.startswith("vision "))
    assert "image tokens an image" in vision and "1,500 audio tokens a minute of audio" in vision
    assert any(line.startswith("audio ") for line in lines)  # both encoders, one file
    as_json = json.loads(run_cli("show", str(smollm2_path), "--mmproj", str(asr), "--json").stdout)
    assert as_json["vision"]["audio_tokens"] == 403 and as_json["vision"]["audio_minute_tokens"] == 793
    per_token = 30 * 2 * 3 * 64 * 2  # SmolLM2: 30 layers, K and V, 3 KV heads of 64, f16
    assert as_json["vision"]["audio_minute_kv_bytes"] == 793 * per_token
