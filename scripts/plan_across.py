"""On paper: a 70B Q4_K_M model planned across two or three --rpc workers, and what the split costs
the network per token.

No Hub, no workers, no model file: the GGUF header of bartowski/Llama-3.3-70B-Instruct-GGUF's
Llama-3.3-70B-Instruct-Q4_K_M.gguf is reconstructed in memory, tensor by tensor, as llama.cpp's
quantizer (llama-quant.cpp, llama_tensor_get_type_impl, of the pinned llama.cpp) lays out a Q4_K_M
file of Llama 3.x 70B's shapes, and checked against the published file size. The workers are CPU
machines described by what they would report (ggml's CPU device reports all of its RAM as free).
Each plan is runner's own (runner.memory.plan.make_plan), printed as `runner fit --rpc` prints it.

The traffic per token is computed from ggml-rpc's protocol (ggml-rpc.cpp: the packed rpc_tensor,
SET_TENSOR, GET_TENSOR, GRAPH_COMPUTE / GRAPH_RECOMPUTE) and ggml_backend_sched's copies of each
split's inputs; the time a token takes from an assumed memory bandwidth, as runner's decode estimate
(runner.memory.speed.bytes_per_token) does. Nothing here is measured.

    python scripts/plan_across.py                     # the scenarios at --ctx 8192 and 32768
    python scripts/plan_across.py --ctx 8192 --bandwidth 50
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner.commands import fit  # noqa: E402
from runner.gguf import GGUFHeader, TensorInfo  # noqa: E402
from runner.hub.headers import ModelHeaders  # noqa: E402
from runner.hub.refs import HubRef  # noqa: E402
from runner.memory import speed  # noqa: E402
from runner.memory.arch import hparams_from_header  # noqa: E402
from runner.memory.build import build_graph  # noqa: E402
from runner.memory.compute import graph_params  # noqa: E402
from runner.memory.devices import Machine, Remote  # noqa: E402
from runner.memory.graph import Graph, Tensor  # noqa: E402
from runner.memory.kv import context_size  # noqa: E402
from runner.memory.plan import CPU_MARGIN, Ask, Plan, departures, make_plan  # noqa: E402

GiB = 1 << 30
REPO = "bartowski/Llama-3.3-70B-Instruct-GGUF"
FILE = "Llama-3.3-70B-Instruct-Q4_K_M.gguf"
PUBLISHED_BYTES = 42.5e9  # the Hub's listing of that file: "42.5 GB" (rounded to 0.1 GB)
HEADER_BYTES = 8 << 20  # metadata before the tensor data (128,256 tokens, 280,147 merges): assumed

# Llama 3.3 70B (config.json), as convert_hf_to_gguf.py writes it
N_LAYER, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, HEAD_DIM = 80, 8192, 28672, 64, 8, 128
N_VOCAB, N_MERGES, N_CTX_TRAIN, ROPE_THETA = 128256, 280147, 131072, 500000.0
F32, Q4_K, Q5_K, Q6_K = 0, 12, 13, 14
MOSTLY_Q4_K_M = 15  # general.file_type

# this machine and the workers: sizes as a machine reports them
LOCAL_RAM, LOCAL_AVAILABLE = 16 * GiB, 12 * GiB
SCENARIOS = (
    ("this machine alone", ()),
    ("(a) two workers of 24 GiB", (24, 24)),
    ("(b) two workers of 32 GiB", (32, 32)),
    ("(c) three workers of 24 GiB", (24, 24, 24)),
)

# the network and the machines' speed: assumptions, not measurements
LINK_BYTES_PER_S = 117e6  # 1 GbE: 125 MB/s on the wire, ~117 MB/s of TCP payload at MTU 1500
RTT_S = 0.2e-3  # a round trip on a switched LAN
BANDWIDTHS_GB_S = (50.0, 100.0)  # a worker's memory bandwidth, as a decode reads its weights
PREFILL_FLOPS = 1e12  # what a CPU worker's matmuls sustain on a 512-token batch (assumed)
PROMPT_TOKENS = 512  # one ubatch (n_ubatch 512)
DRAFTS = 8  # a speculative verify batch: the last token and 8 drafts, logits at each

# ggml-rpc's wire format (ggml-rpc.cpp, #pragma pack(1)): a request is | cmd u8 | size u64 | data |,
# a response | size u64 | data |
RPC_TENSOR = 8 + 4 + 8 + 4 * 4 + 4 * 4 + 4 + 64 + 4 + 10 * 8 + 8 + 8 + 8 + 64 + 4  # struct rpc_tensor
REQUEST, RESPONSE = 1 + 8, 8
SET_TENSOR = REQUEST + RPC_TENSOR + 1 + 8  # | rpc_tensor | cache_flag u8 | offset u64 | data |
GET_TENSOR_REQ = REQUEST + RPC_TENSOR + 8 + 8  # | rpc_tensor | offset u64 | size u64 |
GRAPH_RECOMPUTE = REQUEST + 4  # | device u32 |
HASH_THRESHOLD = 10 << 20  # weights above this are offered by hash first (the worker's tensor cache)


# -- the header ------------------------------------------------------------------------------------


class Strings(Sequence[str]):
    """A string array of which only the length is known: the estimator counts the vocabulary and
    the merges (hparams_from_header, GGUFHeader.vocab_size), it reads none of them."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        raise IndexError("reconstructed header: the strings themselves are not known")


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant.cpp's rule for the layers Q4_K_M gives more bits: the first and last eighth, and
    every third layer between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def q4_k_m_tensors() -> list[tuple[str, tuple[int, ...], int]]:
    """(name, ggml shape, type) in the order llama-quantize writes them (llama_model_loader's
    weights_map: the tensors of no layer, by name, then each layer's by name)."""
    kv = N_HEAD_KV * HEAD_DIM
    out = [
        ("output.weight", (N_EMBD, N_VOCAB), Q6_K),  # the output tensor: Q6_K (its row is a multiple of 256)
        ("output_norm.weight", (N_EMBD,), F32),
        ("rope_freqs.weight", (HEAD_DIM // 2,), F32),  # llama3 rope scaling, written by the converter
        ("token_embd.weight", (N_EMBD, N_VOCAB), Q4_K),  # not tied: the file type's default
    ]
    for il in range(N_LAYER):
        more = use_more_bits(il, N_LAYER)  # i_attention_wv and i_ffn_down count layers in this order
        out += [
            (f"blk.{il}.attn_k.weight", (N_EMBD, kv), Q4_K),
            (f"blk.{il}.attn_norm.weight", (N_EMBD,), F32),
            (f"blk.{il}.attn_output.weight", (N_HEAD * HEAD_DIM, N_EMBD), Q4_K),
            (f"blk.{il}.attn_q.weight", (N_EMBD, N_HEAD * HEAD_DIM), Q4_K),
            # Q6_K where more bits, else Q4_K raised to Q5_K: LLM_TYPE_70B (80 layers, GQA)
            (f"blk.{il}.attn_v.weight", (N_EMBD, kv), Q6_K if more else Q5_K),
            (f"blk.{il}.ffn_down.weight", (N_FF, N_EMBD), Q6_K if more else Q4_K),
            (f"blk.{il}.ffn_gate.weight", (N_EMBD, N_FF), Q4_K),
            (f"blk.{il}.ffn_norm.weight", (N_EMBD,), F32),
            (f"blk.{il}.ffn_up.weight", (N_EMBD, N_FF), Q4_K),
        ]
    return out


def reconstructed_header() -> GGUFHeader:
    """The header as runner.gguf.read_header() would return it from the Hub (tensor data packed at
    the default alignment of 32)."""
    infos, offset = [], 0
    for name, shape, ggml_type in q4_k_m_tensors():
        info = TensorInfo(name, shape, ggml_type, offset)
        infos.append(info)
        offset += -(-info.nbytes // 32) * 32
    arch = {
        "block_count": N_LAYER,
        "context_length": N_CTX_TRAIN,
        "embedding_length": N_EMBD,
        "feed_forward_length": N_FF,
        "attention.head_count": N_HEAD,
        "attention.head_count_kv": N_HEAD_KV,
        "attention.layer_norm_rms_epsilon": 1e-5,
        "rope.freq_base": ROPE_THETA,
        "rope.dimension_count": HEAD_DIM,
        "vocab_size": N_VOCAB,
    }
    metadata: dict[str, Any] = {
        "general.architecture": "llama",
        "general.name": "Llama 3.3 70B Instruct",
        "general.file_type": MOSTLY_Q4_K_M,
        **{f"llama.{k}": v for k, v in arch.items()},
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": Strings(N_VOCAB),
        "tokenizer.ggml.merges": Strings(N_MERGES),
        "tokenizer.ggml.bos_token_id": 128000,
        "tokenizer.ggml.eos_token_id": 128009,
    }
    url = f"https://huggingface.co/{REPO}/resolve/main/{FILE}"
    return GGUFHeader(url, 3, metadata, tuple(infos), 32, HEADER_BYTES, HEADER_BYTES + offset)


def describe_header(h: GGUFHeader, out: TextIO) -> None:
    types = Counter(t.type_name for t in h.tensors)
    params = sum(_elements(t) for t in h.tensors)
    size = h.expected_file_size
    out.write(f"{FILE}, reconstructed (not read): {len(h.tensors)} tensors, ")
    out.write(", ".join(f"{n} {name}" for name, n in sorted(types.items())) + "\n")
    out.write(
        f"  tensor data {h.data_size:,} B = {h.data_size / GiB:.2f} GiB, {params / 1e9:.2f} B parameters; "
        f"with ~{HEADER_BYTES >> 20} MiB of header {size / 1e9:.2f} GB"
        f" (the Hub lists {PUBLISHED_BYTES / 1e9:.1f} GB: {100 * (size / PUBLISHED_BYTES - 1):+.2f}%)\n"
    )


def _elements(t: TensorInfo) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return n


# -- the plans -------------------------------------------------------------------------------------


def machine(workers_gib: tuple[int, ...]) -> Machine:
    """This machine (a CPU build) with CPU workers of these sizes (ggml's CPU device: free = total)."""
    workers = tuple(
        Remote(f"192.0.2.{i + 1}:50052", size * GiB, size * GiB) for i, size in enumerate(workers_gib)
    )
    return Machine(LOCAL_RAM, LOCAL_AVAILABLE, workers=workers)


def show_plan(header: GGUFHeader, here: Machine, ctx: int, kv: str, out: TextIO) -> Plan:
    """make_plan's plan, printed as `runner fit REPO:Q4_K_M --ctx N --kv-type KV --rpc ...` prints it."""
    plan = make_plan(header, here, Ask(ctx=ctx, kv_type=kv))
    model = ModelHeaders((header,), header.source, header.expected_file_size)
    ref = HubRef(REPO, quant="Q4_K_M")
    chose = departures(plan, header, here, ctx=ctx, gpu_layers=None, kv_type=kv) if plan.fits else []
    decode = speed.decode(header, plan, here, None) if not here.workers else None  # none with --rpc
    fit._describe(ref, model, plan, here, decode, out, chose, ctx)
    return plan


# -- the network -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Traffic:
    """What crosses this machine's link for one llama_decode, summed over the workers."""

    sent: int  # bytes this machine sends
    received: int
    round_trips: int  # GET_TENSOR answers it waits for, one after another
    graph_bytes: int  # GRAPH_COMPUTE: the graphs, sent again whenever llama.cpp rebuilds them

    @property
    def total(self) -> int:
        return self.sent + self.received

    def seconds(self, with_graph: bool = False) -> float:
        nbytes = self.total + (self.graph_bytes if with_graph else 0)
        return nbytes / LINK_BYTES_PER_S + self.round_trips * RTT_S


def graph_shape(header: GGUFHeader, n_tokens: int, n_ctx: int) -> tuple[int, int]:
    """(nodes, tensors) of one layer of llama.cpp's graph, by runner's model of it (build.py): what
    serialize_graph() sends for each layer (every node, and every tensor it reaches: weights, views,
    the KV cache, inputs)."""
    hp = hparams_from_header(header)
    cs = context_size(hp, n_ctx)
    kw = dict(flash_attn=True, v_trans=False, type_k="f16", type_v="f16")
    g: Graph = build_graph(hp, graph_params(hp, cs, n_tokens, 1, **kw))
    seen: dict[int, Tensor] = {}
    stack = list(g.nodes)
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen[id(t)] = t
        stack += [*t.src, *([t.view_src] if t.view_src is not None else [])]
    return len(g.nodes) // hp.n_layer, len(seen) // hp.n_layer


def traffic(header: GGUFHeader, layers: list[int], n_tokens: int, n_kv: int, n_outputs: int = 1) -> Traffic:
    """One llama_decode of n_tokens over workers holding these layers (the output layer on the last),
    with n_kv cells in view. Each worker's split gets its inputs from this machine (SET_TENSOR: the
    hidden state, positions, K and V cell indices, the f16 mask of flash attention; the last also
    out_ids); the hidden state comes back from each worker but the last (GET_TENSOR: ggml-rpc copies
    between two workers through the client), the logits from the last. A reused graph is one
    GRAPH_RECOMPUTE; a rebuilt one (every 256 cells, each new batch size) a GRAPH_COMPUTE."""
    hidden = N_EMBD * 4 * n_tokens
    inputs = [4 * n_tokens, 8 * n_tokens, 8 * n_tokens, 2 * n_kv * n_tokens]  # pos, k_idxs, v_idxs, mask
    nodes, tensors = graph_shape(header, n_tokens, max(n_kv, 256))
    sent = received = round_trips = graph = 0
    for i, n_layers in enumerate(layers):
        last = i == len(layers) - 1
        sent += SET_TENSOR + hidden + sum(SET_TENSOR + n for n in inputs) + GRAPH_RECOMPUTE
        if last:
            sent += SET_TENSOR + 4 * n_outputs  # out_ids
        graph += REQUEST + 4 + 4 + 8 * nodes * n_layers + 4 + RPC_TENSOR * tensors * n_layers
        answer = N_VOCAB * 4 * n_outputs if last else hidden
        sent += GET_TENSOR_REQ
        received += RESPONSE + answer
        round_trips += 1
    return Traffic(sent, received, round_trips, graph)


def load_bytes(header: GGUFHeader, plan: Plan) -> tuple[int, int]:
    """(bytes of weights the workers receive at a load, of which a worker's tensor cache cannot
    spare: tensors of HASH_THRESHOLD or less are always sent)."""
    start = N_LAYER + 1 - plan.n_gpu_layers
    on_workers = [t for t in header.tensors if _layer(t.name) >= start]
    return sum(t.nbytes for t in on_workers), sum(t.nbytes for t in on_workers if t.nbytes <= HASH_THRESHOLD)


def _layer(name: str) -> int:
    if name.startswith("blk."):
        return int(name.split(".")[1])
    return N_LAYER if name.startswith("output") else 0 if name.startswith("rope_") else -1


def show_network(
    header: GGUFHeader, plan: Plan, here: Machine, bandwidths: Sequence[float], out: TextIO
) -> None:
    layers = [n for _, n in fit.layers_per_worker(plan, here)]
    n_ctx = plan.n_ctx
    decode = traffic(header, layers, 1, n_ctx)
    early = traffic(header, layers, 1, 256)
    verify = traffic(header, layers, 1 + DRAFTS, n_ctx, n_outputs=1 + DRAFTS)
    prompt = traffic(header, layers, PROMPT_TOKENS, PROMPT_TOKENS)
    per_token = speed.bytes_per_token(header, plan)
    kb = 1e3
    out.write(f"network, {len(layers)} workers ({', '.join(map(str, layers))} layers), 1 GbE:\n")
    out.write(
        f"  decode, one token: {decode.sent / kb:,.1f} KB out, {decode.received / kb:,.1f} KB back, "
        f"{decode.round_trips} round trips = {decode.seconds() * 1e3:.1f} ms at {n_ctx:,} cells in view "
        f"({early.total / kb:,.1f} KB, {early.seconds() * 1e3:.1f} ms at 256)\n"
    )
    graphs = decode.graph_bytes
    out.write(
        f"    + the graphs again every 256 tokens: {graphs / kb:,.0f} KB "
        f"= {graphs / LINK_BYTES_PER_S * 1e3:.1f} ms, {graphs / 256 / kb:.1f} KB a token\n"
    )
    for bw in bandwidths:
        local = per_token / (bw * 1e9)
        out.write(
            f"    against {per_token / 1e9:.1f} GB read a token at {bw:.0f} GB/s: {local * 1e3:,.0f} ms"
            f" ({1 / local:.2f} tok/s) -> {1 / (local + decode.seconds()):.2f} tok/s split,"
            f" {100 * decode.seconds() / local:.1f}% slower\n"
        )
    out.write(
        f"  a verify batch of {DRAFTS} drafts (runner's speculation): {verify.total / kb:,.1f} KB"
        f" ({1 + DRAFTS} rows of logits) = {verify.seconds() * 1e3:.1f} ms\n"
    )
    flops = 2 * sum(_elements(t) for t in header.tensors if t.name != "token_embd.weight") * PROMPT_TOKENS
    compute = flops / PREFILL_FLOPS
    net = prompt.seconds(with_graph=True)
    out.write(
        f"  prefill, {PROMPT_TOKENS} tokens: {prompt.total / 1e6:,.1f} MB + graphs "
        f"{prompt.graph_bytes / 1e6:.1f} MB = {net:.2f} s, against {flops / 1e12:.0f} TFLOP"
        f" at {PREFILL_FLOPS / 1e12:.0f} TFLOP/s = {compute:.0f} s ({100 * net / compute:.1f}%)\n"
    )
    sent, always = load_bytes(header, plan)
    out.write(
        f"  load: {sent / 1e9:.1f} GB of weights = {sent / LINK_BYTES_PER_S / 60:.1f} min the first time;"
        f" from the workers' tensor cache {always / 1e9:.2f} GB (tensors of 10 MiB or less)"
        f" = {always / LINK_BYTES_PER_S:.0f} s\n"
    )


# -- main ------------------------------------------------------------------------------------------


def scenarios(contexts: list[int]) -> Iterator[tuple[str, tuple[int, ...], int]]:
    for ctx in contexts:
        for label, sizes in SCENARIOS:
            yield label, sizes, ctx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--ctx", type=int, action="append", help="context (repeatable) [8192 and 32768]")
    parser.add_argument("--kv-type", default="f16", help="KV cache type [f16]")
    parser.add_argument("--bandwidth", type=float, action="append", help="a worker's memory GB/s [50, 100]")
    args = parser.parse_args(argv)
    bandwidths = args.bandwidth or BANDWIDTHS_GB_S
    out = sys.stdout
    header = reconstructed_header()
    describe_header(header, out)
    summary = []
    for label, sizes, ctx in scenarios(args.ctx or [8192, 32768]):
        here = machine(sizes)
        out.write(f"\n== {label}, --ctx {ctx}, --kv-type {args.kv_type} ".ljust(100, "=") + "\n\n")
        plan = show_plan(header, here, ctx, args.kv_type, out)
        if here.workers:
            worst = max(v.needed_bytes for v in plan.verdicts if v.device != "cpu") / (1 - CPU_MARGIN)
            out.write(f"\nworkers: this plan needs each to report {worst / GiB:.1f} GiB of RAM or more\n")
        if here.workers and plan.fits:
            out.write("\n")
            show_network(header, plan, here, bandwidths, out)
        summary.append((label, ctx, fit.verdict(plan)))
    out.write("\nsummary\n")
    width = max(len(label) for label, _, _ in summary)
    out.writelines(f"  {label:<{width}}  --ctx {ctx:<6} {verdict}\n" for label, ctx, verdict in summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
