"""The compute buffer llama.cpp reserves, replayed, and remembered on disk.

llama_context reserves the worst-case graph (n_ubatch tokens, n_ubatch logits) and the
one-token graph into one buffer, which keeps the larger size. compute_bytes() builds both as
llama.cpp builds them (build.py) and places them with a replay of ggml-alloc (graph.py), to the
byte on CPU; since that costs ~0.1 s, each result is cached under the runner cache, keyed on
its inputs and on the source of the modules the replay runs. host_inputs_bytes() is the part
that stays in host memory when layers are offloaded.
"""

from __future__ import annotations

import functools
import os
from dataclasses import asdict
from typing import Any

from runner.memory.arch import Hparams
from runner.memory.build import GraphParams, build_graph, rotation_sizes
from runner.memory.graph import compute_buffer_size, pad
from runner.memory.kv import CPU_ALIGNMENT, SWA_FULL, Attention, ContextSize, swa_cells


def graph_params(hp: Hparams, cs: ContextSize, n_tokens: int, n_outputs: int, **kw: Any) -> GraphParams:
    """The ubatch graph_reserve() builds: n_tokens rounded up to a multiple of n_seq
    (llama-context.cpp:2527), cells per stream, and the Hadamard sizes for quantized K/V."""
    rot_k, rot_v = rotation_sizes(hp, kw["type_k"], kw["type_v"])
    n_kv_swa = swa_cells(hp, cs, kw.pop("swa_full", SWA_FULL))
    return GraphParams(
        pad(n_tokens, cs.n_seq),
        cs.n_seq,
        n_outputs,
        cs.n_ctx_seq,
        n_kv_swa,
        cs.n_stream,
        rot_k=rot_k,
        rot_v=rot_v,
        **kw,
    )


def _replays_cached(replay: Any) -> Any:
    """compute_bytes, remembered on disk: the allocator replay of two graphs costs ~0.1 s per call, and
    a one-shot `runner run` plans the same file with the same settings every time. The key is every
    input (frozen dataclasses, by repr) and a hash of the modelling code itself, so a changed model of
    llama.cpp's graphs never reads an old figure; an unreadable or unwritable cache is no cache."""

    def cached(hp: Hparams, cs: ContextSize, attn: Attention, **kw: Any) -> int:
        import hashlib
        import json

        from runner.paths import cache_dir

        key = hashlib.sha256(repr(_canonical((_code_hash(), hp, cs, attn, kw))).encode()).hexdigest()
        path = cache_dir() / "compute" / f"{key[:32]}.json"
        try:
            return int(json.loads(path.read_text())["bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        value = int(replay(hp, cs, attn, **kw))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"bytes": value}))
            os.replace(tmp, path)
        except OSError:
            pass
        return value

    return cached


def _canonical(value: Any) -> Any:
    """value with every set sorted and every dataclass as its fields: the same repr in every process
    (a frozenset of strings prints in an order that changes with Python's hash seed)."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (
            type(value).__name__,
            [(f.name, _canonical(getattr(value, f.name))) for f in dataclasses.fields(value)],
        )
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=repr)
    if isinstance(value, dict):
        return sorted(((k, _canonical(v)) for k, v in value.items()), key=repr)
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


@functools.cache
def _code_hash() -> str:
    """A hash of the source of every module a replay runs: this one, the context sizes and the
    sliding-window cells (kv.py), the hparams, the graph builder and the allocator."""
    import hashlib
    from pathlib import Path

    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in ("arch.py", "build.py", "graph.py", "kv.py", "compute.py"):
        digest.update((here / name).read_bytes())
    return digest.hexdigest()


@_replays_cached
def compute_bytes(
    hp: Hparams, cs: ContextSize, attn: Attention, *, alignment: int = CPU_ALIGNMENT, touched: bool = False
) -> int:
    """The compute buffer llama_context::sched_reserve() allocates (llama-context.cpp:612-760), for
    a context of cs made with the attention settings attn.

    The prompt-processing graph (n_ubatch tokens, all of them output: n_outputs_max defaults
    to n_batch) and the one-token graph are reserved into the same buffer, which keeps the
    larger size. touched: the part the engine's batches really write (one output per batch,
    the last token's), which is what a CPU buffer costs in resident memory: malloc'd pages
    that nothing writes are never backed.
    """
    n_pp = min(cs.n_ctx, cs.n_ubatch)
    sizes = []
    for n_tokens, n_out in ((n_pp, cs.n_seq if touched else min(n_pp, cs.n_batch)), (cs.n_seq, cs.n_seq)):
        gp = graph_params(hp, cs, n_tokens, n_out, **asdict(attn))
        sizes.append(compute_buffer_size(build_graph(hp, gp), alignment))
    return max(sizes)


def host_inputs_bytes(hp: Hparams, cs: ContextSize, *, flash_attn: bool, v_trans: bool) -> int:
    """The graph inputs and the token embeddings, which stay in host memory when layers are offloaded."""
    t = min(cs.n_ctx, cs.n_ubatch)
    n_masks = 2 if hp.swa_any else 1
    v_rows = t * max(hp.n_embd_v_gqa(il) for il in range(hp.n_layer)) if v_trans else t
    # tokens, positions, embeddings (the input and the lookup), out_ids, then masks and indices
    sizes = [t * 4, t * 4, hp.n_embd * t * 4 * 2, t * 4]
    sizes += [cs.n_ctx_seq * t * (2 if flash_attn else 4), t * 8, v_rows * 8] * n_masks
    return sum(pad(s, CPU_ALIGNMENT) for s in sizes)
