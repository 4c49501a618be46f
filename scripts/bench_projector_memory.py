"""A vision projector's memory: runner's estimate (runner.memory.projector) against libmtmd's own log.

For each projector, a child process loads SmolLM2 and then the projector through llama-cpp-python's
libmtmd binding as runner does (use_gpu off, warmup off: the encoder's compute buffer is then reserved
at the first encode, clip.cpp clip_encode -> warmup), encodes one image, and prints the lines libmtmd
logged: `clip_model_loader: model size: N MiB` (every tensor's bytes) and `reserve_compute_meta: CPU
compute buffer size = N MiB`. The parent prints a markdown table of estimate against log, MiB.

The image: a fixed-size projector resizes any image to its own size (a 64 px square is sent). A Qwen
projector takes each at its own size, so it is measured with the image the plan counts, its largest
(64 x 64 tokens: 1792 px for patches of 14), and with a 1024 x 768 photo (PHOTO), which the replay
(runner.memory.projector.vit_graph) sizes as libmtmd resizes it (qwen_size).

Projectors: the test projectors of scripts/make_test_projector.py, and larger synthetic ones
written from its projector_spec with other sizes (scaled_spec: the same keys and tensors, another
image size, patch size, width, depth, weight type).

    python scripts/bench_projector_memory.py [--model SmolLM2.gguf] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MiB = 1 << 20
MODEL_SIZE = re.compile(r"model size:\s+([\d.]+) MiB")
COMPUTE = re.compile(r"(\S+) compute buffer size =\s+([\d.]+) MiB")
NODES = re.compile(r"graph splits = (\d+), nodes = (\d+)")


def _make_test_projector() -> Any:
    spec = importlib.util.spec_from_file_location(
        "make_test_projector", ROOT / "scripts" / "make_test_projector.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


mtp = _make_test_projector()


@dataclass(frozen=True)
class Sizes:
    """A projector's shape: what scaled_spec changes in make_test_projector's spec."""

    kind: str  # mlp, gemma3, idefics3, qwen2vl or qwen25vl
    image: int
    patch: int
    width: int
    heads: int
    ffn: int
    blocks: int
    dtype: str = "f32"  # the matrices' type: f32 or f16 (vectors stay f32)
    class_embd: bool = False  # mlp: a class embedding (CLIP's), one more position
    merge: int = 2  # gemma3, idefics3: clip.vision.projector.scale_factor


# name -> sizes; "mlp" and "gemma3" are make_test_projector's own files
SYNTHETIC: dict[str, Sizes] = {
    "mlp-224": Sizes("mlp", 224, 14, 256, 4, 1024, 4, class_embd=True),
    "mlp-336-f16": Sizes("mlp", 336, 14, 1024, 16, 4096, 3, dtype="f16", class_embd=True),
    "gemma3-448": Sizes("gemma3", 448, 14, 512, 8, 2048, 3, dtype="f16", merge=4),
    "gemma3-896": Sizes("gemma3", 896, 14, 1152, 16, 4304, 2, dtype="f16", merge=4),
    # SmolVLM 256M's and 500M's SigLIP: 512 px tiles in patches of 16, width 768, shuffled by 4 (64 tokens)
    "idefics3-512": Sizes("idefics3", 512, 16, 768, 12, 3072, 2, dtype="f16", merge=4),
    # Qwen2-VL's and Qwen2.5-VL's ViT width and heads (d_head 80: CUDA's flash attention takes it), 2 blocks
    "qwen2vl-1280": Sizes("qwen2vl", 112, 14, 1280, 16, 5120, 2, dtype="f16"),
    "qwen25vl-1280": Sizes("qwen25vl", 112, 14, 1280, 16, 3420, 2, dtype="f16"),
}
QWEN = ("qwen2vl", "qwen25vl")
PHOTO = (1024, 768)  # a typical image: for a Qwen projector, 37 x 27 tokens (1036 x 756 px)


def scaled_spec(sizes: Sizes, text_n_embd: int, seed: int = 0) -> tuple[list, dict[str, np.ndarray]]:
    """make_test_projector.projector_spec's keys and tensors for a projector of these sizes."""
    kvs, small = mtp.projector_spec(sizes.kind, text_n_embd, seed)
    rng = np.random.default_rng(seed)
    values = {
        "clip.vision.image_size": sizes.image,
        "clip.vision.patch_size": sizes.patch,
        "clip.vision.embedding_length": sizes.width,
        "clip.vision.feed_forward_length": sizes.ffn,
        "clip.vision.attention.head_count": sizes.heads,
        "clip.vision.block_count": sizes.blocks,
        "clip.vision.projector.scale_factor": sizes.merge,
        "clip.vision.preproc_image_size": 2 * sizes.image,
    }
    kvs = [replace(kv, value=values[kv.key]) if kv.key in values else kv for kv in kvs]
    e, f, p = sizes.width, sizes.ffn, sizes.patch
    n_pos = (sizes.image // p) ** 2 + sizes.class_embd
    shapes = {  # numpy's order (ggml's reversed), by the name with its block number dropped
        "v.patch_embd.weight": (e, 3, p, p),
        "v.position_embd.weight": (n_pos, e),
        "v.class_embd": (e,),
        "ffn_up.weight": (f, e),
        "ffn_up.bias": (f,),
        "ffn_down.weight": (e, f),
        "mm.input_projection.weight": (e, text_n_embd),
        "mm.model.fc.weight": (text_n_embd, e * sizes.merge * sizes.merge),
        "mm.0.weight": (e, e),
        "mm.2.weight": (text_n_embd, e),
        "mm.2.bias": (text_n_embd,),
    }
    if sizes.kind in QWEN:  # the second frame's kernel, the gate, the merger over 2 x 2 patches
        four = 4 * e
        shapes |= {"v.patch_embd.weight.1": (e, 3, p, p), "ffn_gate.weight": (f, e), "ffn_gate.bias": (f,)}
        shapes |= {"mm.0.weight": (four, four), "mm.0.bias": (four,), "mm.2.weight": (text_n_embd, four)}
    names = [n for n in small if not n.startswith("v.blk.")]
    names += [
        n.replace("v.blk.0.", f"v.blk.{i}.")
        for i in range(sizes.blocks)
        for n in small
        if n.startswith("v.blk.0.")
    ]
    if sizes.class_embd:
        names.append("v.class_embd")
    tensors = {}
    for name in names:
        short = name.split(".", 3)[3] if name.startswith("v.blk.") else name
        shape = shapes.get(short, (e, e) if short.endswith(".weight") and short.startswith("attn") else (e,))
        if short.endswith(("ln1.weight", "ln2.weight", "ln.weight", "norm.weight")):
            array = np.ones(shape, dtype=np.float32)
        else:
            array = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        matrix = array.ndim > 1 and "position" not in name
        tensors[name] = array.astype(np.float16) if matrix and sizes.dtype == "f16" else array
    return kvs, tensors


def qwen_size(width: int, height: int, patch: int = 14, merge: int = 2) -> tuple[int, int]:
    """The size libmtmd resizes a width x height image to for a Qwen projector (clip.cpp 1678:
    between 8 and 4,096 tokens of (patch x merge)**2 px; mtmd-image.cpp 122: calc_size_preserved_
    ratio, float32 as there): each side rounded to a token, scaled down if the image is over the
    tokens (each side rounded down) or up if under (rounded up)."""
    f32, align = np.float32, patch * merge
    max_pixels, min_pixels = 4096 * align * align, 8 * align * align
    w = max(align, int(np.floor(f32(width) / f32(align) + f32(0.5))) * align)  # std::round: half away
    h = max(align, int(np.floor(f32(height) / f32(align) + f32(0.5))) * align)
    if w * h > max_pixels:
        beta = np.sqrt(f32(height) * f32(width) / f32(max_pixels), dtype=f32)
        h = max(align, int(np.floor(f32(height) / beta / f32(align))) * align)
        w = max(align, int(np.floor(f32(width) / beta / f32(align))) * align)
    elif w * h < min_pixels:
        beta = np.sqrt(f32(min_pixels) / (f32(height) * f32(width)), dtype=f32)
        h = int(np.ceil(f32(height) * beta / f32(align))) * align
        w = int(np.ceil(f32(width) * beta / f32(align))) * align
    return w, h


def largest(kind: str, patch: int = 14, merge: int = 2) -> tuple[int, int]:
    """The image the plan counts: a Qwen projector's largest (64 x 64 tokens), else a 64 px square
    (any size: a fixed-size projector resizes it to its own)."""
    side = 64 * patch * merge
    return (side, side) if kind in QWEN else (64, 64)


def write(name: str, model: Path, out_dir: Path) -> Path:
    """The projector `name` for the text model: a test projector (make_test_projector's KINDS) or a
    SYNTHETIC one."""
    width = mtp.text_width(model)
    spec = mtp.projector_spec(name, width) if name in mtp.KINDS else scaled_spec(SYNTHETIC[name], width)
    return mtp.write_projector(out_dir / f"{name}.gguf", *spec)


# The child: SmolLM2 loaded with llama.cpp's own API, the projector through libmtmd as runner's engine
# attaches it (runner.engine.vision.Vision), one image tokenized and encoded; libmtmd's log captured.
PROBE = r"""
import ctypes, json, sys
import llama_cpp
from llama_cpp import mtmd_cpp as mtmd

lines = []
@llama_cpp.llama_log_callback
def log(level, text, user_data):
    lines.append(text.decode(errors="replace"))
@llama_cpp.llama_log_callback
def quiet(level, text, user_data):
    pass

llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
mtmd.mtmd_log_set(log, ctypes.c_void_p(0))
mtmd.mtmd_helper_log_set(log, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()
model = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(), llama_cpp.llama_model_default_params())
assert model
def rss_kib(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field + ":"))
before = rss_kib("VmRSS")
params = mtmd.mtmd_context_params_default()
params.use_gpu, params.print_timings, params.n_threads = sys.argv[3] == "gpu", False, 2
params.warmup = sys.argv[5] == "warmup"
if sys.argv[4] == "nofa":
    params.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED; runner leaves "auto" (-1)
ctx = mtmd.mtmd_init_from_file(sys.argv[2].encode(), model, params)
assert ctx
at_init = len(lines)
nx, ny = int(sys.argv[6]), int(sys.argv[7])
pixels = bytes(range(256)) * (nx * ny * 3 // 256) + bytes(nx * ny * 3 % 256)
bitmap = mtmd.mtmd_bitmap_init(nx, ny, (ctypes.c_ubyte * len(pixels)).from_buffer_copy(pixels))
prompt = mtmd.mtmd_default_marker()
text = mtmd.mtmd_input_text()
text.text, text.text_len, text.add_special, text.parse_special = prompt, len(prompt), False, True
chunks = mtmd.mtmd_input_chunks_init()
assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
for i in range(mtmd.mtmd_input_chunks_size(chunks)):
    chunk = mtmd.mtmd_input_chunks_get(chunks, i)
    if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
        assert mtmd.mtmd_encode_chunk(ctx, chunk) == 0
grown = (rss_kib("VmHWM") - before) * 1024
print(json.dumps({"at_init": lines[:at_init], "at_encode": lines[at_init:], "rss_growth": grown}), flush=True)
"""


@dataclass(frozen=True)
class Logged:
    """What libmtmd logged: the model size (MiB, every tensor) and each compute buffer (MiB), by when."""

    model_size_mib: float
    compute_mib: dict[str, float]  # buffer type (CPU, CUDA0) -> MiB, after the first encode
    compute_at_init: bool  # a compute buffer was logged before any encode (warmup on)
    nodes: int  # the graph's nodes, as the last reserve logged them
    rss_growth_bytes: int  # the process's peak RSS from before libmtmd's init to after the encode


def measure(
    model: Path,
    projector: Path,
    *,
    use_gpu: bool = False,
    flash_attn: bool = True,
    warmup: bool = False,
    image: tuple[int, int] = (64, 64),
) -> Logged:
    """libmtmd's own figures for this projector, loaded in a child process as runner loads it (by
    default: CPU, flash attention "auto", no warmup), after encoding one image of image (width,
    height) pixels."""
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}
    where = "gpu" if use_gpu else "cpu"
    fa, warm = "fa" if flash_attn else "nofa", "warmup" if warmup else "nowarmup"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(model), str(projector), where, fa, warm, *map(str, image)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not out:
        raise RuntimeError(f"the probe failed ({proc.returncode}): {proc.stderr[-2000:]}")
    text = "".join(out[0]["at_init"])
    size = MODEL_SIZE.search(text)
    assert size is not None, text
    logged = text + "".join(out[0]["at_encode"])
    compute: dict[str, float] = {}
    for match in COMPUTE.finditer(logged):
        compute[match.group(1)] = max(compute.get(match.group(1), 0.0), float(match.group(2)))
    nodes = [int(m.group(2)) for m in NODES.finditer(logged)]
    at_init = bool(COMPUTE.search(text))
    return Logged(float(size.group(1)), compute, at_init, nodes[-1] if nodes else 0, out[0]["rss_growth"])


@dataclass(frozen=True)
class Estimated:
    """runner's figures for a projector on the CPU (as a CPU-only plan places it), for one image."""

    tensor_bytes: int  # what the log's model size counts
    weights_bytes: int  # the weights' buffer (padded)
    compute_bytes: int  # with flash attention, as runner's "auto" gets on the CPU
    compute_no_fa_bytes: int  # without: what a GPU whose flash attention does not take the head size gets
    nodes: int
    held_bytes: int  # what the plan counts on the CPU: weights, compute, memory in no buffer (its image)


def estimated(projector: Path, image: tuple[int, int] | None = None) -> Estimated:
    """The estimate, and the graph's replay for an image of image's (width, height) pixels (a Qwen
    projector's, as libmtmd resizes it: qwen_size) where given, else for the image the plan counts."""
    from runner.gguf import check_projector, read_header
    from runner.memory.graph import compute_buffer_size
    from runner.memory.kv import CPU_ALIGNMENT
    from runner.memory.projector import estimate_projector, vit_graph, vit_of

    header = read_header(projector)
    info = check_projector(header)
    est = estimate_projector(header, info)
    vit = vit_of(header, info)
    size = qwen_size(*image, vit.patch, vit.merge) if image is not None and vit.mrope else None
    graph = vit_graph(vit, image=size)
    compute = compute_buffer_size(graph, CPU_ALIGNMENT) if size else est.compute_bytes
    no_fa = compute_buffer_size(vit_graph(vit, flash_attn=False, image=size), CPU_ALIGNMENT)
    held = est.weights_cpu + est.compute_cpu + est.host(on_gpu=False)
    return Estimated(est.tensor_bytes, est.weights_bytes, compute, no_fa, len(graph.nodes), held)


def row(
    name: str, model: Path, projector: Path, image: tuple[int, int], no_fa: bool = True
) -> dict[str, Any]:
    """Estimate and log for one image of image's (width, height) pixels, with flash attention and
    (no_fa) without."""
    kind = name.split("-")[0]
    est = estimated(projector, image if kind in QWEN else None)
    logged = measure(model, projector, image=image)
    unflashed = measure(model, projector, flash_attn=False, image=image) if no_fa else None
    return {
        "name": name,
        "image": f"{image[0]} x {image[1]}",
        "weights_est_mib": est.tensor_bytes / MiB,
        "weights_buffer_mib": est.weights_bytes / MiB,
        "weights_log_mib": logged.model_size_mib,
        "compute_est_mib": est.compute_bytes / MiB,
        "compute_log_mib": logged.compute_mib.get("CPU", 0.0),
        "no_fa_est_mib": est.compute_no_fa_bytes / MiB,
        "no_fa_log_mib": unflashed.compute_mib.get("CPU", 0.0) if unflashed else None,
        "nodes": f"{est.nodes} / {logged.nodes}",
        "rss_est_mib": est.held_bytes / MiB,
        "rss_mib": logged.rss_growth_bytes / MiB,
        "compute_at_init": logged.compute_at_init,
    }


def images(name: str) -> list[tuple[tuple[int, int], bool]]:
    """The images a projector is measured with, and whether without flash attention too: the one the
    plan counts; for a Qwen projector also PHOTO (without flash attention only there: at the largest
    image softmax(KQ) is 1 GiB a head)."""
    kind = name.split("-")[0]
    return [(largest(kind), kind not in QWEN)] + ([(PHOTO, True)] if kind in QWEN else [])


def smollm2() -> Path:
    """The default model, fetched (once) through runner's own catalog entry."""
    from runner.hub.catalog import load_catalog
    from runner.hub.fetch import locate
    from runner.hub.refs import from_entry

    return locate(from_entry(load_catalog().default_entry))


def _pct(est: float, real: float) -> str:
    return f"{(est - real) / real * 100:+.1f}%"


def _cell(est: float, log: float) -> str:
    """estimate / log in MiB, and the error where the log's two decimals can tell one."""
    error = f" ({(est - log) / log * 100:+.2f}%)" if log >= 1 else " (log: 2 decimals)"
    return f"{est:.3f} / {log:.2f}{error}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="the text model (default: SmolLM2)")
    parser.add_argument("--only", default="", help="comma-separated projector names")
    args = parser.parse_args(argv)
    if args.model is None:
        args.model = smollm2()
    names = [*mtp.KINDS, *SYNTHETIC]
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    print(
        "| projector | image | weights: estimate / log | compute: estimate / log | without flash attention "
        "| nodes | held on the CPU: estimate / peak RSS growth |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = write(name, args.model, Path(tmp))
            for i, (image, no_fa) in enumerate(images(name)):
                r = row(name, args.model, path, image, no_fa)
                cells = [
                    _cell(r["weights_est_mib"], r["weights_log_mib"]),
                    _cell(r["compute_est_mib"], r["compute_log_mib"]),
                    _cell(r["no_fa_est_mib"], r["no_fa_log_mib"]) if r["no_fa_log_mib"] is not None else "-",
                ]
                held = r["rss_est_mib"], r["rss_mib"]  # the plan's figure: for the first image only
                rss = f"{held[0]:.1f} / {held[1]:.1f} ({_pct(*held)})" if i == 0 else "-"
                print(f"| {name} | {r['image']} | {' | '.join(cells)} | {r['nodes']} | {rss} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
