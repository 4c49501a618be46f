"""Vision projectors: scripts/make_test_projector.py's files pass runner.gguf.check_projector and load in
the pinned libmtmd (4 image tokens each; the Qwen ones size each image themselves, and with the
qwen2vl copy of SmolLM2 give it M-RoPE positions); each malformed variant is refused by the check in
one line, and libmtmd itself aborts, segfaults or fails on them (so the check is needed, not
decorative). libmtmd runs in a child process: a malformed projector takes the whole process down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType

from runner.errors import InvalidModelFile
from runner.gguf import ProjectorInfo, check_projector, read_header, read_key_types
from runner.gguf.projector import qwen_image_tokens
from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_test_projector.py"
TEXT_WIDTH = 576  # SmolLM2-135M's n_embd


mtp = load_script("make_test_projector")
Spec = tuple[list, dict[str, np.ndarray]]

# One child process: load the text model with llama.cpp's own API, then each projector through
# llama-cpp-python's libmtmd binding; for each image size (W x H), tokenize a prompt holding one image
# and encode that image.
PROBE = r"""
import ctypes, json, os, sys
import llama_cpp
from llama_cpp import mtmd_cpp as mtmd

llama_cpp.llama_backend_init()
model = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(), llama_cpp.llama_model_default_params())
assert model
sizes = [tuple(map(int, size.split("x"))) for size in os.environ["PROBE_SIZES"].split()]
for path in sys.argv[2:]:
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.warmup, params.print_timings, params.n_threads = False, False, False, 2
    ctx = mtmd.mtmd_init_from_file(path.encode(), model, params)
    if not ctx:
        print(json.dumps({"loaded": False}), flush=True)
        continue
    for w, h in sizes:
        pixels = bytes(i % 251 for i in range(w * h * 3))
        bitmap = mtmd.mtmd_bitmap_init(w, h, (ctypes.c_ubyte * len(pixels)).from_buffer_copy(pixels))
        prompt = b"Describe " + mtmd.mtmd_default_marker() + b" in one word."
        text = mtmd.mtmd_input_text()
        text.text, text.text_len, text.add_special, text.parse_special = prompt, len(prompt), True, True
        chunks = mtmd.mtmd_input_chunks_init()
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        rc = mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1)
        out = {"loaded": True, "vision": mtmd.mtmd_support_vision(ctx), "tokenize": rc, "chunks": []}
        out["mrope"] = mtmd.mtmd_decode_use_mrope(ctx)
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            out["chunks"].append([kind, mtmd.mtmd_input_chunk_get_n_tokens(chunk)])
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                image = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
                nx, ny = mtmd.mtmd_image_tokens_get_nx(image), mtmd.mtmd_image_tokens_get_ny(image)
                out["image"] = [nx, ny, mtmd.mtmd_input_chunk_get_n_pos(chunk)]  # the last one
                out["encode"] = mtmd.mtmd_encode_chunk(ctx, chunk)
                out["non_causal"] = mtmd.mtmd_decode_use_non_causal(ctx, chunk)
        print(json.dumps(out), flush=True)
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)
    mtmd.mtmd_free(ctx)
"""


def _libmtmd(model: Path, *projectors: Path, sizes: str = "40x30") -> tuple[int, list[dict]]:
    """The probe's exit status and one result per projector (and image size) it got through."""
    # an abort without gdb attaching for its backtrace
    env = {**os.environ, "GGML_NO_BACKTRACE": "1", "PROBE_SIZES": sizes}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(model), *map(str, projectors)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _write(path: Path, spec: Spec) -> Path:
    return mtp.write_projector(path, *spec)


def _without(*names: str) -> Callable[[Spec], Spec]:
    return lambda spec: (spec[0], {k: v for k, v in spec[1].items() if k not in names})


def _retyped(key: str, **change: object) -> Callable[[Spec], Spec]:
    return lambda spec: ([replace(kv, **change) if kv.key == key else kv for kv in spec[0]], spec[1])


def _transposed(name: str) -> Callable[[Spec], Spec]:
    return lambda spec: (spec[0], {**spec[1], name: np.ascontiguousarray(spec[1][name].T)})


def _with_key(key: str, value: object) -> Callable[[Spec], Spec]:
    return lambda spec: ([*spec[0], mtp.KV(key, value, GGUFValueType.UINT32)], spec[1])


def _with_tensor(name: str, array: np.ndarray) -> Callable[[Spec], Spec]:
    return lambda spec: (spec[0], {**spec[1], name: array})


# kind, what is done to a good spec, the check's message (a regex)
MALFORMED: dict[str, tuple[str, Callable[[Spec], Spec], str]] = {
    "missing mm.2": ("mlp", _without("mm.2.weight", "mm.2.bias"), r"it has no tensor mm\.2\.weight$"),
    "missing v.position_embd": (
        "mlp",
        _without("v.position_embd.weight"),
        r"it has no tensor v\.position_embd\.weight$",
    ),
    "f64 epsilon": (
        "mlp",
        _retyped("clip.vision.attention.layer_norm_epsilon", vtype=GGUFValueType.FLOAT64),
        r"clip\.vision\.attention\.layer_norm_epsilon is f64, clip\.cpp reads it as f32 and would abort$",
    ),
    "i32 image size": (
        "gemma3",
        _retyped("clip.vision.image_size", vtype=GGUFValueType.INT32),
        r"clip\.vision\.image_size is i32, clip\.cpp reads it as u32 and would abort$",
    ),
    "transposed mm.2": (
        "mlp",
        _transposed("mm.2.weight"),
        r"tensor mm\.2\.weight has shape \[576, 32\], clip\.cpp's graph needs \[32, 576\]$",
    ),
    "transposed input projection": (
        "gemma3",
        _transposed("mm.input_projection.weight"),
        r"tensor mm\.input_projection\.weight has shape \[32, 576\], clip\.cpp's graph needs \[576, 32\]$",
    ),
    "unknown projector type": (
        "mlp",
        _retyped("clip.projector_type", value="ldp"),
        r"projector type 'ldp' is not supported \(runner supports mlp, gemma3, idefics3, qwen2vl_merger "
        r"and qwen2\.5vl_merger\)$",
    ),
    "scale factor not dividing the patches": (
        "gemma3",
        _retyped("clip.vision.projector.scale_factor", value=3),
        r"scale_factor 3 does not divide the 4 patches a side$",
    ),
    "idefics3 without a scale factor": (
        "idefics3",
        lambda spec: ([kv for kv in spec[0] if kv.key != "clip.vision.projector.scale_factor"], spec[1]),
        r"scale_factor 1 is not over 1 or does not divide the 4 patches a side$",
    ),
    "idefics3 scale factor not dividing the patches": (
        "idefics3",
        _retyped("clip.vision.projector.scale_factor", value=3),
        r"scale_factor 3 is not over 1 or does not divide the 4 patches a side$",
    ),
    "missing mm.model.fc": (
        "idefics3",
        _without("mm.model.fc.weight"),
        r"it has no tensor mm\.model\.fc\.weight$",
    ),
    "transposed mm.model.fc": (
        "idefics3",
        _transposed("mm.model.fc.weight"),
        r"tensor mm\.model\.fc\.weight has shape \[576, 128\], clip\.cpp's graph needs \[128, 576\]$",
    ),
    "i32 preproc image size": (
        "idefics3",
        _retyped("clip.vision.preproc_image_size", vtype=GGUFValueType.INT32),
        r"clip\.vision\.preproc_image_size is i32, clip\.cpp reads it as u32 and would abort$",
    ),
    "f16 bias": (
        "mlp",
        lambda spec: (spec[0], {**spec[1], "mm.2.bias": spec[1]["mm.2.bias"].astype(np.float16)}),
        r"tensor mm\.2\.bias is F16; this use of it takes F32$",
    ),
    "no vision encoder": (
        "mlp",
        _retyped("clip.has_vision_encoder", value=False),
        r"clip\.has_vision_encoder is not true: it has no vision encoder$",
    ),
    "qwen2vl without the second patch kernel": (
        "qwen2vl",
        _without("v.patch_embd.weight.1"),
        r"it has no tensor v\.patch_embd\.weight\.1$",
    ),
    "qwen2vl without a Q bias": (
        "qwen2vl",
        _without("v.blk.1.attn_q.bias"),
        r"it has no tensor v\.blk\.1\.attn_q\.bias$",
    ),
    "qwen2vl with a patch bias": (
        "qwen2vl",
        _with_tensor("v.patch_embd.bias", np.zeros(32, dtype=np.float32)),
        r"it has v\.patch_embd\.bias, which qwen2vl_merger's graph asserts it has not "
        r"\(qwen2vl\.cpp 33-34\)$",
    ),
    "qwen2vl merging 3 x 3": (
        "qwen2vl",
        _with_key("clip.vision.spatial_merge_size", 3),
        r"clip\.vision\.spatial_merge_size is 3; clip\.cpp's qwen2vl_merger graph merges 2 x 2 patches$",
    ),
    "qwen2vl with window attention": (
        "qwen2vl",
        _with_key("clip.vision.n_wa_pattern", 2),
        r"clip\.vision\.n_wa_pattern is 2: qwen2vl_merger's window attention would abort$",
    ),
    "qwen2vl heads of 2": (
        "qwen2vl",
        _retyped("clip.vision.attention.head_count", value=16),
        r"its head dimension 2 is not a multiple of 4, as its ViT's M-RoPE needs$",
    ),
    "qwen2vl patches of 400 px": (
        "qwen2vl",
        _retyped("clip.vision.patch_size", value=400),
        r"patch_size 400 is too large: clip\.cpp's image limits \(in pixels\) would overflow$",
    ),
    "qwen25vl without n_wa_pattern": (
        "qwen25vl",
        lambda spec: ([kv for kv in spec[0] if kv.key != "clip.vision.n_wa_pattern"], spec[1]),
        r"it has no clip\.vision\.n_wa_pattern \(u32\), which clip\.cpp requires of qwen2\.5vl_merger$",
    ),
    "qwen25vl windows in no block": (
        "qwen25vl",
        _retyped("clip.vision.n_wa_pattern", value=1),
        r"clip\.vision\.n_wa_pattern is 1: clip\.cpp would abort setting a window mask no block uses$",
    ),
    "qwen25vl i32 n_wa_pattern": (
        "qwen25vl",
        _retyped("clip.vision.n_wa_pattern", vtype=GGUFValueType.INT32),
        r"clip\.vision\.n_wa_pattern is i32, clip\.cpp reads it as u32 and would abort$",
    ),
    "qwen25vl transposed merger": (
        "qwen25vl",
        _transposed("mm.2.weight"),
        r"tensor mm\.2\.weight has shape \[576, 128\], clip\.cpp's graph needs \[128, 576\]$",
    ),
    "qwen25vl narrow gate": (
        "qwen25vl",
        lambda spec: (
            spec[0],
            {**spec[1], "v.blk.0.ffn_gate.weight": spec[1]["v.blk.0.ffn_gate.weight"][:32]},
        ),
        r"tensor v\.blk\.0\.ffn_gate\.weight has shape \[32, 32\], clip\.cpp's graph needs \[32, 64\]$",
    ),
}


@pytest.fixture(scope="module")
def projectors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("projectors")
    return {kind: _write(out / f"{kind}.gguf", mtp.projector_spec(kind, TEXT_WIDTH)) for kind in mtp.KINDS}


@pytest.mark.fast
@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("mlp", ProjectorInfo("mlp", 28, 14, 4, TEXT_WIDTH, 224_768, non_causal=False)),
        ("gemma3", ProjectorInfo("gemma3", 32, 8, 4, TEXT_WIDTH, 87_296, non_causal=True)),
        # f32: 4 tokens a tile (4 x 4 patches shuffled by 2); mm.model.fc 128 x 576
        ("idefics3", ProjectorInfo("idefics3", 32, 8, 4, TEXT_WIDTH, 390_272, non_causal=False)),
        # 112 x 112 px: 4 x 4 tokens of 2 x 2 patches of 14; F16 matrices
        ("qwen2vl", ProjectorInfo("qwen2vl_merger", 112, 14, 16, TEXT_WIDTH, 294_144, False, mrope=True)),
        ("qwen25vl", ProjectorInfo("qwen2.5vl_merger", 112, 14, 16, TEXT_WIDTH, 302_208, False, mrope=True)),
    ],
)
def test_generated_projectors_pass_the_check(projectors: dict[str, Path], kind: str, expected: ProjectorInfo):
    assert check_projector(read_header(projectors[kind]), TEXT_WIDTH) == expected
    assert check_projector(read_header(projectors[kind])) == expected  # no text model to compare with
    tensors = mtp.projector_spec(kind, TEXT_WIDTH)[1]
    assert expected.weights_bytes == sum(a.nbytes for a in tensors.values())


@pytest.mark.fast
def test_key_types_are_read_from_the_file(projectors: dict[str, Path]):
    types = read_key_types(projectors["gemma3"])
    assert types["clip.vision.image_size"] == "u32"
    assert types["clip.vision.attention.layer_norm_epsilon"] == "f32"
    assert types["clip.vision.image_mean"] == "arr[f32]"
    assert types["clip.has_vision_encoder"] == "bool"
    assert types["general.architecture"] == "str"


@pytest.mark.model
def test_the_script_writes_the_same_bytes_for_the_same_seed(smollm2_path: Path, tmp_path: Path, capsys):
    paths = {}
    for name, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        paths[name] = tmp_path / f"{name}.gguf"
        assert (
            mtp.main([str(paths[name]), "--for", str(smollm2_path), "--type", "gemma3", "--seed", seed]) == 0
        )
    assert paths["a"].read_bytes() == paths["b"].read_bytes()
    assert paths["a"].read_bytes() != paths["c"].read_bytes()
    assert f"{paths['c']}: gemma3 projector, {paths['c'].stat().st_size} bytes" in capsys.readouterr().out
    assert check_projector(read_header(paths["c"]), TEXT_WIDTH).image_tokens == 4


def test_generated_projectors_load_in_libmtmd(
    smollm2_path: Path, projectors: dict[str, Path], tmp_path: Path
):
    """Each kind loads beside SmolLM2, a prompt with one image tokenizes into an image chunk of 4
    tokens (idefics3: 5, the 40 x 30 image resized to 64 x 48, cut into 2 x 2 tiles of 32, then the
    whole image; the Qwen ones: 12, it resized to 112 x 84), and the image encodes; a transposed or
    too narrow projection is refused by libmtmd too. SmolLM2's rope is llama's, so the Qwen ones'
    tokens take one position each."""
    narrow = _write(tmp_path / "narrow.gguf", mtp.projector_spec("mlp", 640))
    transposed = _write(
        tmp_path / "t.gguf", _transposed("mm.2.weight")(mtp.projector_spec("mlp", TEXT_WIDTH))
    )
    rc, results = _libmtmd(smollm2_path, *(projectors[kind] for kind in mtp.KINDS), narrow, transposed)
    assert rc == 0
    mlp, gemma3, idefics3, qwen2vl, qwen25vl, *refused = results
    for qwen in (qwen2vl, qwen25vl):
        assert qwen["tokenize"] == 0 and qwen["encode"] == 0 and not qwen["mrope"]
        assert qwen["image"] == [12, 1, 12]  # without M-RoPE, libmtmd counts them as one row
    text, image = 0, 1  # MTMD_INPUT_CHUNK_TYPE_TEXT, _IMAGE
    assert mlp["vision"] and mlp["tokenize"] == 0 and mlp["encode"] == 0 and not mlp["non_causal"]
    assert [kind for kind, _ in mlp["chunks"]] == [text, image, text] and mlp["chunks"][1][1] == 4
    assert gemma3["vision"] and gemma3["tokenize"] == 0 and gemma3["encode"] == 0 and gemma3["non_causal"]
    assert [n for kind, n in gemma3["chunks"] if kind == image] == [4]  # between <start_of_image> and its end
    assert idefics3["vision"] and idefics3["tokenize"] == 0 and idefics3["encode"] == 0
    assert not idefics3["non_causal"]
    kinds_of = [kind for kind, _ in idefics3["chunks"]]
    assert [n for kind, n in idefics3["chunks"] if kind == image] == [4] * 5
    assert kinds_of == [text, image, text, image, text, image, text, image, text, image, text]
    assert refused == [{"loaded": False}, {"loaded": False}]


@pytest.fixture(scope="module")
def smollm2_qwen2vl(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 as architecture qwen2vl: M-RoPE."""
    return mtp.as_qwen2vl(smollm2_path, tmp_path_factory.mktemp("mrope") / "smollm2-qwen2vl.gguf")


def test_the_qwen_projectors_give_an_mrope_model_nx_by_ny_tokens_on_max_positions(
    smollm2_qwen2vl: Path, projectors: dict[str, Path]
):
    """Beside a text model whose rope is M-RoPE, an image of nx x ny tokens (2 x 2 patches of 14 px
    each, the image rounded to them, 8 of them at least) takes max(nx, ny) positions."""
    sizes = {
        "112x112": [4, 4, 4],
        "112x56": [4, 2, 4],
        "56x112": [2, 4, 4],
        "40x30": [4, 3, 4],
        "56x56": [3, 3, 3],
    }
    rc, results = _libmtmd(
        smollm2_qwen2vl, projectors["qwen2vl"], projectors["qwen25vl"], sizes=" ".join(sizes)
    )
    assert rc == 0 and len(results) == 2 * len(sizes)
    for result, expected in zip(results, [*sizes.values()] * 2, strict=True):
        assert result["mrope"] and result["tokenize"] == 0 and result["encode"] == 0
        assert result["image"] == expected
        nx, ny, _ = expected
        assert [n for kind, n in result["chunks"] if kind == 1] == [nx * ny]


@pytest.mark.model
def test_the_qwen2vl_copy_keeps_the_model_but_its_rope(smollm2_path: Path, smollm2_qwen2vl: Path):
    """as_qwen2vl: the same tokenizer, template and tensors (Q's and K's rows reordered), with M-RoPE
    sections and zero Q, K and V biases."""
    model, copy = read_header(smollm2_path), read_header(smollm2_qwen2vl)
    assert copy.architecture == "qwen2vl" and copy.arch_get("rope.dimension_sections") == [8, 12, 12, 0]
    for key in ("embedding_length", "block_count", "attention.head_count", "rope.freq_base"):
        assert copy.arch_get(key) == model.arch_get(key)
    for key in ("tokenizer.chat_template", "tokenizer.ggml.tokens", "tokenizer.ggml.pre"):
        assert copy.metadata[key] == model.metadata[key]
    shapes = {t.name: t.shape for t in model.tensors}
    added = {t.name: t.shape for t in copy.tensors if t.name not in shapes}
    assert {t.name: t.shape for t in copy.tensors if t.name in shapes} == shapes
    assert (
        len(added) == 3 * 30 and added["blk.0.attn_q.bias"] == (576,) and added["blk.0.attn_v.bias"] == (192,)
    )


@pytest.mark.fast
def test_qwen_image_tokens_follow_libmtmd():
    """The tokens of a square image and its side as resized: rounded to 2 x 2 patches, 9 at least
    (3 x 3 covers the 8 the Qwen ones take at least), 64 x 64 at most; these numbers are libmtmd's."""
    assert qwen_image_tokens(1, 14) == (9, 84)
    assert qwen_image_tokens(84, 14) == (9, 84)
    assert qwen_image_tokens(112, 14) == (16, 112)
    assert qwen_image_tokens(126, 14) == (25, 140)  # 4.5 tokens a side rounds up
    assert qwen_image_tokens(560, 14) == (400, 560)  # Qwen2-VL's image_size
    assert qwen_image_tokens(1800, 14) == (4096, 1792)
    assert qwen_image_tokens(2000, 16) == (3969, 2016)  # scaled down in floats: 63 a side, not 64
    assert qwen_image_tokens(2040, 16) == (4096, 2048)


@pytest.mark.fast
def test_a_dynamic_qwen_projector_is_counted_at_its_warmup_size(tmp_path: Path):
    """image_size 0 (a dynamic size, which clip.cpp takes): the image libmtmd warms up with, 46 x 46
    tokens; the same seed gives the same file."""
    paths = []
    for name in ("a", "b"):
        spec = _retyped("clip.vision.image_size", value=0)(mtp.projector_spec("qwen25vl", TEXT_WIDTH, seed=3))
        paths.append(_write(tmp_path / f"{name}.gguf", spec))
    assert paths[0].read_bytes() == paths[1].read_bytes()
    info = check_projector(read_header(paths[0]), TEXT_WIDTH)
    assert (info.image_size, info.image_tokens, info.mrope) == (46 * 28, 46 * 46, True)


@pytest.mark.fast
@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_projectors_are_refused_in_one_line(tmp_path: Path, case: str):
    kind, mutate, message = MALFORMED[case]
    path = _write(tmp_path / "bad.gguf", mutate(mtp.projector_spec(kind, TEXT_WIDTH)))
    with pytest.raises(InvalidModelFile, match=f"^{path} is not a usable projector: {message}") as err:
        check_projector(read_header(path), TEXT_WIDTH)
    assert "\n" not in str(err.value)


@pytest.mark.fast
def test_a_projector_for_another_width_is_refused(tmp_path: Path):
    path = _write(tmp_path / "wide.gguf", mtp.projector_spec("mlp", 640))
    assert check_projector(read_header(path)).projection_width == 640
    with pytest.raises(InvalidModelFile, match=r"it projects into width 640, the text model's is 576$"):
        check_projector(read_header(path), TEXT_WIDTH)


@pytest.mark.model
def test_a_text_model_is_not_a_projector(smollm2_path: Path):
    message = (
        r"is not a projector: it has no clip\.projector_type \(general\.architecture is llama: a text model"
    )
    with pytest.raises(InvalidModelFile, match=message):
        check_projector(read_header(smollm2_path), TEXT_WIDTH)


@pytest.mark.parametrize(
    ("case", "sig"),
    [
        ("missing mm.2", signal.SIGSEGV),  # clip_n_mmproj_embd reads mm_2_w->ne[1] while it loads
        ("f64 epsilon", signal.SIGABRT),  # gguf_get_val_f32 asserts the key's type
        ("i32 image size", signal.SIGABRT),  # gguf_get_val_u32 likewise
        ("missing v.position_embd", signal.SIGSEGV),  # loads and tokenizes; encoding reads NULL rows
        ("idefics3 without a scale factor", signal.SIGABRT),  # build_patch_merge_permute asserts it
        ("qwen2vl without the second patch kernel", signal.SIGSEGV),  # encoding convolves with NULL
        ("qwen2vl without a Q bias", signal.SIGSEGV),  # encoding adds NULL
        ("qwen2vl with a patch bias", signal.SIGABRT),  # the graph asserts there is none
        ("qwen2vl merging 3 x 3", signal.SIGABRT),  # the graph asserts sides of 2 patches
        ("qwen2vl heads of 2", signal.SIGABRT),  # the rope asserts an even number of dims
        ("qwen25vl windows in no block", signal.SIGABRT),  # its inputs are set by name: one is missing
    ],
)
def test_libmtmd_itself_dies_on_what_the_check_refuses(
    smollm2_path: Path, tmp_path: Path, case: str, sig: int
):
    kind, mutate, _ = MALFORMED[case]
    path = _write(tmp_path / "bad.gguf", mutate(mtp.projector_spec(kind, TEXT_WIDTH)))
    rc, results = _libmtmd(smollm2_path, path)
    assert rc == -sig
    assert results == []
