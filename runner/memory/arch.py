"""What the estimator needs to know about a model's architecture, read from its GGUF header.

Hparams mirrors llama_hparams as the pinned llama.cpp fills it (llama-model.cpp
load_hparams, src/models/*.cpp load_arch_hparams): layer count, per-layer head counts
(head_count_kv may be an array), head sizes, sliding-window layers, experts, MLA, the
recurrent state sizes of mamba/rwkv and of the recurrent layers of hybrids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# fmt: off
RECURRENT = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
    "qwen3next", "kimi-linear", "qwen35", "qwen35moe", "minimax-01",
})
# the architectures build.py builds llama.cpp's own graph for (the others get the llama graph)
EXACT_GRAPHS = frozenset({
    "llama", "deci", "qwen2", "qwen3", "qwen2moe", "qwen3moe", "gemma2", "gemma3", "mamba", "jamba",
})
# fmt: on
# bytes an element of a matmul input takes once converted to the weight's vec_dot_type
# (ggml-cpu type_traits): f16 for f16, q8_0 / q8_1 for the legacy quants, q8_K for k-quants
DOT_BYTES = {
    "F32": 0.0,
    "F16": 2.0,
    "BF16": 2.0,
    "Q4_0": 34 / 32,
    "Q5_0": 34 / 32,
    "Q8_0": 34 / 32,
    "IQ4_NL": 34 / 32,
    "MXFP4": 34 / 32,
    "Q4_1": 36 / 32,
    "Q5_1": 36 / 32,
}
# the n_pattern each architecture passes to load_swa_pattern() (src/models/<arch>.cpp)
SWA_PATTERN = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "gpt-oss": 2, "llama4": 4, "exaone4": 4, "olmo2": 4}
SWA_ALWAYS = frozenset({"gemma2", "cohere2", "gpt-oss"})  # the others need attention.sliding_window > 0
# fmt: off
# llama_model::create_memory() makes no KV cache for these (llama-model.cpp): the encoders, whose
# non-causal attention sees one batch at a time (BERT and its kin, EmbeddingGemma), and WavTokenizer's
# decoder and the diffusion models, which llama.cpp runs a whole sequence at a time
ENCODERS = frozenset({
    "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2", "jina-bert-v3",
    "eurobert", "gemma-embedding",
})
NO_MEMORY = ENCODERS | {"wavtokenizer-dec", "dream", "llada", "llada-moe", "rnd1"}
# fmt: on
POOLING_RANK = 4  # {arch}.pooling_type of a reranker (LLAMA_POOLING_TYPE_RANK)


def cannot_generate(arch: str | None, pooling: Any) -> str | None:
    """Why a model of this architecture and declared pooling cannot generate text, said after its
    name (runner.errors.CannotGenerate); None where it can. A reranker's output is a score; a model
    with no KV cache would see only the token being decoded, and an encoder has no language head."""
    if pooling == POOLING_RANK:
        return (
            "is a reranking model: it scores documents against a query (runner rerank, POST /v1/rerank) "
            "and does not generate text"
        )
    if arch in ENCODERS:
        return (
            f"is an encoder ({arch}) that keeps no KV cache and does not generate text: it embeds "
            "(runner embed, POST /v1/embeddings)"
        )
    if arch in NO_MEMORY:
        return (
            f"is a {arch} model, which llama.cpp keeps no KV cache for: runner cannot generate text with it"
        )
    return None


def _per_layer(value: Any, n: int, default: int = 0) -> tuple[int, ...]:
    """get_key_or_arr(): a scalar for every layer, or one value per layer."""
    if value is None:
        return (default,) * n
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value[:n]) + (0,) * (n - len(value))
    return (int(value),) * n


@dataclass(frozen=True)
class Hparams:
    arch: str
    n_layer: int  # n_layer_all: every block, including next-token-prediction ones
    n_embd: int
    n_vocab: int  # vocab.n_tokens(): rows of the logits llama.cpp keeps
    n_vocab_out: int  # rows of the output projection: the logits the graph computes
    n_ctx_train: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    n_ff: tuple[int, ...]
    head_k: int
    head_v: int
    head_k_swa: int
    head_v_swa: int
    is_swa: tuple[bool, ...]
    n_swa: int
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    is_mla: bool = False
    final_softcap: bool = False  # gemma2/3: scale, tanh, scale over the logits
    recurrent: tuple[bool, ...] = ()
    n_embd_r: int = 0  # recurrent state sizes per layer and sequence (f32 elements)
    n_embd_s: int = 0
    ssm: tuple[int, int, int, int] = (0, 0, 0, 0)  # mamba: d_conv, d_inner, d_state, dt_rank
    dot_bytes: float = 0.0  # see DOT_BYTES: the most any repeating-layer weight needs
    vocab_strings: int = 0  # tokenizer tokens + merges: what the vocabulary costs in host memory
    tensors: frozenset[str] = field(default_factory=frozenset)

    def n_embd_k_gqa(self, il: int) -> int:
        return (self.head_k_swa if self.is_swa[il] else self.head_k) * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        return (
            0 if self.is_mla else (self.head_v_swa if self.is_swa[il] else self.head_v) * self.n_head_kv[il]
        )

    def has(self, name: str) -> bool:
        return name in self.tensors

    @property
    def swa_any(self) -> bool:
        return any(self.is_swa)

    @property
    def is_recurrent(self) -> bool:
        return self.arch in RECURRENT

    @property
    def exact_graph(self) -> bool:
        return self.arch in EXACT_GRAPHS

    @property
    def keeps_memory(self) -> bool:
        """llama.cpp makes a KV cache (or recurrent state) for it: not for NO_MEMORY's encoders."""
        return self.arch not in NO_MEMORY

    def attn_layers(self) -> list[int]:
        """The layers with a KV cache (the filter llama_model::create_memory() gives it)."""
        if self.is_recurrent or not self.keeps_memory:
            return []
        if self.arch == "falcon-h1":  # attention and a recurrent state in every layer
            return list(range(self.n_layer))
        recr = self.recurrent or (False,) * self.n_layer
        if self.arch.startswith("nemotron_h"):  # MLP-only layers have neither
            return [il for il in range(self.n_layer) if not recr[il] and self.n_ff[il] == 0]
        return [il for il in range(self.n_layer) if not recr[il]]


def hparams_from_header(header: Any) -> Hparams:
    """Hparams from a runner.gguf.GGUFHeader (or anything with its get/arch_get/tensors/vocab_size)."""
    arch = header.architecture or ""
    g = header.arch_get
    n_layer = int(g("block_count", 0))
    n_embd = int(g("embedding_length", 0))
    names = frozenset(t.name for t in header.tensors)
    tok = header.tensor("token_embd.weight")
    out = header.tensor("output.weight") or tok
    tokens = header.get("tokenizer.ggml.tokens")
    n_vocab = header.vocab_size or (tok.shape[1] if tok else 0)
    n_vocab_out = out.shape[1] if out is not None and len(out.shape) > 1 else n_vocab

    n_head = _per_layer(g("attention.head_count"), n_layer)
    kv = g("attention.head_count_kv")
    n_head_kv = n_head if kv is None else _per_layer(kv, n_layer)
    n_ff = _per_layer(g("feed_forward_length"), n_layer)
    head0 = n_head[0] if n_head and n_head[0] else 0
    head_k = int(g("attention.key_length", n_embd // head0 if head0 else 0))
    head_v = int(g("attention.value_length", n_embd // head0 if head0 else 0))
    # MLA (llama_hparams::is_mla): the cache keeps only K, key_length wide (kv_lora_rank + rope dims)
    is_mla = bool(g("attention.key_length_mla")) and bool(g("attention.value_length_mla"))

    is_swa, n_swa = _swa_layers(arch, g, n_layer)
    recurrent, n_embd_r, n_embd_s = _recurrent(arch, g, n_layer, n_embd, n_head_kv)

    def ssm(key: str) -> int:
        return int(g(f"ssm.{key}", 0) or 0)

    return Hparams(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_vocab=n_vocab,
        n_vocab_out=n_vocab_out,
        n_ctx_train=int(g("context_length", 0)),
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        head_k=head_k,
        head_v=head_v,
        head_k_swa=int(g("attention.key_length_swa", head_k)),
        head_v_swa=int(g("attention.value_length_swa", head_v)),
        is_swa=is_swa,
        n_swa=n_swa,
        n_expert=int(g("expert_count", 0) or 0),
        n_expert_used=int(g("expert_used_count", 0) or 0),
        n_ff_exp=int(g("expert_feed_forward_length", 0) or 0),
        n_ff_shexp=int(g("expert_shared_feed_forward_length", 0) or 0),
        is_mla=is_mla,
        final_softcap=arch == "gemma2" or (arch == "gemma3" and bool(g("final_logit_softcapping", 0.0))),
        recurrent=recurrent,
        n_embd_r=n_embd_r,
        n_embd_s=n_embd_s,
        ssm=(ssm("conv_kernel"), ssm("inner_size"), ssm("state_size"), ssm("time_step_rank")),
        dot_bytes=max(
            (DOT_BYTES.get(t.type_name, 292 / 256) for t in header.tensors if t.name.startswith("blk.")),
            default=0.0,
        ),
        vocab_strings=len(tokens or ()) + len(header.get("tokenizer.ggml.merges") or ()),
        tensors=names,
    )


def _swa_layers(arch: str, g: Any, n_layer: int) -> tuple[tuple[bool, ...], int]:
    """is_swa per layer (llama_hparams::set_swa_pattern) and the window."""
    n_swa = int(g("attention.sliding_window", 4096 if arch == "gemma2" else 0) or 0)
    if arch not in SWA_PATTERN or (arch not in SWA_ALWAYS and n_swa <= 0):
        return (False,) * n_layer, 0
    pattern = g("attention.sliding_window_pattern", SWA_PATTERN[arch])
    if isinstance(pattern, (list, tuple)):
        return tuple(bool(p) for p in pattern[:n_layer]), n_swa
    n = int(pattern)
    return tuple(n == 0 or il % n < n - 1 for il in range(n_layer)), n_swa


def _recurrent(arch: str, g: Any, n_layer: int, n_embd: int, n_head_kv: tuple[int, ...]):
    """Which layers keep a recurrent state, and its size (llama_hparams::n_embd_r/n_embd_s)."""
    if arch not in RECURRENT and arch not in HYBRID:
        return (), 0, 0
    wkv = int(g("wkv.head_size", 0) or 0)
    if wkv:
        return (True,) * n_layer, int(g("token_shift_count", 2)) * n_embd, n_embd * wkv
    d_conv = int(g("ssm.conv_kernel", 0) or 0)
    d_inner = int(g("ssm.inner_size", 0) or 0)
    d_state = int(g("ssm.state_size", 0) or 0)
    n_group = int(g("ssm.group_count", 0) or 0)
    shortconv = int(g("shortconv.l_cache", 0) or 0)
    n_embd_r = (
        n_embd * (shortconv - 1) if shortconv else max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    )
    return _recurrent_layers(arch, g, n_layer, n_head_kv), n_embd_r, d_state * d_inner


def _recurrent_layers(arch: str, g: Any, n_layer: int, n_head_kv: tuple[int, ...]) -> tuple[bool, ...]:
    """llama_hparams::is_recr per layer, as each architecture sets it (src/models/<arch>.cpp)."""
    if arch in RECURRENT or arch == "falcon-h1":
        return (True,) * n_layer
    if arch in ("qwen3next", "qwen35", "qwen35moe", "minimax-01"):
        listed = g("attention.recurrent_layers")
        if isinstance(listed, (list, tuple)):
            return tuple(bool(v) for v in listed[:n_layer])
        interval = int(g("full_attention_interval", 4) or 4)
        return tuple((il + 1) % interval != 0 for il in range(n_layer))
    if arch.startswith("nemotron_h"):
        n_ff = _per_layer(g("feed_forward_length"), n_layer)
        return tuple(kv == 0 and ff == 0 for kv, ff in zip(n_head_kv, n_ff, strict=True))
    return tuple(h == 0 for h in n_head_kv)  # jamba, granitehybrid, plamo2, lfm2, kimi-linear
