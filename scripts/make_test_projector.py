"""Write a small random-weight vision projector (an "mmproj" GGUF) for a text model.

The pinned libmtmd loads it beside the text model and turns one image into a few image tokens:
enough to test images end to end without a real vision model. Two kinds, each the smallest file
clip.cpp (tools/mtmd/clip.cpp in the pinned llama.cpp) takes for its projector type:

- mlp (LLaVA's): a CLIP ViT of width 32, 2 heads, block_count 2 (the llava graph runs one block
  fewer than written), an FFN of width 64, then mm.0 -> GELU -> mm.2 into the text model's width;
  all F32. Images of 28 px in patches of 14: 4 image tokens; 228 KB for SmolLM2 (width 576).
- gemma3: a SigLIP-style ViT at 32 px in patches of 8 (4 x 4 patches), 2 blocks, pooled by its
  clip.vision.projector.scale_factor 2 into 4 image tokens, an RMS norm and mm.input_projection into
  the text model's width; F16 matrices and F32 vectors, as the converter writes them. libmtmd
  decodes its image tokens non-causally. 90 KB for SmolLM2.
- idefics3 (SmolVLM's): the same ViT (F32 throughout) at tiles of 32 px in patches of 8, pixel-shuffled
  by scale_factor 2 into 4 image tokens a tile and mm.model.fc into the text model's width. Its
  preproc_image_size 64 makes libmtmd cut an image into up to 2 x 2 tiles plus the whole image: a
  64 x 48 image is 5 image chunks, with text between. libmtmd marks them with SmolVLM's own tokens
  (<fake_token_around_image>, <global-img>): --vocab-out writes a copy of the text model that has them.
- qwen2vl (qwen2vl_merger) and qwen25vl (qwen2.5vl_merger): Qwen2-VL's and Qwen2.5-VL's dynamic-
  resolution ViT (models/qwen2vl.cpp) of the same width, 2 blocks, in Qwen's patches of 14 px, two
  patch kernels (the converter's two frames) and no position embeddings (the graph ropes Q and K by
  each patch's row and column instead), then mm.0 -> GELU -> mm.2 over each 2 x 2 patches merged:
  one image token per 28 x 28 px. libmtmd sizes each image itself (mtmd-image.cpp 772: rounded to
  28 px, between 8 and 4096 tokens): 112 x 112 px is 4 x 4 tokens, 112 x 56 is 4 x 2, and the 40 x 30
  image of tests/test_projector.py 4 x 3 (raised to 8 tokens at least: 112 x 84). qwen2vl has
  LayerNorms and a GELU FFN; qwen25vl RMS norms, a gated SiLU FFN (ffn_gate) and window attention
  in every other block (clip.vision.n_wa_pattern 2; windows of 112 px, 4 x 4 tokens). F16 matrices,
  F32 vectors; about 300 KB for SmolLM2. They are made for a text model with M-RoPE positions: --mrope-out
  writes a qwen2vl-architecture copy of the text model (as_qwen2vl), with which libmtmd gives an
  image of nx x ny tokens max(nx, ny) positions (mtmd.cpp 2536).
- qwen25o (clip.projector_type qwen2.5o, Qwen2.5-Omni's): one file with both encoders, which libmtmd
  opens twice: the qwen25vl ViT above for images, and for audio a whisper encoder of width 40, 2 heads,
  2 blocks over 128 mel bins and 1500 positions with Qwen2-Audio's one projection (mm.a.fc): 750
  audio tokens a 30-second window (docs/audio.md). About 790 KB for SmolLM2.
- qwen3a (clip.audio.projector_type, Qwen3-ASR's): three stride-2 3 x 3 convolutions of 8 channels
  over each 1-second chunk of 128 mel bins, a.conv_out into width 40, 2 heads, 2 blocks, then
  mm.a.mlp.1 -> GELU -> mm.a.mlp.2: 13 audio tokens a started second. About 570 KB for SmolLM2.

The projection's output width is the text model's embedding width, read from MODEL.gguf's header
(runner's own bounded reader). Weights are random but deterministic: the same seed, the same bytes.

    python scripts/make_test_projector.py OUT.gguf --for MODEL.gguf [--seed N]
        [--type mlp|gemma3|idefics3|qwen2vl|qwen25vl|qwen25o|qwen3a] [--vocab-out MODEL-idefics3.gguf]
        [--mrope-out MODEL-qwen2vl.gguf]

Tests build malformed variants from projector_spec's output (a key's type changed, a tensor
dropped or transposed) and write them with write_projector.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType, GGUFWriter

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KINDS = ("mlp", "gemma3", "idefics3", "qwen2vl", "qwen25vl")  # vision
AUDIO_KINDS = ("qwen25o", "qwen3a")  # an audio encoder (qwen25o: and the qwen25vl one); docs/audio.md
QWEN3A_CONV = 8  # qwen3a's convolution channels (Qwen3-ASR's: 480)
AUDIO_WIDTH, AUDIO_MEL, AUDIO_POS = 40, 128, 1500  # an audio encoder's: not a power of two (docs/audio.md)
QWEN = {"qwen2vl": "qwen2vl_merger", "qwen25vl": "qwen2.5vl_merger"}  # --type -> clip.projector_type
# SmolVLM's tokens that libmtmd looks up for an idefics3 image (mtmd.cpp 750), in place of unused ones
IDEFICS3_TOKENS = {"<repo_name>": "<fake_token_around_image>", "<reponame>": "<global-img>"}
VIT_WIDTH = 32
HEADS = 2
FFN_WIDTH = 64  # unlike the ViT width: clip.cpp swaps ffn_up and ffn_down when ffn_down's rows are n_embd
EPS = 1e-6
MEAN_STD = [0.5, 0.5, 0.5]
QWEN_PATCH = 14  # Qwen's own: a token is 2 x 2 patches, 28 x 28 px
QWEN_IMAGE = 112  # image_size: only what check_projector counts an image at (4 x 4 tokens)
# as_qwen2vl's M-RoPE sections (t, h, w, e) over a head's 32 rotated pairs: Qwen2-VL's 16, 24, 24 of
# 64, halved; llama.cpp rotates pair i by the section's position that i falls in (ops.cpp 6237)
MROPE_SECTIONS = [8, 12, 12, 0]


@dataclass(frozen=True)
class KV:
    """One metadata key with its GGUF type (and an array's element type)."""

    key: str
    value: Any
    vtype: GGUFValueType
    sub_type: GGUFValueType | None = None


def _u32(key: str, value: int) -> KV:
    return KV(key, value, GGUFValueType.UINT32)


def projector_spec(kind: str, text_n_embd: int, seed: int = 0) -> tuple[list[KV], dict[str, np.ndarray]]:
    """The metadata and tensors of a `kind` projector into a text model of width text_n_embd. Each
    array has numpy's shape, the reverse of ggml's: a matrix ggml reads as [n_in, n_out] is
    (n_out, n_in) here."""
    if kind not in KINDS + AUDIO_KINDS:
        raise ValueError(f"unknown projector type {kind!r}: one of {', '.join(KINDS + AUDIO_KINDS)}")
    if kind in QWEN:
        return _qwen_spec(kind, text_n_embd, seed)
    if kind == "qwen25o":
        return _omni_spec(text_n_embd, seed)
    if kind == "qwen3a":
        return _qwen3a_spec(text_n_embd, seed)
    rng = np.random.default_rng(seed)
    gemma, siglip = kind == "gemma3", kind in ("gemma3", "idefics3")
    image, patch, blocks = (32, 8, 2) if siglip else (28, 14, 2)
    n_patches = (image // patch) ** 2
    e, f = VIT_WIDTH, FFN_WIDTH

    def weight(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    kvs = [
        KV("general.name", f"runner test projector ({kind})", GGUFValueType.STRING),
        KV("clip.has_vision_encoder", True, GGUFValueType.BOOL),
        KV("clip.projector_type", kind, GGUFValueType.STRING),
        KV("clip.use_gelu", siglip, GGUFValueType.BOOL),  # SigLIP's GELU; CLIP's quick GELU for mlp
        _u32("clip.vision.image_size", image),
        _u32("clip.vision.patch_size", patch),
        _u32("clip.vision.embedding_length", e),
        _u32("clip.vision.feed_forward_length", f),
        _u32("clip.vision.projection_dim", text_n_embd),
        _u32("clip.vision.attention.head_count", HEADS),
        KV("clip.vision.attention.layer_norm_epsilon", EPS, GGUFValueType.FLOAT32),
        _u32("clip.vision.block_count", blocks),
        KV("clip.vision.image_mean", MEAN_STD, GGUFValueType.ARRAY, GGUFValueType.FLOAT32),
        KV("clip.vision.image_std", MEAN_STD, GGUFValueType.ARRAY, GGUFValueType.FLOAT32),
    ]
    if siglip:
        kvs.append(_u32("clip.vision.projector.scale_factor", 2))
    if kind == "idefics3":
        kvs.append(_u32("clip.vision.preproc_image_size", 2 * image))

    tensors: dict[str, np.ndarray] = {
        "v.patch_embd.weight": weight(e, 3, patch, patch),  # ggml [P, P, 3, E]
        "v.patch_embd.bias": weight(e),
        "v.position_embd.weight": weight(n_patches, e),  # ggml [E, n_patches]
    }
    if not siglip:
        tensors["v.pre_ln.weight"], tensors["v.pre_ln.bias"] = ones(e), weight(e)
    for i in range(blocks):
        blk = f"v.blk.{i}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{blk}.{part}.weight"], tensors[f"{blk}.{part}.bias"] = weight(e, e), weight(e)
        for norm in ("ln1", "ln2"):
            tensors[f"{blk}.{norm}.weight"], tensors[f"{blk}.{norm}.bias"] = ones(e), weight(e)
        tensors[f"{blk}.ffn_up.weight"], tensors[f"{blk}.ffn_up.bias"] = weight(f, e), weight(f)
        tensors[f"{blk}.ffn_down.weight"], tensors[f"{blk}.ffn_down.bias"] = weight(e, f), weight(e)
    if siglip:
        tensors["v.post_ln.weight"], tensors["v.post_ln.bias"] = ones(e), weight(e)
    if kind == "idefics3":  # ggml [4 E, n_embd_text]: the pixel shuffle's 2 x 2 patches in a row
        tensors["mm.model.fc.weight"] = weight(text_n_embd, 4 * e)
    elif gemma:
        tensors["mm.soft_emb_norm.weight"] = ones(e)
        # ggml [n_embd_text, E]: the graph multiplies by its transpose (models/siglip.cpp)
        tensors["mm.input_projection.weight"] = weight(e, text_n_embd)
        # F16 matrices, F32 vectors and position embeddings (added to F32 activations): the converter's mix
        tensors = {
            k: a.astype(np.float16) if a.ndim > 1 and "position" not in k else a for k, a in tensors.items()
        }
    else:
        tensors["mm.0.weight"], tensors["mm.0.bias"] = weight(e, e), weight(e)
        tensors["mm.2.weight"], tensors["mm.2.bias"] = weight(text_n_embd, e), weight(text_n_embd)
    return kvs, tensors


def _qwen_spec(kind: str, text_n_embd: int, seed: int) -> tuple[list[KV], dict[str, np.ndarray]]:
    """projector_spec's qwen2vl and qwen25vl: the tensors clip.cpp loads for them (2262-2320, 2496-
    2503) as the converter writes them (conversion/qwenvl.py), no patch bias nor class embedding
    (the graph asserts there are none, qwen2vl.cpp 33)."""
    rng = np.random.default_rng(seed)
    rms = kind == "qwen25vl"
    e, f, p = VIT_WIDTH, FFN_WIDTH, QWEN_PATCH

    def weight(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    kvs = [
        KV("general.name", f"runner test projector ({kind})", GGUFValueType.STRING),
        KV("clip.has_vision_encoder", True, GGUFValueType.BOOL),
        KV("clip.projector_type", QWEN[kind], GGUFValueType.STRING),
        _u32("clip.vision.image_size", QWEN_IMAGE),
        _u32("clip.vision.patch_size", p),
        _u32("clip.vision.embedding_length", e),
        _u32("clip.vision.feed_forward_length", f),
        _u32("clip.vision.projection_dim", text_n_embd),
        _u32("clip.vision.attention.head_count", HEADS),
        KV("clip.vision.attention.layer_norm_epsilon", EPS, GGUFValueType.FLOAT32),
        _u32("clip.vision.block_count", 2),
        KV("clip.vision.image_mean", MEAN_STD, GGUFValueType.ARRAY, GGUFValueType.FLOAT32),
        KV("clip.vision.image_std", MEAN_STD, GGUFValueType.ARRAY, GGUFValueType.FLOAT32),
    ]
    if rms:  # SiLU (Qwen2-VL's QuickGELU is clip.cpp's default); full attention every 2nd block
        kvs += [KV("clip.use_silu", True, GGUFValueType.BOOL), _u32("clip.vision.n_wa_pattern", 2)]
    tensors: dict[str, np.ndarray] = {
        "v.patch_embd.weight": weight(e, 3, p, p),  # ggml [P, P, 3, E], one kernel a frame
        "v.patch_embd.weight.1": weight(e, 3, p, p),
    }
    for i in range(2):
        blk = f"v.blk.{i}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{blk}.{part}.weight"], tensors[f"{blk}.{part}.bias"] = weight(e, e), weight(e)
        for norm in ("ln1", "ln2"):
            tensors[f"{blk}.{norm}.weight"] = np.ones(e, dtype=np.float32)
            if not rms:
                tensors[f"{blk}.{norm}.bias"] = weight(e)
        ffn = ("ffn_gate", "ffn_up") if rms else ("ffn_up",)
        for part in ffn:
            tensors[f"{blk}.{part}.weight"], tensors[f"{blk}.{part}.bias"] = weight(f, e), weight(f)
        tensors[f"{blk}.ffn_down.weight"], tensors[f"{blk}.ffn_down.bias"] = weight(e, f), weight(e)
    tensors["v.post_ln.weight"] = np.ones(e, dtype=np.float32)  # the merger's ln_q
    if not rms:
        tensors["v.post_ln.bias"] = weight(e)
    # the merger: each 2 x 2 patches' embeddings in a row (ggml [4 E, 4 E]), then into the text width
    tensors["mm.0.weight"], tensors["mm.0.bias"] = weight(4 * e, 4 * e), weight(4 * e)
    tensors["mm.2.weight"], tensors["mm.2.bias"] = weight(text_n_embd, 4 * e), weight(text_n_embd)
    return kvs, {k: a.astype(np.float16) if a.ndim > 1 else a for k, a in tensors.items()}


def _omni_spec(text_n_embd: int, seed: int) -> tuple[list[KV], dict[str, np.ndarray]]:
    """projector_spec's qwen25o: Qwen2.5-Omni's one file with both encoders (conversion/qwenvl.py
    Qwen25OmniModel), clip.projector_type qwen2.5o, which clip.cpp reads as qwen2.5vl_merger for the
    vision encoder and qwen2a for the audio one: _qwen_spec's qwen25vl ViT beside a whisper encoder
    of width 40 and Qwen2-Audio's one projection (mm.a.fc)."""
    kvs, tensors = _qwen_spec("qwen25vl", text_n_embd, seed)
    kvs = [KV(kv.key, "qwen2.5o", kv.vtype) if kv.key == "clip.projector_type" else kv for kv in kvs]
    kvs[0] = KV("general.name", "runner test projector (qwen25o)", GGUFValueType.STRING)
    rng = np.random.default_rng(seed + 2)  # seed 0: SmolLM2 answers a clip with words, not its end
    e = AUDIO_WIDTH

    def weight(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    audio_kvs, audio = _whisper(weight, blocks=2)
    audio["mm.a.fc.weight"], audio["mm.a.fc.bias"] = weight(text_n_embd, e), weight(text_n_embd)
    kvs += [KV("clip.has_audio_encoder", True, GGUFValueType.BOOL), *audio_kvs,
            _u32("clip.audio.projection_dim", text_n_embd)]  # fmt: skip
    return kvs, {**tensors, **audio}


def _whisper(weight: Any, blocks: int) -> tuple[list[KV], dict[str, np.ndarray]]:
    """A whisper encoder's keys and tensors (models/whisper-enc.cpp) as the converter writes them
    (Qwen25AudioModel): F16 convolutions, 2-D convolution biases, no K bias, ln_post."""
    e, mel = AUDIO_WIDTH, AUDIO_MEL
    tensors: dict[str, np.ndarray] = {
        "a.conv1d.1.weight": weight(e, mel, 3).astype(np.float16),  # ggml [3, mel, E]
        "a.conv1d.1.bias": weight(e, 1),  # ggml [1, E]
        "a.conv1d.2.weight": weight(e, e, 3).astype(np.float16),
        "a.conv1d.2.bias": weight(e, 1),
        "a.position_embd.weight": weight(AUDIO_POS, e),
    }
    kvs, layers = _audio_blocks(weight, blocks)
    return kvs, {**tensors, **layers}


def _audio_blocks(weight: Any, blocks: int) -> tuple[list[KV], dict[str, np.ndarray]]:
    """An audio encoder's sizes (clip.audio.*) and its pre-norm transformer blocks (build_vit with
    LayerNorms, no K bias, as Qwen's audio towers have), then ln_post."""
    e, f = AUDIO_WIDTH, 2 * AUDIO_WIDTH + 8  # ffn width unlike e (clip.cpp swaps up and down then)
    kvs = [
        _u32("clip.audio.num_mel_bins", AUDIO_MEL),
        _u32("clip.audio.embedding_length", e),
        _u32("clip.audio.feed_forward_length", f),
        _u32("clip.audio.block_count", blocks),
        _u32("clip.audio.attention.head_count", HEADS),
        KV("clip.audio.attention.layer_norm_epsilon", 1e-5, GGUFValueType.FLOAT32),
    ]
    tensors: dict[str, np.ndarray] = {}
    for i in range(blocks):
        blk = f"a.blk.{i}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{blk}.{part}.weight"] = weight(e, e)
            if part != "attn_k":
                tensors[f"{blk}.{part}.bias"] = weight(e)
        for norm in ("ln1", "ln2"):
            tensors[f"{blk}.{norm}.weight"], tensors[f"{blk}.{norm}.bias"] = np.ones(e, np.float32), weight(e)
        tensors[f"{blk}.ffn_up.weight"], tensors[f"{blk}.ffn_up.bias"] = weight(f, e), weight(f)
        tensors[f"{blk}.ffn_down.weight"], tensors[f"{blk}.ffn_down.bias"] = weight(e, f), weight(e)
    tensors["a.post_ln.weight"], tensors["a.post_ln.bias"] = np.ones(e, np.float32), weight(e)
    return kvs, tensors


def _qwen3a_spec(text_n_embd: int, seed: int) -> tuple[list[KV], dict[str, np.ndarray]]:
    """projector_spec's qwen3a (Qwen3-ASR's audio encoder, models/qwen3a.cpp; conversion/qwen3vl.py
    Qwen3ASRMmprojModel): clip.audio.projector_type only, three stride-2 3 x 3 convolutions of
    QWEN3A_CONV channels over each 100-frame chunk of the mel spectrogram (128 bins: 16 rows left),
    a.conv_out into the encoder's width, 13 positions a chunk, the blocks, then mm.a.mlp.1 -> GELU
    -> mm.a.mlp.2 into the text model's width. F16 convolutions as the converter writes them."""
    rng = np.random.default_rng(seed + 3)
    e, c, h = AUDIO_WIDTH, QWEN3A_CONV, 2 * AUDIO_WIDTH
    rows = AUDIO_MEL
    for _ in range(3):
        rows = (rows - 1) // 2 + 1  # each convolution: kernel 3, stride 2, padding 1

    def weight(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    kvs, layers = _audio_blocks(weight, blocks=2)
    kvs = [
        KV("general.name", "runner test projector (qwen3a)", GGUFValueType.STRING),
        KV("clip.has_vision_encoder", False, GGUFValueType.BOOL),
        KV("clip.has_audio_encoder", True, GGUFValueType.BOOL),
        KV("clip.audio.projector_type", "qwen3a", GGUFValueType.STRING),
        *kvs,
        _u32("clip.audio.projection_dim", text_n_embd),
    ]
    tensors: dict[str, np.ndarray] = {}
    for i, c_in in ((1, 1), (2, c), (3, c)):
        tensors[f"a.conv2d.{i}.weight"] = weight(c, c_in, 3, 3, scale=0.3).astype(np.float16)  # [3, 3, in, C]
        tensors[f"a.conv2d.{i}.bias"] = weight(c, 1, 1)  # ggml [1, 1, C]
    tensors["a.conv_out.weight"] = weight(e, rows * c, scale=0.1).astype(np.float16)  # ggml [rows C, E]
    tensors["a.position_embd.weight"] = weight(AUDIO_POS, e)
    tensors.update(layers)
    tensors["mm.a.mlp.1.weight"], tensors["mm.a.mlp.1.bias"] = weight(h, e), weight(h)
    tensors["mm.a.mlp.2.weight"], tensors["mm.a.mlp.2.bias"] = weight(text_n_embd, h), weight(text_n_embd)
    return kvs, tensors


def write_projector(path: str | Path, kvs: list[KV], tensors: dict[str, np.ndarray]) -> Path:
    """Write the metadata and tensors as a GGUF file of architecture clip."""
    writer = GGUFWriter(str(path), arch="clip")
    for kv in kvs:
        writer.add_key_value(kv.key, kv.value, kv.vtype, kv.sub_type)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def with_idefics3_tokens(model: str | Path, out: str | Path) -> Path:
    """A copy of the text model whose two unused control tokens are SmolVLM's image markers
    (IDEFICS3_TOKENS): libmtmd looks them up by their text for an idefics3 image, and a vocabulary
    without them gives it LLAMA_TOKEN_NULL in their place (mtmd.cpp lookup_token)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(model))
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(out), arch=arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        value, vtype = field.contents(), field.types[0]
        if field.name == "tokenizer.ggml.tokens":
            missing = set(IDEFICS3_TOKENS) - set(value)
            if missing:
                raise SystemExit(f"{model} has no {', '.join(sorted(missing))} to rename: use SmolLM2")
            value = [IDEFICS3_TOKENS.get(t, t) for t in value]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, vtype, sub_type)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()
    return Path(out)


def as_qwen2vl(model: str | Path, out: str | Path) -> Path:
    """A copy of a llama-architecture text model (SmolLM2) as architecture qwen2vl, whose rope is
    M-RoPE (llama-model.cpp 3187): libmtmd then gives its images (t, y, x) positions and advances the
    text max(nx, ny) positions past an image. Keys llama.* become qwen2vl.*, with rope.dimension_
    sections (MROPE_SECTIONS; src/models/qwen2vl.cpp 4 requires it) and zero Q, K and V biases as
    Qwen2's (optional there, llama-model.cpp 3428). The converter permuted Q's and K's rows for
    llama's rope, which rotates adjacent pairs; M-RoPE rotates pairs half a head apart as NeoX does
    (ggml-cpu ops.cpp 6440), so those rows are put back in Hugging Face's order. For text alone all
    sections have the same position, so the copy answers nearly as the model does: the pinned
    llama.cpp reads no RMS epsilon for qwen2vl (src/models/qwen2vl.cpp 3-5; 0 for SmolLM2's 1e-5),
    which moves the logits a little. Its tokenizer and chat template are the model's."""
    from gguf import GGUFReader

    reader = GGUFReader(str(model))
    arch = reader.fields["general.architecture"].contents()
    if arch != "llama":
        raise SystemExit(f"{model} is {arch}, not llama: use SmolLM2")
    n_head = reader.fields["llama.attention.head_count"].contents()
    n_head_kv = reader.fields["llama.attention.head_count_kv"].contents()  # SmolLM2's is there
    heads = {"attn_q": n_head, "attn_k": n_head_kv}
    writer = GGUFWriter(str(out), arch="qwen2vl")
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        value, vtype = field.contents(), field.types[0]
        if field.name == "general.name":
            value = f"{value} (qwen2vl)"
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name.replace("llama.", "qwen2vl.", 1), value, vtype, sub_type)
    writer.add_key_value(
        "qwen2vl.rope.dimension_sections", MROPE_SECTIONS, GGUFValueType.ARRAY, GGUFValueType.INT32
    )
    tensors: list[tuple[str, np.ndarray, Any]] = []
    for t in reader.tensors:
        data, kind = t.data, t.name.split(".")[-2] if t.name.startswith("blk.") else ""
        if kind in heads:  # rows (a quantized row is its blocks' bytes): head, pair, half -> head, half, pair
            rows = data.shape[0]
            data = data.reshape(heads[kind], -1, 2, *data.shape[1:]).swapaxes(1, 2).reshape(data.shape)
            bias = np.zeros(rows, dtype=np.float32)
            tensors.append((t.name.replace(".weight", ".bias"), bias, None))
            if kind == "attn_k":  # V's bias, as wide as K
                tensors.append((t.name.replace("attn_k.weight", "attn_v.bias"), bias, None))
        tensors.append((t.name, np.ascontiguousarray(data), t.tensor_type))
    for name, data, raw in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(data)
    writer.close()
    return Path(out)


def text_width(model: str | Path) -> int:
    """The text model's embedding width ({arch}.embedding_length), from its header."""
    from runner.gguf import read_header

    header = read_header(model)
    width = header.arch_get("embedding_length")
    if not isinstance(width, int) or width <= 0:
        raise SystemExit(f"{model} has no {header.architecture}.embedding_length: is it a text model?")
    return width


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the projector GGUF to write")
    parser.add_argument("--for", dest="model", type=Path, required=True, help="the text model's GGUF")
    parser.add_argument("--type", dest="kind", choices=KINDS + AUDIO_KINDS, default="mlp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-out", type=Path, help="idefics3: also write the text model with its tokens")
    parser.add_argument("--mrope-out", type=Path, help="also write the text model as qwen2vl (M-RoPE)")
    args = parser.parse_args(argv)
    kvs, tensors = projector_spec(args.kind, text_width(args.model), args.seed)
    path = write_projector(args.out, kvs, tensors)
    print(f"{path}: {args.kind} projector, {path.stat().st_size} bytes")
    if args.vocab_out is not None:
        vocab = with_idefics3_tokens(args.model, args.vocab_out)
        print(f"{vocab}: {args.model.name} with {', '.join(IDEFICS3_TOKENS.values())}")
    if args.mrope_out is not None:
        print(f"{as_qwen2vl(args.model, args.mrope_out)}: {args.model.name} as qwen2vl (M-RoPE)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
