"""The context llama.cpp makes of the asked sizes, and the KV cache and recurrent state it keeps.

context_size() is what llama_context's constructor does with n_ctx, n_seq, n_batch and n_ubatch
(padding, one stream per sequence); kv_per_layer() sizes each layer's state for that context:
row(type_k, n_embd_k_gqa(il)) + row(type_v, n_embd_v_gqa(il)) per cell for attention layers
(sliding-window layers full size too, because the default swa_full is true), one f32 state per
sequence for recurrent layers; nothing for the encoders llama.cpp keeps no memory for (arch.NO_MEMORY:
BERT and its kin). The defaults here are llama.cpp's, as runner's engine leaves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.memory.arch import Hparams, hparams_from_header
from runner.memory.graph import pad, row_size

# -- llama.cpp's defaults, as runner's engine leaves them (llama-context.cpp:3754-3796) --------
N_BATCH = 2048  # llama_context_default_params().n_batch
N_UBATCH = 512  # .n_ubatch
SWA_FULL = True  # .swa_full: sliding-window layers get a full-size cache
KV_UNIFIED = False  # .kv_unified: one KV stream per sequence
OFFLOAD_KQV = True  # .offload_kqv: a layer's KV cache lives with the layer
N_CTX_PAD = 256  # llama-context.cpp:290: n_ctx = GGML_PAD(n_ctx, 256)
CPU_ALIGNMENT = 32  # TENSOR_ALIGNMENT, ggml-impl.h:44
CUDA_FA_HEAD_DIMS = frozenset({40, 64, 72, 80, 96, 112, 128, 192, 256, 512, 576})  # CUDA's flash attention
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")


@dataclass(frozen=True)
class ContextSize:
    """What llama_context's constructor makes of the asked sizes (llama-context.cpp:128-320)."""

    n_ctx: int
    n_ctx_seq: int  # cells per KV stream
    n_batch: int
    n_ubatch: int
    n_seq: int
    n_stream: int


@dataclass(frozen=True)
class Attention:
    """The attention settings a context is made with: flash attention as resolved (not "auto"),
    whether the V cache is transposed (flash attention off), and the cache's K and V types."""

    flash_attn: bool
    v_trans: bool
    type_k: str = "f16"
    type_v: str = "f16"


def context_size(
    hp: Hparams, n_ctx: int, *, n_seq: int = 1, n_batch: int = N_BATCH, n_ubatch: int = N_UBATCH
) -> ContextSize:
    n_seq = max(1, n_seq)
    n_ctx = n_ctx or hp.n_ctx_train
    n_batch = min(n_ctx, n_batch)  # before padding: llama-context.cpp:246
    n_ubatch = min(n_batch, n_ubatch or n_batch)
    n_ctx = pad(n_ctx, N_CTX_PAD)
    if KV_UNIFIED:
        return ContextSize(n_ctx, n_ctx, n_batch, n_ubatch, n_seq, 1)
    n_ctx_seq = pad(n_ctx // n_seq, N_CTX_PAD)
    return ContextSize(n_ctx_seq * n_seq, n_ctx_seq, n_batch, n_ubatch, n_seq, n_seq)


def check_kv_type(name: str) -> str:
    t = name.lower()
    if t not in KV_TYPES:
        raise ValueError(f"unsupported KV cache type {name!r}: one of {', '.join(KV_TYPES)}")
    return t


def swa_cells(hp: Hparams, cs: ContextSize, swa_full: bool = SWA_FULL) -> int:
    """Cells of the sliding-window cache (llama-kv-cache-iswa.cpp:71-79)."""
    if swa_full or not hp.swa_any:
        return cs.n_ctx_seq
    streams = cs.n_seq if KV_UNIFIED else 1
    return pad(min(cs.n_ctx_seq, hp.n_swa * streams + cs.n_ubatch), 256)


def kv_layer_bytes(
    hp: Hparams, il: int, cells: int, *, type_k: str = "f16", type_v: str = "f16", v_trans: bool = False
) -> int:
    """One layer's K and V tensors for `cells` cells (all streams): llama-kv-cache.cpp:224-242."""
    n_v = max(hp.n_embd_v_gqa(i) for i in range(hp.n_layer)) if v_trans else hp.n_embd_v_gqa(il)
    k = pad(row_size(check_kv_type(type_k), hp.n_embd_k_gqa(il)) * cells, CPU_ALIGNMENT)
    v = pad(row_size(check_kv_type(type_v), n_v) * cells, CPU_ALIGNMENT) if not hp.is_mla else 0
    return k + v


def recurrent_layer_bytes(hp: Hparams, n_seq: int = 1) -> int:
    """One recurrent layer's state: r and s rows, f32, one per sequence (llama-memory-recurrent.cpp)."""
    rows = max(1, n_seq)
    return pad(hp.n_embd_r * 4 * rows, CPU_ALIGNMENT) + pad(hp.n_embd_s * 4 * rows, CPU_ALIGNMENT)


def kv_per_layer(
    hp: Hparams,
    cs: ContextSize,
    *,
    type_k: str = "f16",
    type_v: str = "f16",
    v_trans: bool = False,
    swa_full: bool = SWA_FULL,
) -> list[tuple[int, str, int]]:
    """(layer, cache, bytes) for every layer that keeps state: cache is "KV", "KV_SWA" (the
    sliding-window layers, a cache of their own) or "RS" (recurrent state)."""
    entries = []
    swa = swa_cells(hp, cs, swa_full)
    for il in hp.attn_layers():
        cells = (swa if hp.is_swa[il] else cs.n_ctx_seq) * cs.n_stream
        nbytes = kv_layer_bytes(hp, il, cells, type_k=type_k, type_v=type_v, v_trans=v_trans)
        entries.append((il, "KV_SWA" if hp.is_swa[il] else "KV", nbytes))
    entries += [(il, "RS", recurrent_layer_bytes(hp, cs.n_seq)) for il, r in enumerate(hp.recurrent) if r]
    return entries


def kv_cache_bytes(
    header: Any,
    *,
    n_ctx: int,
    n_seq: int = 1,
    type_k: str = "f16",
    type_v: str = "f16",
    swa_full: bool = SWA_FULL,
) -> int:
    """Bytes llama.cpp allocates for the KV cache (and recurrent state) of this context."""
    hp = hparams_from_header(header)
    cs = context_size(hp, n_ctx, n_seq=n_seq)
    return sum(b for _, _, b in kv_per_layer(hp, cs, type_k=type_k, type_v=type_v, swa_full=swa_full))
