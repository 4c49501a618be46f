"""Audio in a request: an OpenAI `input_audio` part (base64 `data` and its `format`) as an `AudioRef`,
an ImageRef's kind, so a message's parts keep their order and count against --max-images as images
do, and each clip is decoded off the event loop (shared.images.with_pixels) by runner.audio: WAV, MP3,
FLAC or Ogg Vorbis by its magic bytes (`format` is OpenAI's hint, not trusted), 25 MB and 10 minutes at
most, every refusal a 400 naming the field.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from runner.audio import MAX_AUDIO_BYTES, load_audio
from runner.errors import AudioError
from runner.serve.shared.http import ApiError
from runner.serve.shared.images import ImageRef

FORMATS = (
    "wav",
    "mp3",
    "flac",
    "ogg",
)  # OpenAI's input_audio formats (wav, mp3), and what else runner decodes


@dataclass(frozen=True)
class AudioRef(ImageRef):
    """A clip a request carries, not yet decoded: its field, its base64 data and the format given."""

    format: str = "wav"

    def decoded(self, max_bytes: int) -> Any:
        """The clip, as runner.audio reads it (in a worker thread); a 400 naming the field if not.
        Its bound is runner.audio's own (25 MB), not --max-image-bytes."""
        return clip_of(self.data, self.field, MAX_AUDIO_BYTES)


def clip_of(data: str | bytes, field: str, max_bytes: int = MAX_AUDIO_BYTES) -> Any:
    """Base64 text (or raw bytes: a multipart file) -> runner.audio.Audio, or a 400 naming `field`."""
    try:
        if isinstance(data, str):
            if len(data) > (max_bytes + 2) // 3 * 4 + 4:
                raise ApiError(
                    400, f"{field}: the clip is over the {max_bytes:,} bytes a clip may be", param=field
                )
            data = base64.b64decode(data, validate=True)
        return load_audio(data, name=field, max_bytes=max_bytes)
    except binascii.Error:
        raise ApiError(
            400, f"{field}: not base64 (input_audio.data is the clip's bytes in base64)", param=field
        ) from None
    except AudioError as exc:
        raise ApiError(400, str(exc), param=field) from None


def media_ref(field: str, data: str) -> ImageRef:
    """Ollama's `images` entry: a WAV clip (its base64 starts with RIFF....WAVE) as Ollama takes one
    for its audio models, else an image."""
    try:
        head = base64.b64decode(data[:16], validate=True)
    except (binascii.Error, ValueError):
        return ImageRef(field, data)
    return AudioRef(field, data) if head[:4] == b"RIFF" and head[8:12] == b"WAVE" else ImageRef(field, data)


def input_audio(part: dict[str, Any], index: int) -> AudioRef:
    """{"type": "input_audio", "input_audio": {"data": BASE64, "format": "wav"}}: read when decoded."""
    spec = part.get("input_audio")
    data = spec.get("data") if isinstance(spec, dict) else None
    fmt = spec.get("format", "wav") if isinstance(spec, dict) else None
    if not isinstance(data, str) or not isinstance(fmt, str):
        raise ValueError(f'[{index}].input_audio must be {{"data": BASE64, "format": "wav"}}')
    if fmt not in FORMATS:
        raise ValueError(
            f"[{index}].input_audio.format must be one of {', '.join(FORMATS)} (got {fmt[:20]!r})"
        )
    return AudioRef(f"content[{index}].input_audio.data", data, fmt)
