"""Small synthetic GGUF models that the pinned llama.cpp really loads (random weights).

Each one exercises a shape the memory estimator must get right: per-layer KV heads (deci),
sliding-window layers (gemma3), a large vocabulary, experts (qwen3moe), biases (qwen2),
a recurrent state (mamba), a tied Q4_0 embedding that CPU_REPACK copies. The vocabulary is
llama.cpp's "none" tokenizer with {arch}.vocab_size dummy tokens: enough to evaluate token
ids, no tokenizer needed. Two writers make files for runner's own header reader only:
write_unknown_arch (an architecture llama.cpp refuses) and write_gguf (a tiny llama-like model
with real metadata and stand-in tensors, for list, show, rm, fit and pulls from a loopback Hub).

    python tests/synth.py /tmp/synth      # writes every model in SPECS
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.quants import quantize

QTYPES = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "q8_0": GGMLQuantizationType.Q8_0,
    "q4_0": GGMLQuantizationType.Q4_0,
}


@dataclass(frozen=True)
class Spec:
    arch: str
    n_layer: int = 4
    n_embd: int = 256
    n_head: int | list[int] = 4
    n_head_kv: int | list[int] = 2
    n_ff: int | list[int] = 512
    n_vocab: int = 4096
    n_ctx_train: int = 32768
    head_dim: int | None = None
    tied: bool = False
    dtype: str = "f16"  # of the matmul weights
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    swa: int = 0  # sliding window (gemma3)
    swa_pattern: int = 0
    extra: dict[str, object] = field(default_factory=dict)
    # a real model's tokenizer (every tokenizer.* key of that GGUF), n_vocab its size: a draft model
    tokenizer: Path | None = None
    token_edits: dict[int, str] = field(default_factory=dict)  # tokens of it to change (a mismatch)


SPECS: dict[str, Spec] = {
    # per-layer KV heads, one layer without attention and one without FFN (Nemotron-51B style)
    "deci": Spec(
        "deci",
        n_layer=6,
        n_head=[8, 8, 0, 8, 8, 8],
        n_head_kv=[8, 2, 0, 1, 4, 2],
        n_ff=[1024, 512, 768, 0, 512, 1024],
    ),
    # 5 sliding-window layers out of 6, window 512
    "gemma3": Spec(
        "gemma3",
        n_layer=6,
        n_embd=320,
        n_head=4,
        n_head_kv=1,
        head_dim=128,
        n_ff=1024,
        n_vocab=8192,
        swa=512,
        swa_pattern=6,
        tied=True,
    ),
    # a 200k vocabulary: logits dominate the compute buffer
    "bigvocab": Spec(
        "llama", n_layer=2, n_embd=128, n_head=2, n_head_kv=1, n_ff=256, n_vocab=200_000, dtype="q8_0"
    ),
    "qwen3moe": Spec(
        "qwen3moe",
        n_layer=3,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        head_dim=64,
        n_ff=512,
        n_expert=16,
        n_expert_used=4,
        n_ff_exp=256,
    ),
    # experts plus a gated shared expert, qkv biases
    "qwen2moe": Spec(
        "qwen2moe",
        n_layer=3,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        n_ff=512,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=256,
        extra={"qwen2moe.expert_shared_feed_forward_length": 384},
    ),
    "qwen2": Spec("qwen2", n_layer=3, n_embd=256, n_head=4, n_head_kv=2, n_ff=768, n_vocab=6000),
    # tied Q4_0 embedding: token_embd stays mapped, its duplicate as output goes to CPU_REPACK
    "q4tied": Spec(
        "llama", n_layer=3, n_embd=256, n_head=4, n_head_kv=4, n_ff=512, n_vocab=8192, dtype="q4_0", tied=True
    ),
    # hybrid: 3 mamba layers and 1 attention layer: a KV cache for one layer, states for three
    "jamba": Spec("jamba", n_layer=4, n_embd=256, n_head=4, n_head_kv=[0, 0, 2, 0], n_ff=512, n_vocab=4096),
    "mamba": Spec("mamba", n_layer=3, n_embd=256, n_head=0, n_head_kv=0, n_ff=0, n_vocab=4096),
}


def _per_layer(v: int | list[int], il: int) -> int:
    return v[il] if isinstance(v, list) else v


class _Writer:
    def __init__(self, path: Path, spec: Spec, seed: int) -> None:
        self.spec = spec
        self.w = GGUFWriter(str(path), spec.arch)
        self.rng = np.random.default_rng(seed)

    def tensor(self, name: str, *ne: int, dtype: str | None = None) -> None:
        """A tensor of ggml shape ne (ne[0] is a row), small random values."""
        dtype = dtype or ("f32" if len(ne) == 1 else self.spec.dtype)
        data = (self.rng.standard_normal(tuple(reversed(ne)), dtype=np.float32) * 0.02).astype(np.float32)
        if "norm" in name:
            data = np.ones_like(data)
        if dtype == "f32":
            self.w.add_tensor(name, data)
        elif dtype == "f16":
            self.w.add_tensor(name, data.astype(np.float16))
        else:
            qt = QTYPES[dtype]
            self.w.add_tensor(name, quantize(data, qt), raw_dtype=qt)


def write_model(path: str | Path, spec: Spec, seed: int = 0) -> Path:
    path = Path(path)
    s, x = spec, _Writer(path, spec, seed)
    w, a = x.w, spec.arch
    w.add_block_count(s.n_layer)
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    if s.tokenizer is not None:
        s = spec = _with_tokenizer(w, s)
    else:
        w.add_tokenizer_model("none")
    w.add_uint32(f"{a}.vocab_size", s.n_vocab)
    if a == "mamba":
        return _write_mamba(path, x)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    n_head0 = _per_layer(s.n_head, 0)
    hd = s.head_dim or s.n_embd // n_head0
    if s.head_dim:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if s.n_expert:
        w.add_expert_count(s.n_expert)
        w.add_expert_used_count(s.n_expert_used)
        w.add_expert_feed_forward_length(s.n_ff_exp)
    if a == "jamba":
        _ssm_keys(x)
    if s.swa:
        w.add_sliding_window(s.swa)
        w.add_uint32(f"{a}.attention.sliding_window_pattern", s.swa_pattern)
    for k, v in s.extra.items():
        w.add_uint32(k, v) if isinstance(v, int) else w.add_float32(k, v)  # type: ignore[arg-type]

    x.tensor("token_embd.weight", s.n_embd, s.n_vocab)
    for il in range(s.n_layer):
        b = f"blk.{il}"
        n_head, n_head_kv, n_ff = (_per_layer(v, il) for v in (s.n_head, s.n_head_kv, s.n_ff))
        if a == "jamba" and n_head_kv == 0:
            x.tensor(f"{b}.attn_norm.weight", s.n_embd)
            _ssm_tensors(x, b, norms=True)
        elif n_head:
            x.tensor(f"{b}.attn_norm.weight", s.n_embd)
            x.tensor(f"{b}.attn_q.weight", s.n_embd, hd * n_head)
            x.tensor(f"{b}.attn_k.weight", s.n_embd, hd * n_head_kv)
            x.tensor(f"{b}.attn_v.weight", s.n_embd, hd * n_head_kv)
            x.tensor(f"{b}.attn_output.weight", hd * n_head, s.n_embd)
            if a in ("qwen2", "qwen2moe"):
                for n, rows in (("q", hd * n_head), ("k", hd * n_head_kv), ("v", hd * n_head_kv)):
                    x.tensor(f"{b}.attn_{n}.bias", rows)
            if a in ("gemma3", "qwen3moe"):
                x.tensor(f"{b}.attn_q_norm.weight", hd)
                x.tensor(f"{b}.attn_k_norm.weight", hd)
            if a == "gemma3":
                x.tensor(f"{b}.post_attention_norm.weight", s.n_embd)
        if s.n_expert:
            x.tensor(f"{b}.ffn_norm.weight", s.n_embd)
            x.tensor(f"{b}.ffn_gate_inp.weight", s.n_embd, s.n_expert, dtype="f32")
            x.tensor(f"{b}.ffn_gate_exps.weight", s.n_embd, s.n_ff_exp, s.n_expert)
            x.tensor(f"{b}.ffn_up_exps.weight", s.n_embd, s.n_ff_exp, s.n_expert)
            x.tensor(f"{b}.ffn_down_exps.weight", s.n_ff_exp, s.n_embd, s.n_expert)
            n_sh = int(s.extra.get(f"{a}.expert_shared_feed_forward_length", 0))
            if n_sh:
                x.tensor(f"{b}.ffn_gate_inp_shexp.weight", s.n_embd, dtype="f32")
                x.tensor(f"{b}.ffn_gate_shexp.weight", s.n_embd, n_sh)
                x.tensor(f"{b}.ffn_up_shexp.weight", s.n_embd, n_sh)
                x.tensor(f"{b}.ffn_down_shexp.weight", n_sh, s.n_embd)
        elif n_ff:
            x.tensor(f"{b}.ffn_norm.weight", s.n_embd)
            x.tensor(f"{b}.ffn_gate.weight", s.n_embd, n_ff)
            x.tensor(f"{b}.ffn_up.weight", s.n_embd, n_ff)
            x.tensor(f"{b}.ffn_down.weight", n_ff, s.n_embd)
            if a == "gemma3":
                x.tensor(f"{b}.post_ffw_norm.weight", s.n_embd)
    x.tensor("output_norm.weight", s.n_embd)
    if not s.tied:
        x.tensor("output.weight", s.n_embd, s.n_vocab)
    return _finish(w, path)


def _with_tokenizer(w: GGUFWriter, s: Spec) -> Spec:
    """Copy the tokenizer.* keys of s.tokenizer's GGUF into w; the spec with n_vocab to match."""
    from dataclasses import replace

    assert s.tokenizer is not None
    _copy_tokenizer(w, s.tokenizer, s.token_edits, None)
    return replace(s, n_vocab=_vocab_size(s.tokenizer))


SSM = {"d_conv": 4, "d_state": 16}  # mamba's d_inner is 2 * n_embd, dt_rank n_embd / 16


def _ssm_keys(x: _Writer) -> None:
    w, n_embd = x.w, x.spec.n_embd
    w.add_ssm_conv_kernel(SSM["d_conv"])
    w.add_ssm_inner_size(2 * n_embd)
    w.add_ssm_state_size(SSM["d_state"])
    w.add_ssm_time_step_rank(n_embd // 16)


def _ssm_tensors(x: _Writer, b: str, norms: bool = False) -> None:
    """One mamba mixer (jamba's also normalizes dt, B and C)."""
    n_embd = x.spec.n_embd
    d_inner, d_state, d_conv, dt_rank = 2 * n_embd, SSM["d_state"], SSM["d_conv"], n_embd // 16
    x.tensor(f"{b}.ssm_in.weight", n_embd, 2 * d_inner)
    x.tensor(f"{b}.ssm_conv1d.weight", d_conv, d_inner, dtype="f32")
    x.tensor(f"{b}.ssm_conv1d.bias", d_inner, dtype="f32")
    x.tensor(f"{b}.ssm_x.weight", d_inner, dt_rank + 2 * d_state)
    x.tensor(f"{b}.ssm_dt.weight", dt_rank, d_inner)
    x.tensor(f"{b}.ssm_dt.bias", d_inner, dtype="f32")
    if norms:
        x.tensor(f"{b}.ssm_dt_norm.weight", dt_rank)
        x.tensor(f"{b}.ssm_b_norm.weight", d_state)
        x.tensor(f"{b}.ssm_c_norm.weight", d_state)
    x.tensor(f"{b}.ssm_a", d_state, d_inner, dtype="f32")
    x.tensor(f"{b}.ssm_d", d_inner, dtype="f32")
    x.tensor(f"{b}.ssm_out.weight", d_inner, n_embd)


def _write_mamba(path: Path, x: _Writer) -> Path:
    s, w = x.spec, x.w
    _ssm_keys(x)
    w.add_layer_norm_rms_eps(1e-5)
    x.tensor("token_embd.weight", s.n_embd, s.n_vocab)
    for il in range(s.n_layer):
        x.tensor(f"blk.{il}.attn_norm.weight", s.n_embd)
        _ssm_tensors(x, f"blk.{il}")
    x.tensor("output_norm.weight", s.n_embd)
    x.tensor("output.weight", s.n_embd, s.n_vocab)
    return _finish(w, path)


def _finish(w: GGUFWriter, path: Path) -> Path:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_scripted(
    path: str | Path,
    tokenizer: Path,
    script: list[int],
    *,
    once: int | None = None,
    edits: dict[int, str] | None = None,
    template: str | None = None,
) -> Path:
    """A one-layer llama on a real model's tokenizer whose greedy answer is written out by hand:
    `script` is the prompt's last token, then the answer's tokens (the last one an end of generation).

    Each token's follower is a bigram table. A token that comes twice with different followers
    (harmony's <|channel|> is followed by "analysis", later by "final") takes its second follower
    once token `once` is in the context, and must not come a third time. How: each scripted token
    has a dimension of its own in the embedding (every other token embeds as zeros); Q and K are
    zero, so attention averages the whole context, and its V carries one thing, whether `once` is in
    it, into a dimension of its own; the FFN is zero. The output rows score a token's follower +10,
    its later follower +5, and the first follower -40 once `once` was seen. The prompt must not hold
    `once`; up to ~1,000 tokens of context keep the margins. `edits` rewrites tokens of the
    tokenizer (ids of its unused control tokens), `template` becomes its chat template."""
    follows: dict[int, int] = {}
    follows_once: dict[int, int] = {}
    seen_once = False
    for token, after in zip(script, script[1:], strict=False):
        seen_once = seen_once or token == once
        if follows.setdefault(token, after) != after:
            assert seen_once and follows_once.setdefault(token, after) == after, f"{token} is ambiguous"
    keys = sorted(set(follows) | ({once} if once is not None else set()))
    n_embd = 64
    assert len(keys) < n_embd, "a script of at most 63 distinct tokens"
    for token in follows_once:  # a first follower loses once `once` is seen: it follows nothing else
        assert [after for after in follows.values()].count(follows[token]) == 1
    dim = {token: i for i, token in enumerate(keys)}
    seen = n_embd - 1  # the dimension that says `once` was seen
    n_vocab = _vocab_size(tokenizer)
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_embd)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    _copy_tokenizer(w, tokenizer, edits or {}, template)
    w.add_uint32("llama.vocab_size", n_vocab)
    embd = np.zeros((n_vocab, n_embd), dtype=np.float32)
    out = np.zeros((n_vocab, n_embd), dtype=np.float32)
    for token, i in dim.items():
        embd[token, i] = 1.0
    for token, after in follows.items():
        out[after, dim[token]] = 10.0
    for token, later in follows_once.items():
        out[later, dim[token]] = 5.0
        out[follows[token], seen] = -40.0
    square = np.zeros((n_embd, n_embd), dtype=np.float32)
    v = square.copy()
    if once is not None:
        v[seen, dim[once]] = 20.0  # x8 by the norm, averaged over the context
    o = square.copy()
    o[seen, seen] = 1.0
    w.add_tensor("token_embd.weight", embd.astype(np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
    for name, data in (("q", square), ("k", square), ("v", v), ("output", o)):
        w.add_tensor(f"blk.0.attn_{name}.weight", data.astype(np.float16))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
    for name in ("gate", "up", "down"):
        w.add_tensor(f"blk.0.ffn_{name}.weight", square.astype(np.float16))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", out.astype(np.float16))
    return _finish(w, Path(path))


def _vocab_size(tokenizer: Path) -> int:
    """How many tokens a GGUF's tokenizer holds."""
    from gguf import GGUFReader

    return len(GGUFReader(tokenizer).fields["tokenizer.ggml.tokens"].contents())


def _copy_tokenizer(w: GGUFWriter, tokenizer: Path, edits: dict[int, str], template: str | None) -> None:
    """Every tokenizer.* key of `tokenizer`'s GGUF into w, its tokens edited, its template replaced."""
    from gguf import GGUFReader, GGUFValueType

    for name, f in GGUFReader(tokenizer).fields.items():
        if not name.startswith("tokenizer.") or (name == "tokenizer.chat_template" and template is not None):
            continue
        value = f.contents()
        if name == "tokenizer.ggml.tokens":
            value = list(value)
            for i, text in edits.items():
                value[i] = text
        if f.types[0] == GGUFValueType.ARRAY:
            w.add_key_value(name, value, GGUFValueType.ARRAY, sub_type=f.types[-1])
        else:
            w.add_key_value(name, value, f.types[0])
    if template is not None:
        w.add_chat_template(template)


def set_context_length(path: str | Path, n_ctx: int) -> Path:
    """The GGUF at `path` with its trained context set to n_ctx, in place: write_scripted's 4,096 for
    an answer longer than that. A scripted model with no `once` has zero attention output, so its
    greedy answer is the same at any length. The key's uint32 is found by its name and type in the
    header and rewritten (GGUFReader would parse the whole tokenizer first: seconds)."""
    import mmap
    import re
    import struct

    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as data:
        [key] = list(re.finditer(rb"\.context_length\x04\x00\x00\x00", data))  # name, then type UINT32
        struct.pack_into("<I", data, key.end(), n_ctx)
    return Path(path)


def write_unknown_arch(path: str | Path) -> Path:
    """A well-formed GGUF of an architecture llama.cpp does not know ("foobar"): the header reader
    takes it, llama.cpp's load refuses it with its own reason."""
    w = GGUFWriter(str(path), "foobar")
    w.add_tensor("x.weight", np.ones(64, dtype=np.float32))
    return _finish(w, Path(path))


TINY_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"


def write_gguf(
    path: Path,
    *,
    layers: int = 2,
    template: str | None = TINY_TEMPLATE,
    padding: int = 0,
    arch: str = "llama",
    vocab: int = 256,
) -> Path:
    """A llama-like GGUF: real metadata, a 256-token vocabulary, Q8_0 matrices and F32 norms (zeros:
    a header to read and bytes to pull, not a model llama.cpp loads)."""
    w = GGUFWriter(str(path), arch)
    w.add_name("Tiny Test")
    w.add_license("mit")
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_block_count(layers)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    if template is not None:
        w.add_chat_template(template)
    q8 = GGMLQuantizationType.Q8_0
    w.add_tensor("token_embd.weight", np.zeros((vocab, 2 * 34), dtype=np.uint8), raw_dtype=q8)  # vocab x 64
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(64, dtype=np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((64, 2 * 34), dtype=np.uint8), raw_dtype=q8)
    if padding:
        w.add_tensor("output.weight", np.zeros(padding // 4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_all(folder: str | Path, names: list[str] | None = None) -> dict[str, Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return {n: write_model(folder / f"{n}.gguf", SPECS[n]) for n in (names or list(SPECS))}


# -- an audio projector (mmproj) for a text model: a whisper-style encoder, random weights -------------

AUDIO_KINDS = ("ultravox", "voxtral", "qwen2a")
AUDIO_STACK = {"ultravox": 8, "voxtral": 4}  # clip.audio.projector.stack_factor (qwen2a has none)


def audio_projector_spec(
    kind: str, text_n_embd: int, seed: int = 0, *, width: int = 40, heads: int = 2, blocks: int = 2
) -> tuple[dict[str, tuple[Any, GGUFValueType]], dict[str, np.ndarray]]:
    """The keys (value, GGUF type) and tensors (numpy's shape: ggml's reversed) clip.cpp loads for a
    `kind` audio projector (its whisper encoder, models/whisper-enc.cpp: two 1-D convolutions over
    128 mel bins, 1500 positions, `blocks` pre-norm blocks with no K bias, ln_post, then the kind's
    projection into the text model's width). A width that is not a power of two: the ultravox and
    voxtral frame stacking pads it wrongly otherwise (the issue's abort)."""
    if kind not in AUDIO_KINDS:
        raise ValueError(f"unknown audio projector type {kind!r}: one of {', '.join(AUDIO_KINDS)}")
    rng = np.random.default_rng(seed)
    e, f, mel, n_pos = width, 2 * width + 8, 128, 1500  # ffn width unlike e: clip.cpp swaps up/down if equal

    def weight(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    keys: dict[str, tuple[Any, GGUFValueType]] = {
        "general.name": (f"runner test audio projector ({kind})", GGUFValueType.STRING),
        "clip.has_vision_encoder": (False, GGUFValueType.BOOL),
        "clip.has_audio_encoder": (True, GGUFValueType.BOOL),
        "clip.projector_type": (kind, GGUFValueType.STRING),
        "clip.audio.num_mel_bins": (mel, u32),
        "clip.audio.embedding_length": (e, u32),
        "clip.audio.feed_forward_length": (f, u32),
        "clip.audio.block_count": (blocks, u32),
        "clip.audio.attention.head_count": (heads, u32),
        "clip.audio.projection_dim": (text_n_embd, u32),
        "clip.audio.attention.layer_norm_epsilon": (1e-5, f32),
    }
    if kind in AUDIO_STACK:
        keys["clip.audio.projector.stack_factor"] = (AUDIO_STACK[kind], u32)
    tensors: dict[str, np.ndarray] = {
        "a.conv1d.1.weight": weight(e, mel, 3),  # ggml [3, mel, E]
        "a.conv1d.1.bias": weight(e, 1),  # ggml [1, E]: added to the conv's [T, E] output
        "a.conv1d.2.weight": weight(e, e, 3),
        "a.conv1d.2.bias": weight(e, 1),
        "a.position_embd.weight": weight(n_pos, e),
    }
    for i in range(blocks):
        blk = f"a.blk.{i}"
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors[f"{blk}.{part}.weight"] = weight(e, e)
            if part != "attn_k":  # whisper's K has no bias (whisper-enc.cpp asserts it)
                tensors[f"{blk}.{part}.bias"] = weight(e)
        for norm in ("ln1", "ln2"):
            tensors[f"{blk}.{norm}.weight"], tensors[f"{blk}.{norm}.bias"] = np.ones(e, np.float32), weight(e)
        tensors[f"{blk}.ffn_up.weight"], tensors[f"{blk}.ffn_up.bias"] = weight(f, e), weight(f)
        tensors[f"{blk}.ffn_down.weight"], tensors[f"{blk}.ffn_down.bias"] = weight(e, f), weight(e)
    tensors["a.post_ln.weight"], tensors["a.post_ln.bias"] = np.ones(e, np.float32), weight(e)
    stacked = e * AUDIO_STACK.get(kind, 1)
    if kind == "ultravox":  # rms norm, up into 2 h, swiglu to h, rms norm, out (no biases)
        h = 2 * width
        tensors["mm.a.norm_pre.weight"] = np.ones(stacked, np.float32)
        tensors["mm.a.mlp.1.weight"] = weight(2 * h, stacked)
        tensors["mm.a.norm_mid.weight"] = np.ones(h, np.float32)
        tensors["mm.a.mlp.2.weight"] = weight(text_n_embd, h)
    elif kind == "voxtral":  # up, GELU, out (no biases)
        tensors["mm.a.mlp.1.weight"] = weight(2 * width, stacked)
        tensors["mm.a.mlp.2.weight"] = weight(text_n_embd, 2 * width)
    else:  # qwen2a: one projection with a bias
        tensors["mm.a.fc.weight"], tensors["mm.a.fc.bias"] = weight(text_n_embd, e), weight(text_n_embd)
    return keys, tensors


def write_audio_projector(
    path: str | Path,
    text_n_embd: int,
    kind: str = "ultravox",
    seed: int = 0,
    spec: tuple[dict[str, tuple[Any, GGUFValueType]], dict[str, np.ndarray]] | None = None,
) -> Path:
    """An audio projector file (audio_projector_spec's, or `spec`: one edited to be malformed)."""
    path = Path(path)
    keys, tensors = spec if spec is not None else audio_projector_spec(kind, text_n_embd, seed)
    w = GGUFWriter(str(path), "clip")
    for key, (value, vtype) in keys.items():
        w.add_key_value(key, value, vtype)
    for name, data in tensors.items():
        w.add_tensor(name, data)
    return _finish(w, path)


def with_fim(source: Path, path: Path, ids: dict[str, int]) -> Path:
    """A copy of a GGUF with tokenizer.ggml.<key>_token_id set for each of `ids`, tensors as they are."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(source)
    writer = GGUFWriter(str(path), str(reader.fields["general.architecture"].contents()))
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if f.types[0] == GGUFValueType.ARRAY:
            writer.add_key_value(name, f.contents(), GGUFValueType.ARRAY, sub_type=f.types[-1])
        else:
            writer.add_key_value(name, f.contents(), f.types[0])
    for key, token in ids.items():
        writer.add_uint32(f"tokenizer.ggml.{key}_token_id", token)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":
    for name, p in write_all(sys.argv[1] if len(sys.argv) > 1 else "/tmp/synth").items():
        print(name, p, p.stat().st_size)
