"""Images in a prompt: a vision projector (an mmproj GGUF, through libmtmd) beside the model.

A prompt with images is text with a media marker where each image goes. libmtmd's tokenizer
(mtmd_tokenize) splits it into text chunks (tokens) and image chunks (an image's embeddings to come,
n_tokens positions). runner keeps such a prompt as one list of tokens, as every other prompt: an image's
positions hold pseudo-tokens (negative, never a vocabulary id) derived from the image's sha256, so
prefix reuse compares images by their hash as it compares tokens (llama-server compares them by id the
same way), and a sequence whose cells hold the same image keeps it. A kept head never ends inside an
image (runner.engine.context.outside_image). The loop evaluates such a prompt alone, in the model's
thread (libmtmd's encode and decode calls are not thread-safe): text chunks as usual, each image
chunk encoded by the projector and its embeddings decoded for that sequence only (llama.cpp refuses a
batch that mixes tokens and embeddings; mtmd_helper_eval_chunk_single also switches a non-causal
model's attention for the image); the answer's tokens then join the shared batch.

The pixels come decoded and bounded (runner.images: Pillow, never libmtmd's own loader, which tries
audio, stb_image, then ffmpeg on whatever bytes it gets); the projector file is checked before libmtmd
opens it (runner.gguf.projector: libmtmd aborts the process on a malformed one). The marker is random
per process, so no text a user sends can move an image. On M-RoPE models (Qwen2-VL, Qwen2.5-VL) an
image takes fewer positions than cells: runner.engine.positions keeps the two apart. Importing
llama_cpp.mtmd_cpp loads libmtmd: it happens only when a projector is attached.

Audio clips (runner.audio: mono samples, resampled here to mtmd_get_audio_sample_rate) take the same
path: a marker each, mtmd_bitmap_init_from_audio, and libmtmd's 30-second windows are media chunks as
an image's are, each hashed apart (the clip's sha256, then a hash of it and the window's index).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner import interrupt, ui
from runner.audio import Audio
from runner.engine.llamacpp import LLAMA_LOG, default_threads
from runner.engine.positions import IMAGE_SLOT, image_tokens
from runner.errors import EngineError, UsageError
from runner.images import Image

CHUNK_TEXT, CHUNK_IMAGE, CHUNK_AUDIO = 0, 1, 2  # enum mtmd_input_chunk_type
ENCODE_WAIT = "stopping after the image's encode, which llama.cpp cannot stop part-way…"
_ROUTED: list[bool] = []  # libmtmd's log set to runner's (once a process)


def mtmd() -> Any:
    """llama-cpp-python's libmtmd bindings, loaded on first use, its log routed as llama.cpp's is."""
    import llama_cpp.mtmd_cpp as lib

    if LLAMA_LOG.callback is not None and not _ROUTED:
        lib.mtmd_log_set(LLAMA_LOG.callback, ctypes.c_void_p(0))
        lib.mtmd_helper_log_set(LLAMA_LOG.callback, ctypes.c_void_p(0))
        _ROUTED.append(True)
    return lib


@dataclass
class ImageSpan:
    """One image in a prompt: where its positions start, how many, and libmtmd's chunk to evaluate."""

    start: int
    n_tokens: int  # its cells
    n_pos: int  # its positions: as many, but for an M-RoPE model's (max(nx, ny), runner.engine.positions)
    chunk: Any  # an mtmd_input_chunk* copy this prompt owns until it is evaluated
    sha256: str


@dataclass
class MediaPrompt:
    """A prompt's tokens, images as pseudo-tokens, and the image chunks to evaluate in their place."""

    tokens: list[int]
    spans: list[ImageSpan] = field(default_factory=list)
    images: int = 0
    vision: Any = None  # the Vision that tokenized it, which evaluates its spans

    def evaluate(self, lctx: Any, span: ImageSpan, n_past: int, seq: int, n_batch: int) -> bool:
        return bool(self.vision.evaluate(lctx, span, n_past, seq, n_batch))

    def close(self) -> None:
        """The chunks freed (once evaluated, or when the answer never started)."""
        lib = mtmd() if self.spans and any(s.chunk for s in self.spans) else None
        for span in self.spans:
            if span.chunk and lib is not None:
                lib.mtmd_input_chunk_free(span.chunk)
            span.chunk = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the bindings may be gone
            self.close()


class Vision:
    """An mtmd context: a projector loaded for one model."""

    def __init__(
        self,
        projector: Path,
        model: Any,
        *,
        use_gpu: bool,
        n_threads: int | None = None,
        flash_attn: bool | None = None,
    ) -> None:
        lib = mtmd()
        params = lib.mtmd_context_params_default()
        params.use_gpu = use_gpu  # its default is on: a CPU-only plan keeps it off the GPU
        # the encoder's attention as the model's (llama_flash_attn_type: -1 auto, 0 off, 1 on), as
        # llama-server passes -fa to both: the two kernels give answers apart by float rounding
        params.flash_attn_type = -1 if flash_attn is None else int(flash_attn)
        params.print_timings = False
        params.warmup = False
        params.n_threads = n_threads or default_threads()
        self.marker = f"<__media_{secrets.token_hex(16)}__>"
        self._marker = self.marker.encode()
        params.media_marker = self._marker  # kept alive by self: libmtmd copies it at init
        self.projector = projector
        with LLAMA_LOG.muted():
            self._ctx = lib.mtmd_init_from_file(str(projector).encode(), model, params)
        if not self._ctx:
            raise EngineError(f"libmtmd could not load the projector {projector}: {LLAMA_LOG.last_error()}")
        self.sees = bool(lib.mtmd_support_vision(self._ctx))
        self.hears = bool(lib.mtmd_support_audio(self._ctx))  # an audio encoder (runner.audio's clips)
        if not self.sees and not self.hears:
            self.close()
            raise UsageError(f"{projector} is not a vision or audio projector (it takes no images nor audio)")
        self.audio_rate = int(lib.mtmd_get_audio_sample_rate(self._ctx)) if self.hears else 0
        self.mrope = bool(lib.mtmd_decode_use_mrope(self._ctx))  # Qwen2-VL's: positions apart from cells

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            mtmd().mtmd_free(self._ctx)
            self._ctx = None

    def tokenize(self, text: str, images: Sequence[Image | Audio]) -> MediaPrompt:
        """The rendered prompt (a marker where each image or audio clip goes) as tokens and media
        spans, BOS added as the vocabulary says and special tokens parsed, as llama-server tokenizes it."""
        found = text.count(self.marker)
        if found != len(images):
            raise EngineError(f"the prompt holds {found} image markers for {len(images)} images")
        lib = mtmd()
        bitmaps = (lib.mtmd_bitmap_p_ctypes * max(1, len(images)))()
        keep: list[Any] = []
        try:
            for i, image in enumerate(images):
                bitmaps[i] = self._bitmap(lib, image, keep)
                lib.mtmd_bitmap_set_id(bitmaps[i], image.sha256.encode())
            encoded = text.encode()
            given = lib.mtmd_input_text(encoded, len(encoded), True, True)  # text_len: 0 gives no chunks
            chunks = lib.mtmd_input_chunks_init()
            try:
                rc = lib.mtmd_tokenize(self._ctx, chunks, ctypes.byref(given), bitmaps, len(images))
                if rc != 0:
                    raise EngineError(f"libmtmd could not tokenize the prompt (error {rc})")
                return self._prompt(lib, chunks)
            finally:
                lib.mtmd_input_chunks_free(chunks)
        finally:
            for i in range(len(images)):
                if bitmaps[i]:
                    lib.mtmd_bitmap_free(bitmaps[i])

    def _bitmap(self, lib: Any, item: Image | Audio, keep: list[Any]) -> Any:
        """libmtmd's bitmap of an image (RGB bytes) or an audio clip (mono float samples at the
        projector's rate), its data kept alive in `keep` until the prompt is tokenized."""
        if isinstance(item, Audio):
            if not self.hears:
                raise UsageError(f"{self.projector} takes no audio (it has no audio encoder)")
            samples = item.at(self.audio_rate)
            data = (ctypes.c_float * (len(samples) // 4)).from_buffer_copy(samples)
            keep.append(data)
            bitmap = lib.mtmd_bitmap_init_from_audio(len(data), data)
            if not bitmap:
                raise EngineError(f"libmtmd refused a clip of {len(data)} samples")
            return bitmap
        if not self.sees:
            raise UsageError(f"{self.projector} takes no images (it has no vision encoder)")
        pixels = (ctypes.c_uint8 * len(item.rgb)).from_buffer_copy(item.rgb)
        keep.append(pixels)
        bitmap = lib.mtmd_bitmap_init(item.width, item.height, pixels)
        if not bitmap:
            raise EngineError(f"libmtmd refused a {item.width}x{item.height} image")
        return bitmap

    def _prompt(self, lib: Any, chunks: Any) -> MediaPrompt:
        prompt = MediaPrompt([], vision=self)
        windows: dict[str, int] = {}  # an audio clip's windows so far
        for i in range(lib.mtmd_input_chunks_size(chunks)):
            chunk = lib.mtmd_input_chunks_get(chunks, i)
            kind = lib.mtmd_input_chunk_get_type(chunk)
            if kind == CHUNK_TEXT:
                n = ctypes.c_size_t(0)
                found = lib.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens = [found[j] for j in range(n.value)]
                if any(t < 0 for t in tokens):  # LLAMA_TOKEN_NULL: a marker lookup_token did not find
                    prompt.close()
                    raise UsageError(
                        f"{self.projector} marks images with tokens the model's vocabulary lacks "
                        "(SmolVLM's <fake_token_around_image>, say): is it this model's projector?"
                    )
                prompt.tokens.extend(tokens)
                continue
            if kind not in (CHUNK_IMAGE, CHUNK_AUDIO):
                prompt.close()
                raise EngineError("libmtmd gave a chunk that is neither text, an image nor audio")
            n_tokens = int(lib.mtmd_input_chunk_get_n_tokens(chunk))
            n_pos = int(lib.mtmd_input_chunk_get_n_pos(chunk))
            sha = (lib.mtmd_input_chunk_get_id(chunk) or b"").decode()
            if kind == CHUNK_AUDIO:  # a clip's 30-second windows share its id: each gets its own hash
                windows[sha] = windows.get(sha, -1) + 1
                sha = (
                    sha if not windows[sha] else hashlib.sha256(f"{sha}#{windows[sha]}".encode()).hexdigest()
                )
            if not 0 < n_tokens < IMAGE_SLOT or not 0 < n_pos <= n_tokens:
                prompt.close()
                raise EngineError(f"an image of {n_tokens} tokens over {n_pos} positions")
            span = ImageSpan(len(prompt.tokens), n_tokens, n_pos, lib.mtmd_input_chunk_copy(chunk), sha)
            prompt.spans.append(span)
            prompt.tokens.extend(image_tokens(sha, n_tokens))
            prompt.images += 1
        return prompt

    def evaluate(self, lctx: Any, span: ImageSpan, n_past: int, seq: int, n_batch: int) -> bool:
        """The image encoded by the projector and its embeddings decoded into sequence `seq` at
        positions from n_past (logits for none: text always follows). False if a decode failed or was
        aborted (Ctrl-C: the encode itself cannot be stopped, the decode after it can; the wait is
        said at once, runner.interrupt.waiting)."""
        lib = mtmd()
        new_past = ctypes.c_int32(0)
        rc = interrupt.waiting(  # a Ctrl-C meanwhile: said at once, and the decode after the encode stops
            lambda: lib.mtmd_helper_eval_chunk_single(
                self._ctx, lctx, span.chunk, n_past, seq, n_batch, False, ctypes.byref(new_past)
            ),
            lambda: ui.info(ENCODE_WAIT),
        )
        if rc == 0 and new_past.value != n_past + span.n_pos:
            raise EngineError(f"an image took {new_past.value - n_past} positions, not {span.n_pos}")
        return rc == 0
