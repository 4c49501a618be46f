"""A vision projector ("mmproj") checked from its header before libmtmd ever opens it.

The pinned libmtmd (tools/mtmd/clip.cpp) trusts the file: a key of another GGUF type than the one it
reads aborts the process in gguf's getters (an f64 epsilon, an i32 image size), and a tensor its
graph needs but loads as optional is dereferenced as NULL (a missing mm.2.weight segfaults in
clip_n_mmproj_embd). So check_projector compares the header with what clip.cpp reads for the
projector types runner supports, mlp (LLaVA's), gemma3, idefics3 (SmolVLM's), qwen2vl_merger
(Qwen2-VL's) and qwen2.5vl_merger (Qwen2.5-VL's), refuses everything else in one line
(InvalidModelFile, naming the file and its problem), and says what an image costs (ProjectorInfo).

The Qwen ones size each image themselves (mtmd-image.cpp 772: rounded to 2 x 2 patches, between 8
and 4096 such tokens) and are made for text models with M-RoPE positions (Qwen2-VL's): an image of
nx x ny tokens takes max(nx, ny) positions there (mtmd.cpp 2536).

Line numbers are the pinned clip.cpp's (llama-cpp-python 0.3.36), models/llava.cpp's,
models/siglip.cpp's and models/qwen2vl.cpp's. Shapes are in ggml order (ne[0] first), trailing 1s
ignored.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from runner.errors import InvalidModelFile
from runner.gguf.header import DEFAULT_LIMITS, GGML_TYPES, GGUF_MAGIC, GGUFError, GGUFHeader, TensorInfo
from runner.gguf.reader import _ARRAY, _I32, _I64, _U32, VALUE_TYPES, _Reader
from runner.gguf.sources import RangeSource, open_source

SUPPORTED = ("mlp", "gemma3", "idefics3", "qwen2vl_merger", "qwen2.5vl_merger")
SIGLIP = ("gemma3", "idefics3")  # build_vit then a projection (models/siglip.cpp)
QWEN = ("qwen2vl_merger", "qwen2.5vl_merger")  # models/qwen2vl.cpp; mlp: models/llava.cpp
# The Qwen ones' image tokens: between 8 and 4096 (clip.cpp 1678), each 2 x 2 patches (qwen2vl.cpp 181)
QWEN_MIN_TOKENS, QWEN_MAX_TOKENS, QWEN_WARMUP_SIDE = 8, 4096, 46  # warmup: 46 x 46 tokens (1679)

# Every key clip.cpp reads for a vision projector of these types, with the GGUF type its getter
# asserts (gguf_get_val_u32 and friends abort on any other) and whether it must be there.
# fmt: off
KEYS: dict[str, tuple[str, bool]] = {
    "general.name":                             ("str", False),       # 1207
    "general.description":                      ("str", False),       # 1209
    "clip.has_vision_encoder":                  ("bool", True),       # 1221; clip_init 4012
    "clip.has_audio_encoder":                   ("bool", False),      # 1222
    "clip.has_gen_audio_encoder":               ("bool", False),      # 1223
    "clip.projector_type":                      ("str", False),       # 1270
    "clip.vision.projector_type":               ("str", False),       # 1275, when the one above is empty
    "clip.vision.embedding_length":             ("u32", True),        # 1306
    "clip.vision.attention.head_count":         ("u32", True),        # 1307
    "clip.vision.attention.head_dim":           ("u32", False),       # 1308
    "clip.vision.feed_forward_length":          ("u32", True),        # 1309
    "clip.vision.block_count":                  ("u32", True),        # 1310
    "clip.vision.projection_dim":               ("u32", True),        # 1311
    "clip.vision.attention.layer_norm_epsilon": ("f32", True),        # 1312
    "clip.vision.attention.head_count_kv":      ("u32", False),       # 1316
    "clip.vision.image_size":                   ("u32", True),        # 1319
    "clip.vision.patch_size":                   ("u32", True),        # 1320
    "clip.minicpmv_version":                    ("i32", False),       # 1321
    "clip.minicpmv_query_num":                  ("u32", False),       # 1322
    "clip.vision.image_grid_pinpoints":         ("arr[i32]", False),  # 1358
    "clip.use_gelu":                            ("bool", False),      # 1378
    "clip.use_silu":                            ("bool", False),      # 1379
    "clip.vision.mm_patch_merge_type":          ("str", False),       # 1397
    "clip.vision.image_mean":                   ("arr[f32]", True),   # 1406; 1408: at least 3
    "clip.vision.image_std":                    ("arr[f32]", True),   # 1407
    "clip.vision.feature_layer":                ("arr[i32]", False),  # 1419
    "clip.vision.projector.scale_factor":       ("u32", False),       # 1641 (gemma3), 1511 (idefics3)
    "clip.vision.preproc_image_size":           ("u32", False),       # 1512 (idefics3: the longest edge)
    "clip.vision.spatial_merge_size":           ("u32", False),       # 1675 (qwen)
    "clip.vision.n_wa_pattern":                 ("u32", False),       # 1676 (required for qwen2.5vl)
}
# fmt: on
INT32_MAX = (1 << 31) - 1  # get_u32 refuses more (3882)

# ggml types by what an op does with the tensor on the CPU backend. Added to or multiplied into F32
# activations (biases, norms, gemma3's position embeddings): the binary ops take only F32 there.
VECTOR = frozenset({"F32"})
CONV = frozenset({"F32", "F16"})  # the patch embedding: im2col writes the kernel's type (build_inp, 574)
DENSE = frozenset({"F32", "F16", "BF16"})  # gemma3's input projection is transposed, then made contiguous
# Matrices (ggml_mul_mat, ggml_get_rows): those, and every block-quantized weight type.
QUANT = frozenset(name for name, block, _ in GGML_TYPES.values() if block > 1) - {"Q8_1", "Q8_K"}
MATRIX = DENSE | QUANT

# Per-block tensors build_vit (clip.cpp 337-568) uses when present, which gemma3 and idefics3 files
# never have (runner.memory.projector's graph leaves them out).
SIGLIP_NEVER = ("attn_qkv", "attn_q_norm", "attn_k_norm", "ls1", "ls2", "out_scale", "attn_post_norm",
                "ffn_post_norm", "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
                "attn_sinks")  # fmt: skip


@dataclass(frozen=True)
class ProjectorInfo:
    """What one image costs through this projector."""

    projector_type: str  # one of SUPPORTED
    # every image (idefics3: every tile of one) is resized to image_size x image_size; the Qwen ones
    # size each image themselves, and image_size is only the square image_tokens is counted for (the
    # file's image_size, or where it is 0, "dynamic", libmtmd's warmup image: 46 x 46 tokens)
    image_size: int
    patch_size: int
    # embeddings one image (idefics3: one tile) becomes in the text model's context; the Qwen ones:
    # one image of image_size x image_size (others: more or fewer, from 8 up to 4096)
    image_tokens: int
    projection_width: int  # each embedding's width: the text model's n_embd
    weights_bytes: int  # the tensors' bytes, as clip.cpp counts its model size (1244)
    non_causal: bool  # the text model attends to image tokens non-causally (mtmd_decode_use_non_causal)
    # made for a text model with M-RoPE positions (qwen2vl): its images then take max(nx, ny) positions
    # for nx x ny tokens. libmtmd decides by the text model's rope (mtmd.cpp 549), not by this
    mrope: bool = False


def read_key_types(source: str | os.PathLike[str] | RangeSource) -> dict[str, str]:
    """Each metadata key's GGUF type ("u32", "f32", "arr[i32]" ...), which read_header's values (Python
    ints and floats) cannot tell apart: the same bounded reader, walking the key-value section again."""
    src = open_source(source)
    r = _Reader(src, DEFAULT_LIMITS)
    if not r.fill(4) or r.buf[:4] != GGUF_MAGIC:
        raise GGUFError(f"{src.name} is not a GGUF file")
    r.pos = 4
    r.unpack(_U32, "version")
    r.unpack(_I64, "tensor count")
    n_kv = r.count(r.unpack(_I64, "key-value count"), DEFAULT_LIMITS.max_kv, 14, "key-value count", 16)
    types: dict[str, str] = {}
    for _ in range(n_kv):
        key = r.string(DEFAULT_LIMITS.max_string_bytes, "key")
        vtype = r.unpack(_I32, f"type of {key!r}")
        name = VALUE_TYPES[vtype] if 0 <= vtype < len(VALUE_TYPES) else str(vtype)
        if vtype == _ARRAY:
            etype = r.unpack(_I32, f"array type of {key!r}")
            r.pos -= 4  # r.value reads it again; take() leaves those 4 bytes in buf
            name = f"arr[{VALUE_TYPES[etype] if 0 <= etype < len(VALUE_TYPES) else etype}]"
        r.value(vtype, key)
        types[key] = name
    return types


class Check:
    """One header against clip.cpp's expectations; every failure is one line naming the file."""

    what = "projector"  # the kind of file a failure names

    def __init__(self, header: GGUFHeader, types: Mapping[str, str]) -> None:
        self.header = header
        self.types = types
        self.by_name = {t.name: t for t in header.tensors}
        self.keys: Mapping[str, tuple[str, bool]] = KEYS

    def fail(self, problem: str) -> NoReturn:
        raise InvalidModelFile(f"{self.header.source} is not a usable {self.what}: {problem}")

    def key(self, key: str) -> Any:
        want, required = self.keys[key]
        if key not in self.header.metadata:
            if required:
                self.fail(f"it has no {key} ({want})")
            return None
        got = self.types.get(key)
        if got != want:
            self.fail(f"{key} is {got}, clip.cpp reads it as {want} and would abort")
        value = self.header.metadata[key]
        if want == "u32":
            self.bound(key, value)
        return value

    def bound(self, key: str, value: int) -> None:
        if value > INT32_MAX:
            self.fail(f"{key} is {value}, more than clip.cpp takes ({INT32_MAX})")

    def tensor(
        self, name: str, shape: tuple[int, ...], types: frozenset[str], required: bool = True
    ) -> TensorInfo | None:
        t = self.by_name.get(name)
        if t is None:
            if required:
                self.fail(f"it has no tensor {name}")
            return None
        if _squeeze(t.shape) != _squeeze(shape):
            self.fail(f"tensor {name} has shape {list(t.shape)}, clip.cpp's graph needs {list(shape)}")
        if t.type_name not in types:
            self.fail(f"tensor {name} is {t.type_name}; this use of it takes {', '.join(sorted(types))}")
        return t


def _out_width(t: TensorInfo | None, in_dim: int, n_in: int, text_n_embd: int | None) -> int:
    """A projection's output width as its file has it, where its input dimension (in_dim) is right;
    else the text model's (or, for a transposed one, its in_dim's) so that the shape check names the
    shape it needed."""
    if t is None or len(t.shape) != 2:
        return text_n_embd or 0
    if t.shape[in_dim] != n_in:
        return text_n_embd or t.shape[in_dim]
    return t.shape[1 - in_dim]


def _squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    while shape and shape[-1] == 1:
        shape = shape[:-1]
    return shape


def qwen_image_tokens(side: int, patch: int) -> tuple[int, int]:
    """The tokens a square picture of `side` px becomes through a Qwen projector, and its side as
    resized: calc_size_preserved_ratio (mtmd-image.cpp 122) in its float arithmetic, rounded to whole
    tokens of 2 x 2 patches and kept between QWEN_MIN_TOKENS and QWEN_MAX_TOKENS of them (clip.cpp
    1678, clip-model.h 192)."""
    align = 2 * patch
    min_pixels, max_pixels = QWEN_MIN_TOKENS * align * align, QWEN_MAX_TOKENS * align * align
    bar = max(align, math.floor(_f32(side / align) + 0.5) * align)  # std::round: half away from zero
    if bar * bar > max_pixels:
        beta = _f32(math.sqrt(_f32(_f32(side * side) / max_pixels)))
        bar = max(align, math.floor(_f32(_f32(side / beta) / align)) * align)
    elif bar * bar < min_pixels:
        beta = _f32(math.sqrt(_f32(min_pixels / _f32(side * side))))
        bar = math.ceil(_f32(_f32(side * beta) / align)) * align
    return (bar // align) ** 2, bar


def _f32(x: float) -> float:
    """x rounded to a C float, as each float operation of clip.cpp's rounds it (a double's exact
    result rounded once more is the float's for + - * / and sqrt)."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def check_projector(
    header: GGUFHeader,
    text_n_embd: int | None = None,
    *,
    key_types: Mapping[str, str] | None = None,
    omni: bool = False,
) -> ProjectorInfo:
    """Check a projector's header (from read_header) against what the pinned clip.cpp reads for its
    type, and against the text model's embedding width when given; raise InvalidModelFile in one line
    on the first problem. key_types defaults to read_key_types(header.source). `omni`: the vision
    half of a file with both encoders, whose audio half runner.gguf.audio_projector checks."""
    header.check_complete()
    _check_is_projector(header)
    c = Check(header, read_key_types(header.source) if key_types is None else key_types)
    kind = _check_kind(c, omni)
    vit = _check_sizes(c, kind)
    _check_embeddings(c, vit)
    _check_blocks(c, vit)
    if kind == "gemma3":
        tokens, width = _check_gemma3_projection(c, vit, text_n_embd)
    elif kind == "idefics3":
        tokens, width = _check_idefics3_projection(c, vit, text_n_embd)
    else:
        tokens, width = _check_mlp_projection(c, vit, text_n_embd)
    if text_n_embd is not None and width != text_n_embd:  # mtmd.cpp 604 refuses it
        c.fail(f"it projects into width {width}, the text model's is {text_n_embd}")
    weights = sum(t.nbytes for t in header.tensors)
    # mtmd.cpp 2188: gemma3's image tokens are decoded non-causally
    return ProjectorInfo(
        kind, vit.counted_side, vit.patch, tokens, width, weights, non_causal=kind == "gemma3", mrope=vit.qwen
    )


def _check_is_projector(header: GGUFHeader) -> None:
    """A file with no projector type at all: not a projector (a text model given as --mmproj?)."""
    meta = header.metadata
    if (meta.get("clip.projector_type") or meta.get("clip.vision.projector_type")) is None:
        arch = header.architecture
        model = f" (general.architecture is {arch}: a text model?)" if arch not in (None, "clip") else ""
        raise InvalidModelFile(f"{header.source} is not a projector: it has no clip.projector_type{model}")


def _check_kind(c: Check, omni: bool = False) -> str:
    """The projector type, one runner supports, of a vision-only file (or the vision half of a
    qwen2.5o one: qwen2.5vl_merger, clip.cpp 1292); every key's type checked."""
    kind = c.key("clip.projector_type") or c.key("clip.vision.projector_type")
    if omni and kind == "qwen2.5o":
        kind = "qwen2.5vl_merger"
    if kind not in SUPPORTED:
        names = f"{', '.join(SUPPORTED[:-1])} and {SUPPORTED[-1]}"
        c.fail(f"projector type {kind!r} is not supported (runner supports {names})")
    if c.key("clip.has_vision_encoder") is not True:
        c.fail("clip.has_vision_encoder is not true: it has no vision encoder")
    if (c.key("clip.has_audio_encoder") and not omni) or c.key("clip.has_gen_audio_encoder"):
        c.fail("it also has an audio encoder, which runner does not check")
    for key in KEYS:
        c.key(key)  # every type, before any value is used
    return str(kind)


@dataclass(frozen=True)
class _Vit:
    """The vision transformer's sizes as the header gives them, once _check_sizes has checked them."""

    kind: str  # one of SUPPORTED
    e: int  # embedding_length
    n_head: int
    n_head_kv: int
    d_head: int
    n_ff: int
    n_layer: int
    image: int  # image_size (0: dynamic, the Qwen ones only)
    patch: int
    layers: list[int]  # clip.vision.feature_layer

    @property
    def qwen(self) -> bool:
        return self.kind in QWEN

    @property
    def siglip(self) -> bool:
        return self.kind in SIGLIP

    @property
    def n_side(self) -> int:
        return self.image // self.patch

    @property
    def n_patches(self) -> int:
        return self.n_side * self.n_side

    @property
    def counted_side(self) -> int:
        """The square image_tokens is counted for: image_size; image_size 0: the warmup's (Qwen)."""
        return (self.image or QWEN_WARMUP_SIDE * 2 * self.patch) if self.qwen else self.image


def _check_sizes(c: Check, kind: str) -> _Vit:
    """The vision transformer's sizes and the image settings, as clip.cpp would take them."""
    meta = c.header.metadata
    e, n_head = meta["clip.vision.embedding_length"], meta["clip.vision.attention.head_count"]
    n_ff, n_layer = meta["clip.vision.feed_forward_length"], meta["clip.vision.block_count"]
    image, patch = meta["clip.vision.image_size"], meta["clip.vision.patch_size"]
    d_head = meta.get("clip.vision.attention.head_dim") or (e // n_head if n_head else 0)  # 260
    n_head_kv = meta.get("clip.vision.attention.head_count_kv", n_head)  # 1315
    if not (e > 0 and n_head > 0 and d_head > 0 and n_ff > 0 and n_layer > 0):
        sizes = f"{e}, {n_head}, {n_ff}, {n_layer}"
        c.fail(f"embedding_length, head_count, feed_forward_length and block_count must be over 0: {sizes}")
    if "clip.vision.attention.head_dim" not in meta and e % n_head:
        c.fail(f"embedding_length {e} is not a multiple of head_count {n_head}")
    if not (n_head_kv > 0 and n_head % n_head_kv == 0):
        c.fail(f"head_count {n_head} is not a multiple of head_count_kv {n_head_kv}")
    qwen = kind in QWEN
    lowest = 0 if qwen else 1  # 2043-2049; 0: a dynamic size, which only qwen's have
    if not lowest <= image <= 8192:
        c.fail(f"image_size {image} is not in {lowest}..8192")
    if not 0 < patch <= (65535 if qwen else min(image, 65535)):  # 2051
        c.fail(f"patch_size {patch} is not in 1..{65535 if qwen else f'image_size ({image})'}")
    if len(meta["clip.vision.image_mean"]) < 3 or len(meta["clip.vision.image_std"]) < 3:  # 1408
        c.fail("image_mean and image_std need 3 values each")
    if meta.get("clip.use_gelu") and meta.get("clip.use_silu"):  # 1380
        c.fail("both clip.use_gelu and clip.use_silu are true")
    if meta.get("clip.vision.image_grid_pinpoints"):  # 1359; mtmd.cpp 642: then images are tiled
        c.fail("it tiles images (clip.vision.image_grid_pinpoints), which runner does not support")
    layers = meta.get("clip.vision.feature_layer") or []
    if any(v > n_layer for v in layers):  # 1421
        c.fail(f"clip.vision.feature_layer {list(layers)} goes past block_count {n_layer}")
    if qwen:
        _check_qwen_keys(c, kind, d_head)
    return _Vit(kind, e, n_head, n_head_kv, d_head, n_ff, n_layer, image, patch, layers)


def _check_embeddings(c: Check, vit: _Vit) -> None:
    """The vision transformer's input: patch, class and position embeddings, and its outer norms
    (load_tensors 2253-2330; build_inp 572; llava.cpp and build_vit use them)."""
    e, patch, kind = vit.e, vit.patch, vit.kind
    c.tensor("v.patch_embd.weight", (patch, patch, 3, e), CONV)  # optional at 2262, used at 574
    if vit.qwen:  # the second frame's kernel, optional at 2263, used for a still image too (qwen2vl.cpp 16)
        c.tensor("v.patch_embd.weight.1", (patch, patch, 3, e), CONV)
        for name in ("v.patch_embd.bias", "v.class_embd"):  # no position embeddings: M-RoPE (qwen2vl.cpp 130)
            if name in c.by_name:
                c.fail(f"it has {name}, which {kind}'s graph asserts it has not (qwen2vl.cpp 33-34)")
    else:
        c.tensor("v.patch_embd.bias", (e,), VECTOR, required=False)
    class_embd = kind == "mlp" and c.tensor("v.class_embd", (e,), VECTOR, required=False) is not None
    if vit.siglip:  # added to the patches as they are (build_vit 349)
        c.tensor("v.position_embd.weight", (e, vit.n_patches), VECTOR)
    elif not vit.qwen:  # rows 0..n_pos-1 taken (llava.cpp 39-43): at least n_pos rows
        n_pos = vit.n_patches + class_embd
        pos = c.by_name.get("v.position_embd.weight")
        rows = pos.shape[1] if pos is not None and len(pos.shape) == 2 and pos.shape[1] >= n_pos else n_pos
        c.tensor("v.position_embd.weight", (e, rows), MATRIX)
    for norm in ("pre_ln", "post_ln"):
        for part in ("weight", "bias"):
            c.tensor(f"v.{norm}.{part}", (e,), VECTOR, required=False)


def _check_blocks(c: Check, vit: _Vit) -> None:
    """The vision transformer's blocks: attention, norms and feed-forward, each tensor as the graph
    uses it."""
    e, n_ff, qwen = vit.e, vit.n_ff, vit.qwen
    qkv = vit.n_head * vit.d_head
    kv = (vit.n_head_kv if vit.siglip else vit.n_head) * vit.d_head  # llava.cpp 88 reshapes K and V by n_head
    if vit.siglip:
        for name in c.by_name:
            parts = name.split(".")
            if parts[:2] == ["v", "blk"] and len(parts) > 3 and parts[3] in SIGLIP_NEVER:
                c.fail(f"it has {name}, which a {vit.kind} projector does not have")
    for i in range(vit.n_layer):
        blk = f"v.blk.{i}"
        # llava.cpp 72-89 takes separate q, k and v; so does build_vit (424-447) without attn_qkv, and
        # qwen2vl.cpp 114-119, which adds their biases whether there are any (a missing one segfaults)
        for part, width_in, width_out in (("attn_q", e, qkv), ("attn_k", e, kv), ("attn_v", e, kv)):
            c.tensor(f"{blk}.{part}.weight", (width_in, width_out), MATRIX)
            c.tensor(f"{blk}.{part}.bias", (width_out,), VECTOR, required=qwen)
        c.tensor(f"{blk}.attn_out.weight", (qkv, e), MATRIX)  # required at 2283
        c.tensor(f"{blk}.attn_out.bias", (e,), VECTOR, required=False)
        for norm in ("ln1", "ln2"):
            for part in ("weight", "bias"):
                c.tensor(f"{blk}.{norm}.{part}", (e,), VECTOR, required=False)
        # 2335-2360: up and down written the other way round (ffn_down's rows n_embd) are swapped back
        up, down = "ffn_up", "ffn_down"
        found = c.by_name.get(f"{blk}.ffn_down.weight")
        if found is not None and found.shape[0] == e and c.by_name.get(f"{blk}.ffn_up.weight") is not None:
            up, down = down, up
        c.tensor(f"{blk}.{up}.weight", (e, n_ff), MATRIX)  # required at 2312 and 2316
        c.tensor(f"{blk}.{up}.bias", (n_ff,), VECTOR, required=False)
        c.tensor(f"{blk}.{down}.weight", (n_ff, e), MATRIX)
        c.tensor(f"{blk}.{down}.bias", (e,), VECTOR, required=False)
        c.tensor(f"{blk}.ffn_gate.weight", (e, n_ff), MATRIX, required=False)  # build_ffn 627
        c.tensor(f"{blk}.ffn_gate.bias", (n_ff,), VECTOR, required=False)


def _check_gemma3_projection(c: Check, vit: _Vit, text_n_embd: int | None) -> tuple[int, int]:
    """gemma3's pooled, normed and projected patches: (tokens an image becomes, their width)."""
    e, n_side = vit.e, vit.n_side
    merge = c.header.metadata.get("clip.vision.projector.scale_factor", 4)  # 1638-1641
    if not 0 < merge < 65536 or n_side % merge:  # 2060; the pool (siglip.cpp 28) against 4223
        c.fail(f"scale_factor {merge} does not divide the {n_side} patches a side")
    c.tensor("mm.soft_emb_norm.weight", (e,), VECTOR)  # 2631; siglip.cpp 34
    proj = c.by_name.get("mm.input_projection.weight")  # 2630; siglip.cpp 38: multiplied transposed
    width = _out_width(proj, 1, e, text_n_embd)  # its ne[0]: clip_n_mmproj_embd 6009
    c.tensor("mm.input_projection.weight", (width, e), DENSE)
    return vit.n_patches // (merge * merge), width  # clip_n_output_tokens 4213-4223


def _check_idefics3_projection(c: Check, vit: _Vit, text_n_embd: int | None) -> tuple[int, int]:
    """idefics3's pixel shuffle and projection: (tokens a tile becomes, their width)."""
    meta, e, n_side = c.header.metadata, vit.e, vit.n_side
    # n_merge defaults to 1 (1511), which build_patch_merge_permute asserts against (902); a side
    # it does not divide is padded there but not in clip_n_output_tokens (4223): more embeddings
    # than libmtmd's buffer for them
    merge = meta.get("clip.vision.projector.scale_factor", 1)
    if not 1 < merge < 65536 or n_side % merge:
        c.fail(f"scale_factor {merge} is not over 1 or does not divide the {n_side} patches a side")
    longest = meta.get("clip.vision.preproc_image_size", 0)  # mtmd-image.cpp 1060: tiles of it
    if not 0 <= longest <= 8192:
        c.fail(f"preproc_image_size {longest} is not in 0..8192")
    fc = c.by_name.get("mm.model.fc.weight")  # required at 2764; siglip.cpp 45: the pixel shuffle's
    width = _out_width(fc, 0, e * merge * merge, text_n_embd)  # rows times it; its ne[1] (6016)
    c.tensor("mm.model.fc.weight", (e * merge * merge, width), MATRIX)
    return vit.n_patches // (merge * merge), width  # per tile (clip_n_output_tokens 4216)


def _check_mlp_projection(c: Check, vit: _Vit, text_n_embd: int | None) -> tuple[int, int]:
    """mm.0 -> GELU -> mm.2: LLaVA's projection, or Qwen's merger (required at 2499-2502): (tokens an
    image of vit.counted_side becomes, their width)."""
    e, qwen = vit.e, vit.qwen
    if vit.kind == "mlp" and "mm.3.weight" in c.by_name:  # 2384: then it is MLP_NORM
        c.fail("it has mm.3.weight, which makes it an mlp_norm projector (not supported)")
    stacked = len({v for v in vit.layers if v >= 0})  # llava.cpp 29, 133-146: feature layers concatenated
    # qwen: each 2 x 2 patches' embeddings in a row (qwen2vl.cpp 181), whatever feature_layer says
    width_in = 4 * e if qwen else e * max(stacked, 1)
    mm0 = c.by_name.get("mm.0.weight")  # optional at 2371, used at llava.cpp 166
    hidden = mm0.shape[1] if mm0 is not None and len(mm0.shape) > 1 else 0
    c.tensor("mm.0.weight", (width_in, hidden), MATRIX)
    c.tensor("mm.0.bias", (hidden,), VECTOR)  # llava.cpp 167
    mm2 = c.by_name.get("mm.2.weight")  # optional at 2377, dereferenced by clip_n_mmproj_embd 5979
    width = _out_width(mm2, 0, hidden, text_n_embd)  # its ne[1]
    c.tensor("mm.2.weight", (hidden, width), MATRIX)
    c.tensor("mm.2.bias", (width,), VECTOR)  # llava.cpp 172; qwen's width: its ne[0] (5997)
    tokens = vit.n_patches  # clip_n_output_tokens 4139: one per patch
    if qwen:  # one per 2 x 2 patches of the image as resized (4199); image_size 0: the warmup's
        tokens = qwen_image_tokens(vit.counted_side, vit.patch)[0]
    return tokens, width


def _check_qwen_keys(c: Check, kind: str, d_head: int) -> None:
    """What qwen2vl_merger and qwen2.5vl_merger files must have beyond the common keys: what their
    graph (models/qwen2vl.cpp) and its inputs (clip.cpp 4833-5022) take for granted."""
    patch = c.header.metadata["clip.vision.patch_size"]
    if QWEN_MAX_TOKENS * (2 * patch) ** 2 > INT32_MAX:  # clip-model.h 193-195 count pixels in an int
        c.fail(f"patch_size {patch} is too large: clip.cpp's image limits (in pixels) would overflow")
    merge = c.header.metadata.get("clip.vision.spatial_merge_size", 2)  # 1673-1675
    if merge != 2:  # qwen2vl.cpp 6-7 asserts sides of 2 patches (aligned to `merge` ones, mtmd-image.cpp
        # 779), 181 and clip.cpp 4846 merge 2 x 2 whatever it says: 1 or 3 abort, 4 misplaces them
        c.fail(f"clip.vision.spatial_merge_size is {merge}; clip.cpp's {kind} graph merges 2 x 2 patches")
    windows = c.key("clip.vision.n_wa_pattern")
    if kind == "qwen2.5vl_merger" and windows is None:  # 1676: libmtmd refuses it
        c.fail("it has no clip.vision.n_wa_pattern (u32), which clip.cpp requires of qwen2.5vl_merger")
    if kind == "qwen2vl_merger" and windows:  # qwen2vl.cpp 81-97, whose indices clip.cpp 4833 never sets
        c.fail(f"clip.vision.n_wa_pattern is {windows}: qwen2vl_merger's window attention would abort")
    if windows == 1:  # every block attends fully (qwen2vl.cpp 104): no window_mask for 4994 to set (4509)
        c.fail("clip.vision.n_wa_pattern is 1: clip.cpp would abort setting a window mask no block uses")
    if d_head % 4:  # qwen2vl.cpp 46, 132: ropes d_head / 2 dims in 4 sections; ops.cpp 6356 asserts even
        c.fail(f"its head dimension {d_head} is not a multiple of 4, as its ViT's M-RoPE needs")
