"""runner.memory.estimate: headers in, bytes out (by hand), then two real loads against llama.cpp's log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runner.gguf import read_header
from runner.memory import estimate as memory
from runner.memory.arch import hparams_from_header
from runner.memory.graph import OUTPUT, Ctx, Graph, compute_buffer_size, pad
from runner.memory.kv import context_size, kv_cache_bytes
from runner.memory.weights import gpu_start
from tests.helpers import F16, Q4_0, header, llama_like

MiB = 1 << 20


# -- context sizes ------------------------------------------------------------------------------


@pytest.mark.fast
def test_context_is_padded_to_256_cells_but_the_batch_is_not():
    hp = hparams_from_header(llama_like())
    cs = context_size(hp, 300)
    assert (cs.n_ctx, cs.n_batch, cs.n_ubatch) == (512, 300, 300)


@pytest.mark.fast
def test_each_sequence_gets_a_padded_stream():
    hp = hparams_from_header(llama_like())
    cs = context_size(hp, 4096, n_seq=3)  # 4096 / 3 = 1365 -> 1536 cells a stream
    assert (cs.n_ctx_seq, cs.n_ctx, cs.n_stream) == (1536, 4608, 3)


# -- KV cache -----------------------------------------------------------------------------------


@pytest.mark.fast
def test_kv_cache_of_smollm2_by_hand():
    # 30 layers x (K + V) x 3 heads x 64 x f16 = 23040 bytes a cell; 2048 cells
    assert kv_cache_bytes(llama_like(), n_ctx=2048) == 30 * 2 * 3 * 64 * 2 * 2048 == 45 * MiB
    assert kv_cache_bytes(llama_like(), n_ctx=2000) == 45 * MiB  # 2000 -> 2048 cells


@pytest.mark.fast
def test_kv_cache_quantized_rows():
    # q8_0: 34 bytes per 32 values; K row 192 -> 204 bytes, V f16 row 384 bytes
    assert kv_cache_bytes(llama_like(), n_ctx=1024, type_k="q8_0") == 30 * (204 + 384) * 1024


@pytest.mark.fast
def test_kv_cache_per_layer_head_counts():
    h = llama_like(n_layer=4, n_embd=256, n_head=8, n_head_kv=[8, 2, 0, 1], arch="deci")
    # head dim 32: (8 + 2 + 0 + 1) heads x 32 x (K + V) x 2 bytes = 1408 bytes a cell
    assert kv_cache_bytes(h, n_ctx=512) == 1408 * 512


@pytest.mark.fast
def test_sliding_window_layers_are_full_size_under_the_defaults():
    h = llama_like(
        n_layer=6,
        n_embd=512,
        n_head=4,
        n_head_kv=1,
        arch="gemma3",
        **{"attention.key_length": 128, "attention.value_length": 128, "attention.sliding_window": 512},
    )
    hp = hparams_from_header(h)
    assert hp.is_swa == (True, True, True, True, True, False)  # pattern 6: every 6th layer is global
    per_cell = 6 * 128 * 2 * 2
    assert kv_cache_bytes(h, n_ctx=8192) == per_cell * 8192
    # with swa_full=False the window layers would keep PAD(512 + n_ubatch 512, 256) = 1024 cells
    assert kv_cache_bytes(h, n_ctx=8192, swa_full=False) == 128 * 2 * 2 * (8192 + 5 * 1024)


@pytest.mark.fast
def test_mla_keeps_no_v():
    h = llama_like(
        n_layer=2,
        n_embd=512,
        n_head=8,
        n_head_kv=1,
        arch="deepseek2",
        **{
            "attention.key_length_mla": 192,
            "attention.value_length_mla": 128,
            "attention.key_length": 576,
            "attention.value_length": 512,
        },
    )
    assert kv_cache_bytes(h, n_ctx=1024) == 2 * 576 * 2 * 1024


@pytest.mark.fast
@pytest.mark.parametrize("arch", ["bert", "jina-bert-v2", "nomic-bert", "modern-bert", "llada"])
def test_an_encoder_keeps_no_kv_cache(arch):
    # llama_model::create_memory() makes none for BERT and its kin (nor the diffusion models): the
    # synthetic reranker's shape, as a llama it would keep 2 layers x (K + V) x 64 x f16 a cell
    def shaped(a):
        return llama_like(n_layer=2, n_embd=64, n_head=4, n_head_kv=4, n_ff=256, n_vocab=245, arch=a)

    assert kv_cache_bytes(shaped("llama"), n_ctx=512) == 2 * 2 * 64 * 2 * 512 == 262_144
    assert kv_cache_bytes(shaped(arch), n_ctx=512) == 0
    llama, encoder = (
        memory.estimate(shaped(a), memory.Load(n_ctx=512, flash_attn=True)) for a in ("llama", arch)
    )
    assert encoder.kv_bytes == 0 and not [b for b in encoder.buffers if b.kind in ("KV", "RS")]
    # the same weights, compute and output; the cache gone, and the host's bookkeeping of its cells
    assert (encoder.weights_bytes, encoder.compute_bytes, encoder.output_bytes) == (
        llama.weights_bytes,
        llama.compute_bytes,
        llama.output_bytes,
    )
    assert llama.overhead_bytes - encoder.overhead_bytes == 512 * memory.HOST_PER_CELL
    assert llama.total_bytes - encoder.total_bytes == 262_144 + 512 * memory.HOST_PER_CELL


@pytest.mark.fast
def test_recurrent_state_does_not_grow_with_the_context():
    h = header(
        "mamba",
        {
            "block_count": 3,
            "embedding_length": 256,
            "ssm.conv_kernel": 4,
            "ssm.inner_size": 512,
            "ssm.state_size": 16,
            "vocab_size": 4096,
        },
        [("token_embd.weight", (256, 4096), F16)],
    )
    per_layer = 3 * 512 * 4 + 16 * 512 * 4  # conv state (d_conv - 1) x d_inner + ssm state, f32
    assert kv_cache_bytes(h, n_ctx=512) == kv_cache_bytes(h, n_ctx=32768) == 3 * per_layer
    assert kv_cache_bytes(h, n_ctx=512, n_seq=2) == 6 * per_layer


@pytest.mark.fast
def test_hybrid_keeps_kv_only_for_its_attention_layers():
    # qwen3next: one full-attention layer in 4 (full_attention_interval defaults to 4), the others
    # keep a gated delta-net state; counting every layer as attention would be 4x the KV cache
    h = header("qwen3next", {"block_count": 8, "embedding_length": 512, "attention.head_count": 8,
                             "attention.head_count_kv": 2, "attention.key_length": 128,
                             "attention.value_length": 128, "ssm.conv_kernel": 4, "ssm.inner_size": 1024,
                             "ssm.state_size": 128, "ssm.group_count": 4, "vocab_size": 1000},
               [("token_embd.weight", (512, 1000), F16)])  # fmt: skip
    hp = hparams_from_header(h)
    assert hp.attn_layers() == [3, 7]
    kv = 2 * (2 * 128 * 2 * 2) * 4096  # 2 layers x (K + V) x 2 heads x 128 x f16, 4096 cells
    state = 6 * (3 * (1024 + 2 * 4 * 128) * 4 + 128 * 1024 * 4)  # 6 layers x (conv + ssm state), f32
    assert kv_cache_bytes(h, n_ctx=4096) == kv + state


# -- weights and output -------------------------------------------------------------------------


@pytest.mark.fast
def test_output_buffer_is_one_logits_row_per_sequence_in_host_memory():
    e = memory.estimate(llama_like(), memory.Load(n_ctx=2048, n_seq=2))
    (out,) = [b for b in e.buffers if b.kind == "output"]
    assert (out.name, out.device, out.nbytes) == ("CPU", "cpu", 49152 * 2 * 4)


@pytest.mark.fast
def test_cpu_repack_takes_q4_0_matmul_weights_and_the_tied_output():
    h = llama_like(n_layer=2, n_embd=256, n_head=4, n_head_kv=4, n_ff=512, n_vocab=1024, weight=Q4_0)
    h = header(
        "llama",
        {k.split(".", 1)[1]: v for k, v in h.metadata.items() if k.startswith("llama.")},
        [(t.name, t.shape, Q4_0 if t.name == "token_embd.weight" else t.ggml_type) for t in h.tensors],
    )
    bufs = {b.name: b.nbytes for b in memory.estimate(h, memory.Load(n_ctx=512)).buffers if b.kind == "model"}
    q4 = lambda *ne: ne[0] * ne[1] // 32 * 18  # noqa: E731
    layer = 4 * q4(256, 256) + 3 * q4(256, 512)
    assert bufs["CPU_REPACK"] == 2 * layer + q4(256, 1024)  # the output duplicate of token_embd
    # the mapping spans from token_embd to output_norm, the repacked tensors included
    assert bufs["CPU_Mapped"] == h.tensors[-1].offset + h.tensors[-1].nbytes


@pytest.mark.fast
def test_gpu_layers_count_the_output_layer_last():
    h = llama_like(n_layer=4)
    assert gpu_start(4, 1) == 4  # only the output layer
    assert gpu_start(4, 3) == 2
    assert gpu_start(4, -1) == gpu_start(4, 99) == 0
    e = memory.estimate(h, memory.Load(n_ctx=1024, n_gpu_layers=1))
    gpu = {b.kind: b.nbytes for b in e.buffers if b.device == "gpu"}
    # tied: the output layer gets a copy of token_embd, q8_0 rows padded from 576 to 1024 values for
    # the whole tensor (448 values more), and output_norm; each rounded to 128 bytes
    embd = 576 // 32 * 34 * 49152 + 448 // 32 * 34
    assert gpu["model"] == pad(embd, 128) + 576 * 4
    assert "KV" not in gpu  # no repeating layer on the GPU: the whole cache stays on the CPU
    assert e.n_gpu_layers == 1 and e.n_layers == 5
    assert [b.name for b in e.buffers if b.kind == "output"] == ["CUDA_Host"]


@pytest.mark.fast
def test_partial_offload_splits_weights_and_kv_by_layer():
    h = llama_like(n_layer=4)
    e = memory.estimate(h, memory.Load(n_ctx=1024, n_gpu_layers=3))  # layers 2, 3 and the output
    kv = {b.device: b.nbytes for b in e.buffers if b.kind == "KV"}
    assert kv == {"cpu": 2 * 2 * 3 * 64 * 2 * 1024, "gpu": 2 * 2 * 3 * 64 * 2 * 1024}
    layer_bytes = sum(t.nbytes for t in h.tensors if t.name.startswith("blk.0."))
    cpu, gpu = e.device("cpu"), e.device("gpu")
    assert cpu is not None and gpu is not None
    assert cpu.weights_bytes == h.tensor("token_embd.weight").nbytes + 2 * layer_bytes
    assert gpu.weights_bytes > 2 * layer_bytes + h.tensor("token_embd.weight").nbytes  # + the tied output
    assert gpu.overhead_bytes == memory.GPU_OVERHEAD and not e.exact


# -- compute: the allocator replay --------------------------------------------------------------


@pytest.mark.fast
def test_allocator_reuses_memory_in_place_and_keeps_inputs():
    c, g = Ctx(), Graph()
    x = c.input("f32", (1000,))  # 4000 bytes, allocated first
    y = c.mul_mat(c.weight((1000, 2000)), x)  # 8000 bytes, above x
    z = c.unary("SCALE", y)  # in place: y's memory
    z.flags |= OUTPUT
    w = c.mul_mat(c.weight((2000, 500)), z)  # 2000 bytes: x is free by now, fits below
    w.flags |= OUTPUT
    g.expand(w)
    assert compute_buffer_size(g) == 12000


@pytest.mark.fast
def test_compute_buffer_of_smollm2_matches_the_log():
    # llama.cpp logs 98.25, 102.51, 98.25 MiB: the peak depends on placement, not monotonic in n_ctx
    sizes = [
        memory.estimate(llama_like(), memory.Load(n_ctx=n)).compute_bytes / MiB for n in (512, 2048, 8192)
    ]
    assert [round(s, 2) for s in sizes] == [98.25, 102.51, 98.25]


@pytest.mark.fast
def test_quantized_v_without_flash_attention_is_refused():
    with pytest.raises(ValueError, match="flash attention"):
        memory.estimate(llama_like(), memory.Load(n_ctx=512, type_v="q8_0", flash_attn=False))


# -- against llama.cpp --------------------------------------------------------------------------

LOG_LINE = re.compile(r"(\w+):\s+(\S+)\s+(model|KV|RS|output|compute) buffer size =\s+([\d.]+) MiB")


def logged_buffers(path: Path, n_ctx: int, flash_attn: bool | None = None) -> list[tuple[str, str, float]]:
    """Load through runner's engine, as runner does, and collect llama.cpp's buffer lines; the context
    allocated whole (the size it grows to as it fills, which the plan must hold)."""
    from unittest import mock

    from runner.engine import context as context_module
    from runner.engine.engine import Engine
    from runner.engine.llamacpp import LLAMA_LOG, Placement

    lines: list[str] = []
    listener = lambda _level, text: lines.append(text)  # noqa: E731
    LLAMA_LOG.listeners.append(listener)
    try:
        with (
            mock.patch.object(context_module, "START_CTX", 1 << 30),
            Engine(path, n_ctx=n_ctx, n_threads=2, placement=Placement(flash_attn=flash_attn)),
        ):
            pass
    finally:
        LLAMA_LOG.listeners.remove(listener)
    return sorted((m[2], m[3], float(m[4])) for m in LOG_LINE.finditer("".join(lines)))


def assert_matches_log(path: Path, n_ctx: int, flash_attn: bool | None = None) -> None:
    from runner.engine.llamacpp import repack_types

    est = memory.estimate(
        read_header(path), memory.Load(n_ctx=n_ctx, flash_attn=flash_attn), repack_types=repack_types()
    )
    want = sorted((b.name, b.kind, b.nbytes / MiB) for b in est.buffers)
    got = logged_buffers(path, n_ctx, flash_attn)
    assert [(n, k) for n, k, _ in want] == [(n, k) for n, k, _ in got]
    for (name, kind, mib), (_, _, logged) in zip(want, got, strict=True):
        assert mib == pytest.approx(logged, rel=0.05, abs=0.006), (name, kind)
    assert est.n_ctx == n_ctx


@pytest.mark.model
def test_smollm2_estimate_matches_llama_cpp(smollm2_path: Path):
    assert_matches_log(smollm2_path, 1024)


@pytest.mark.model
def test_smollm2_estimate_without_flash_attention_matches_llama_cpp(smollm2_path: Path):
    # what a chat on the CPU loads with (loader.CPU_CHAT_FLASH_ATTN): a transposed V cache, and
    # the attention scores in the compute buffer; larger than with flash attention
    assert_matches_log(smollm2_path, 4096, flash_attn=False)
    on, off = (
        memory.estimate(read_header(smollm2_path), memory.Load(n_ctx=4096, flash_attn=fa))
        for fa in (None, False)
    )
    assert off.compute_bytes > on.compute_bytes


@pytest.mark.model
def test_synthetic_sliding_window_model_matches_llama_cpp(tmp_path: Path):
    import synth

    path = synth.write_model(tmp_path / "gemma3.gguf", synth.SPECS["gemma3"])
    assert_matches_log(path, 1024)


@pytest.mark.model
def test_the_compute_replay_is_remembered_on_disk_and_a_bad_entry_is_ignored(
    smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runner.memory import compute

    monkeypatch.setenv("RUNNER_HOME", str(tmp_path))
    calls: list[int] = []  # the replays, counted through the allocator they run
    real = compute.compute_buffer_size
    monkeypatch.setattr(compute, "compute_buffer_size", lambda *a, **k: calls.append(1) or real(*a, **k))
    header = read_header(smollm2_path)
    first = memory.estimate(header, memory.Load(n_ctx=2048))
    replays = len(calls)
    assert replays > 0 and list((tmp_path / "cache" / "compute").glob("*.json"))
    again = memory.estimate(header, memory.Load(n_ctx=2048))
    assert len(calls) == replays and again == first  # read back, not replayed
    for f in (tmp_path / "cache" / "compute").glob("*.json"):
        f.write_text("{not json")
    assert memory.estimate(header, memory.Load(n_ctx=2048)) == first and len(calls) == 2 * replays


@pytest.mark.model
def test_llama_cpp_s_log_stays_runner_s_when_the_whole_package_is_imported_later(smollm2_path: Path) -> None:
    from runner.engine.llamacpp import llama

    llama()  # runner's first: the package is only its ctypes layer (as in tests/test_devices.py)
    import llama_cpp

    llama_cpp.Llama  # noqa: B018 - completes the package: its _logger sets its own log callback
    assert logged_buffers(smollm2_path, 512)  # llama.cpp's buffer lines still reach runner
