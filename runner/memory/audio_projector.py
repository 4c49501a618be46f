"""What libmtmd allocates for an audio projector (a whisper-style encoder), before anything loads: its
weights exactly (as for a vision projector: runner.memory.projector.weight_bytes) and its encoder's
compute buffer for one 30-second window, approximately.

The window's graph (models/whisper-enc.cpp): 3000 mel frames in, two 1-D convolutions (im2col
buffers of frames x mel x 3 and positions x width x 3), then `blocks` transformer blocks over 1500
positions. The buffer is taken as its input plus the larger of the convolutions' stage and one
block's (Q, K, V, the attention's output, the FFN's; the attention scores, heads x 1500 x 1500 f32
twice, where flash attention is off): an upper bound of ggml-alloc's placement, not its replay
(runner.memory.clip_graph replays the vision graphs node for node; the whisper graph is not
replayed yet).
"""

from __future__ import annotations

from typing import Any

from runner.memory.graph import pad
from runner.memory.kv import CPU_ALIGNMENT
from runner.memory.projector import COMPUTE_META, HOST_FIXED, ProjectorMemory, weight_bytes


def window_compute_bytes(info: Any, flash_attn: bool) -> int:
    """The encoder's compute buffer for one window (AudioProjectorInfo `info`), approximately."""
    frames, pos, e, f = 3000, 1500, info.width, info.n_ff
    inp = frames * info.n_mel * 4
    conv = frames * info.n_mel * 3 * 4 + frames * e * 4 + pos * e * 3 * 4 + pos * e * 4
    scores = 0 if flash_attn else 2 * info.heads * pos * pos * 4
    block = scores + 6 * pos * e * 4 + 2 * pos * f * 4
    stacked = pos * e * 4 * 2  # the stacked frames and the projection's input
    return pad(inp + max(conv, block, stacked), CPU_ALIGNMENT)


def estimate_audio_projector(header: Any, info: Any) -> ProjectorMemory:
    """A ProjectorMemory for an audio projector: image_tokens are one window's embeddings, image_size
    0 (no image); host memory holds a window's mel spectrogram (kept in its chunk, then copied as the
    input), its embeddings, and the graph's metadata."""
    cpu = window_compute_bytes(info, flash_attn=True)
    gpu = window_compute_bytes(info, flash_attn=False)
    mel = 3000 * info.n_mel * 4
    host = 2 * mel + info.window_tokens * info.projection_width * 4 + COMPUTE_META + HOST_FIXED
    return ProjectorMemory(
        projector_type=info.projector_type,
        image_tokens=info.window_tokens,
        image_size=0,
        tensor_bytes=sum(t.nbytes for t in header.tensors),
        weights_cpu=weight_bytes(header, gpu=False),
        weights_gpu=weight_bytes(header, gpu=True),
        compute_cpu=cpu,
        compute_gpu=gpu,
        inputs_gpu_host=pad(mel, CPU_ALIGNMENT),
        host_bytes=host,
    )
