"""What libmtmd allocates for an audio projector (a whisper-style encoder), before anything loads: its
weights exactly (as for a vision projector: runner.memory.projector.weight_bytes) and its encoder's
compute buffer for one 30-second window.

The window's graph (models/whisper-enc.cpp): 3000 mel frames in, two 1-D convolutions (ggml_conv_1d
writes its im2col in F16: frames x mel x 3, then positions x width x 3), then `blocks` transformer
blocks over 1500 positions. ggml-alloc frees a tensor after its last use, so the buffer is the
largest of three moments: the input beside the first im2col; the first convolution's output beside
the second im2col; and one block (the attention's scores, heads x 1500 x 1500 f32, where flash
attention is off, beside Q, K, V and the output, or the FFN's activations). Not a node-for-node replay
as runner.memory.clip_graph does for the vision graphs, but fitted to libmtmd's own log for the
test projector (tests/test_audio.py: 3.66 MiB with flash attention, 18.08 MiB without).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from runner.memory.graph import pad
from runner.memory.kv import CPU_ALIGNMENT
from runner.memory.projector import COMPUTE_META, HOST_FIXED, ProjectorMemory, weight_bytes
from runner.memory.weights import cuda_size


def window_compute_bytes(info: Any, flash_attn: bool) -> int:
    """The encoder's compute buffer for one window (AudioProjectorInfo `info`)."""
    frames, pos, mel, e, f = 3000, 1500, info.n_mel, info.width, info.n_ff
    conv1 = frames * mel * 4 + frames * mel * 3 * 2  # the input, and its im2col (F16)
    conv2 = frames * e * 4 + pos * e * 3 * 2  # the first convolution's output, and the second im2col
    scores = 0 if flash_attn else info.heads * pos * pos * 4
    block = scores + max(4 * pos * e * 4, pos * f * 4 + 2 * pos * e * 4)
    return pad(max(conv1, conv2, block), CPU_ALIGNMENT)


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


def estimate_omni_projector(header: Any, vision: ProjectorMemory, info: Any) -> ProjectorMemory:
    """A file with both encoders (qwen2.5o): libmtmd opens it twice, a clip context for each, and
    each reserves its own compute buffer; `vision` is the vision half's ProjectorMemory (every tensor
    counted once), to which the audio encoder's buffers and host memory are added, and the patch
    kernels the audio context loads too (clip.cpp load_tensors takes v.patch_embd.* whatever the
    modality)."""
    audio = estimate_audio_projector(header, info)
    twice = [t for t in header.tensors if t.name.startswith("v.patch_embd.")]
    return replace(
        vision,
        projector_type=info.projector_type,  # qwen2.5o, whose images cost what the vision half says
        weights_cpu=vision.weights_cpu + sum(pad(t.nbytes, CPU_ALIGNMENT) for t in twice),
        weights_gpu=vision.weights_gpu + sum(cuda_size(t) for t in twice),
        compute_cpu=vision.compute_cpu + audio.compute_cpu,
        compute_gpu=vision.compute_gpu + audio.compute_gpu,
        inputs_gpu_host=vision.inputs_gpu_host + audio.inputs_gpu_host,
        host_bytes=vision.host_bytes + audio.host_bytes,
    )
