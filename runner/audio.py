"""Audio in: the one place untrusted audio bytes become mono float samples, before anything reaches
libmtmd.

Every clip a prompt carries (a path, stdin, base64 in a request) comes through `load_audio`, which
takes its steps in this order, each cheaper than the next:

1. the size in bytes, against `max_bytes` (25 MB by default, OpenAI's limit), before anything is parsed;
2. the magic bytes: RIFF/WAVE, MP3 (an ID3 tag followed by an MPEG frame sync, or the sync itself),
   fLaC and Ogg Vorbis go on; Ogg Opus, AAC and M4A are named and refused, as are images, video, text
   and empty input;
3. the header: a WAV's chunks walked with the standard library; an MP3's, FLAC's or Ogg's read by
   miniaudio (runner.audio_codecs); the duration it declares, against `max_seconds` (10 minutes by
   default), before a sample is decoded; a clip shorter than its header says is truncated and
   refused, never padded;
4. the samples, mixed to mono: a WAV's with numpy, scaled to [-1, 1) as miniaudio does; the others
   decoded by miniaudio as llama-server's libmtmd helper decodes them; NaN or infinite samples
   refused. Resampling to the projector's rate (`Audio.at`: 16 kHz for the whisper family, libmtmd's
   mtmd_get_audio_sample_rate) is miniaudio's linear resampler, llama-server's, done when the
   projector is known.

libmtmd's own file loader is never handed these bytes (it guesses formats, and its video path may run
ffmpeg). Every refusal is an `AudioError`: one line naming where the clip came from. numpy and
miniaudio are imported inside the functions that decode, so nothing here loads unless audio is given.
"""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from runner.errors import AudioError
from runner.limits import read_at_most, size_text

MAX_AUDIO_BYTES = 25_000_000  # a clip's encoded size, as OpenAI's transcription API takes
MAX_AUDIO_SECONDS = 600.0  # a clip's duration, from its header
MIN_AUDIO_SECONDS = 0.01  # shorter is no clip (libmtmd asserts more than one sample)
MAX_CHANNELS = 8
ACCEPTED = "accepted: WAV, MP3, FLAC, Ogg Vorbis; convert others, e.g. ffmpeg -i IN -ar 16000 OUT.wav"
CONVERT = "runner does not decode: convert it, e.g. ffmpeg -i IN -ar 16000 -ac 1 OUT.wav"
COMPRESSED = ("MP3", "FLAC", "Ogg Vorbis")  # decoded by miniaudio (runner.audio_codecs)
AUDIO_SUFFIXES = frozenset({".wav", ".wave", ".mp3", ".flac", ".ogg", ".oga", ".opus", ".m4a"})

PCM, IEEE_FLOAT, EXTENSIBLE = 1, 3, 0xFFFE  # WAVE format tags


@dataclass(frozen=True)
class Audio:
    """A clip as the model takes it: `samples` are mono float32 (little-endian) at `rate` Hz."""

    samples: bytes = field(repr=False)
    rate: int
    sha256: str  # hex, of the bytes as given (the same file is the same clip, whatever its name)
    size: int  # bytes as given
    format: str  # "WAV", "MP3", "FLAC" or "Ogg Vorbis"
    name: str  # where it came from, for messages: a path, "-" for stdin, an API field
    channels: int = 1  # as given (the samples are mixed to mono)
    warnings: tuple[str, ...] = ()

    @property
    def frames(self) -> int:
        return len(self.samples) // 4

    @property
    def seconds(self) -> float:
        return self.frames / self.rate

    def at(self, rate: int) -> bytes:
        """The samples at `rate` Hz (the projector's): as they are, or through miniaudio's resampler,
        as llama-server's decoder resamples them."""
        if rate == self.rate:
            return self.samples
        from runner.audio_codecs import resample

        return resample(self.samples, self.rate, rate)


def refuse(name: str, problem: str) -> AudioError:
    """The one-line refusal for the clip `name`, `problem` saying what is wrong without naming it."""
    label = "stdin" if name == "-" else name if name.isprintable() else repr(name)
    return AudioError(f"{label}: {problem}", name=name, problem=problem)


def sniff(data: bytes, name: str) -> str:
    """The format of `data` by its magic bytes: "WAV", "MP3", "FLAC" or "Ogg Vorbis"; any other audio
    is named and refused, and anything else is said for what it looks like."""
    if data.startswith(b"RIFF") and data[8:12] == b"WAVE":
        return "WAV"
    if not data:
        raise refuse(name, f"is empty: no audio ({ACCEPTED})")
    if data.startswith(b"ID3"):
        return _after_id3(data, name)
    if _mpeg_sync(data):
        if data[1] & 0x06 == 0:  # layer bits 00: ADTS, AAC's stream, not MPEG audio
            raise refuse(name, f"looks like AAC audio (ADTS), which {CONVERT}")
        return "MP3"
    if data.startswith(b"fLaC"):
        return "FLAC"
    if data.startswith(b"OggS"):
        return _ogg(data, name)
    if data[4:8] == b"ftyp" and data[8:11] in (b"M4A", b"M4B"):
        raise refuse(name, f"looks like M4A (AAC) audio, which {CONVERT}")
    raise refuse(name, f"{_looks_like(data)}, not audio runner reads ({ACCEPTED})")


def _mpeg_sync(data: bytes) -> bool:
    return len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0


def _after_id3(data: bytes, name: str) -> str:
    """An ID3v2 tag leads MP3 files (and some FLAC ones): what follows it says which."""
    from runner.audio_codecs import id3_end

    rest = data[id3_end(data) :]
    if _mpeg_sync(rest) and rest[1] & 0x06:
        return "MP3"
    if rest.startswith(b"fLaC"):
        return "FLAC"
    if not rest:
        raise refuse(name, "is an ID3 tag with no audio after it (a truncated MP3 file)")
    raise refuse(name, f"is an ID3 tag followed by no MP3 frame ({ACCEPTED})")


def _ogg(data: bytes, name: str) -> str:
    """Ogg is a container: its first page names the codec."""
    first = data[:512]
    if b"\x01vorbis" in first:
        return "Ogg Vorbis"
    if b"OpusHead" in first:
        raise refuse(name, f"looks like Ogg Opus audio, which {CONVERT}")
    raise refuse(name, f"is an Ogg file whose stream is not Vorbis ({ACCEPTED})")


_MAGIC = (
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"BM", "a BMP image"),
    (b"%PDF", "a PDF document"),
    (b"\x1a\x45\xdf\xa3", "WebM or Matroska video"),
    (b"PK\x03\x04", "a ZIP archive"),
)


def _looks_like(data: bytes) -> str:
    if data.startswith(b"RIFF"):
        kind = {b"WEBP": "a WebP image", b"AVI ": "AVI video"}.get(data[8:12], "a RIFF file that is not WAVE")
        return f"looks like {kind}"
    if data[4:8] == b"ftyp":
        return "looks like MP4 video"
    for magic, kind in _MAGIC:
        if data.startswith(magic):
            return f"looks like {kind}"
    try:
        head = data[:512].decode("utf-8")
    except UnicodeDecodeError:
        return "is in a format runner does not recognise"
    return (
        "looks like text"
        if head.isprintable() or head.strip()
        else "is in a format runner does not recognise"
    )


@dataclass(frozen=True)
class WavHeader:
    """What a WAV's chunks say, read before any sample is."""

    tag: int  # PCM or IEEE_FLOAT (an extensible file's subformat)
    channels: int
    rate: int
    bits: int
    data_at: int  # the data chunk's first byte
    data_bytes: int  # whole frames of it, as its header says
    present: int  # the bytes there are from data_at: fewer than data_bytes is a truncated file

    @property
    def frame_bytes(self) -> int:
        return self.channels * self.bits // 8

    @property
    def seconds(self) -> float:
        return self.data_bytes // self.frame_bytes / self.rate


def read_wav_header(data: bytes, name: str) -> WavHeader:
    """The fmt and data chunks of a RIFF/WAVE file, checked: a format runner decodes, a sane rate and
    channel count; the data chunk's size as it says (one that says 0 or 0xFFFFFFFF, as a stream's
    writer leaves it, runs to the end of the bytes), whether or not that many bytes are there."""
    pos, fmt = 12, None
    while pos + 8 <= len(data):
        cid, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        body = pos + 8
        if cid == b"fmt ":
            fmt = _fmt(data[body : body + size], name)
        elif cid == b"data":
            if fmt is None:
                raise refuse(name, "is a WAV file whose data comes before its format (fmt) chunk")
            tag, channels, rate, bits = fmt
            rest = len(data) - body
            if size in (0, 0xFFFFFFFF):
                size = rest
            frame = channels * bits // 8
            return WavHeader(tag, channels, rate, bits, body, size - size % frame, rest)
        pos = body + size + (size & 1)  # chunks are padded to an even size
    if fmt is None:
        raise refuse(name, "is a truncated WAV file: it has no format (fmt) chunk")
    raise refuse(name, "is a truncated WAV file: it has no data chunk")


def _fmt(chunk: bytes, name: str) -> tuple[int, int, int, int]:
    if len(chunk) < 16:
        raise refuse(name, "is a truncated WAV file: its format (fmt) chunk is cut short")
    tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", chunk)
    if tag == EXTENSIBLE and len(chunk) >= 26:
        tag = struct.unpack_from("<H", chunk, 24)[0]  # the subformat GUID's first two bytes
    supported = {PCM: (8, 16, 24, 32), IEEE_FLOAT: (32, 64)}
    if tag not in supported:
        raise refuse(name, f"is a WAV file in format {tag:#06x}, not PCM or float ({ACCEPTED})")
    if bits not in supported[tag]:
        kind = "PCM" if tag == PCM else "float"
        raise refuse(name, f"is {bits}-bit {kind} WAV, which runner does not decode ({ACCEPTED})")
    if not 1 <= channels <= MAX_CHANNELS:
        raise refuse(name, f"is a WAV file of {channels} channels (1 to {MAX_CHANNELS} are taken)")
    if not 1000 <= rate <= 384_000:
        raise refuse(name, f"is a WAV file at {rate} Hz (1,000 to 384,000 are taken)")
    return tag, channels, rate, bits


def load_audio(
    data: bytes,
    *,
    name: str,
    max_bytes: int = MAX_AUDIO_BYTES,
    max_seconds: float = MAX_AUDIO_SECONDS,
) -> Audio:
    """Untrusted bytes -> a mono Audio clip, or an AudioError saying in one line why not."""
    if len(data) > max_bytes:
        too_big = f"the clip is {size_text(len(data))}, over the {size_text(max_bytes)} a clip may be"
        raise refuse(name, too_big)
    fmt = sniff(data, name)
    if fmt in COMPRESSED:
        return _load_compressed(data, fmt, name, max_seconds)
    header = read_wav_header(data, name)
    seconds = header.seconds
    if seconds > max_seconds:
        raise refuse(name, f"is {_duration(seconds)} long, over the {_duration(max_seconds)} a clip may be")
    if header.data_bytes > header.present:
        said, there = header.data_bytes, header.present
        raise refuse(
            name, f"is a truncated WAV file: its data chunk says {said:,} bytes, {there:,} are there"
        )
    if seconds < MIN_AUDIO_SECONDS:
        raise refuse(name, "holds no audio (a clip of less than 10 ms)")
    samples = _decode(data[header.data_at : header.data_at + header.data_bytes], header, name)
    return Audio(
        samples=samples,
        rate=header.rate,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        format=fmt,
        name=name,
        channels=header.channels,
    )


def _load_compressed(data: bytes, fmt: str, name: str, max_seconds: float) -> Audio:
    """An MP3, FLAC or Ogg Vorbis clip: its header's length bounded, then its frames decoded by
    miniaudio at its own rate, mixed to mono (an Ogg in a child process: runner.audio_codecs.APART);
    fewer frames than the header says, an MP3 whose last frame is cut or an Ogg whose last page is,
    is a truncated file."""
    from runner import audio_codecs as codecs

    if fmt == "Ogg Vorbis" and codecs.ogg_cut(data):
        raise refuse(name, "is a truncated Ogg file: its last page is cut short or missing")
    samples = None
    try:
        if fmt in codecs.APART:
            head, samples = codecs.read_apart(data, fmt, max_seconds)
        else:
            head = codecs.header(data, fmt)
    except ValueError as exc:
        raise refuse(name, str(exc)) from None
    if not 1 <= head.channels <= MAX_CHANNELS:
        raise refuse(name, f"is {fmt} of {head.channels} channels (1 to {MAX_CHANNELS} are taken)")
    if not 1000 <= head.rate <= 384_000:
        raise refuse(name, f"is {fmt} at {head.rate} Hz (1,000 to 384,000 are taken)")
    seconds = head.frames / head.rate
    if seconds > max_seconds:
        raise refuse(name, f"is {_duration(seconds)} long, over the {_duration(max_seconds)} a clip may be")
    if seconds < MIN_AUDIO_SECONDS:
        raise refuse(name, f"holds no audio (a {fmt} file of less than 10 ms, or one that gives no length)")
    if fmt == "MP3" and codecs.mp3_cut(data, codecs.id3_end(data), head.frames // 384 + 2):
        raise refuse(name, "is a truncated MP3 file: its last frame is cut short")
    rate, frames = codecs.decode_at(head)
    try:
        if samples is None:
            slack = codecs.MP3_SLACK if fmt == "MP3" else 2 if rate != head.rate else 0  # resampled: +1
            samples = codecs.decode(data, fmt, rate, frames, pad=slack)
    except ValueError as exc:
        raise refuse(name, str(exc)) from None
    if len(samples) != frames * 4:  # the child judged its length otherwise (a bound at a float's edge)
        raise refuse(name, f"is {fmt} whose decoder gave {len(samples) // 4:,} of its {frames:,} frames")
    _check_finite(samples, name)
    return Audio(
        samples=samples,
        rate=rate,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        format=fmt,
        name=name,
        channels=head.channels,
    )


def _check_finite(samples: bytes, name: str) -> None:
    import numpy as np

    if not np.isfinite(np.frombuffer(samples, dtype="<f4")).all():
        raise refuse(name, "holds samples that are not finite numbers (NaN or infinity)")


def _decode(raw: bytes, h: WavHeader, name: str) -> bytes:
    """The data chunk's frames as mono float32, scaled as miniaudio scales them (ma_pcm_*_to_f32)."""
    import numpy as np

    x: Any
    if h.tag == IEEE_FLOAT:
        x = np.frombuffer(raw, dtype="<f4" if h.bits == 32 else "<f8").astype(np.float32)
        if not np.isfinite(x).all():
            raise refuse(name, "holds samples that are not finite numbers (NaN or infinity)")
    elif h.bits == 8:
        x = np.frombuffer(raw, dtype=np.uint8).astype(np.float32) * np.float32(1 / 127.5) - np.float32(1)
    elif h.bits == 16:
        x = np.frombuffer(raw, dtype="<i2").astype(np.float32) * np.float32(1 / 32768)
    elif h.bits == 24:
        b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        x = ((b[:, 0] << 8 | b[:, 1] << 16 | b[:, 2] << 24) >> 8).astype(np.float32) * np.float32(1 / 8388608)
    else:
        x = (np.frombuffer(raw, dtype="<i4").astype(np.float64) / 2147483648.0).astype(np.float32)
    if h.channels > 1:
        x = x.reshape(-1, h.channels).mean(axis=1, dtype=np.float32)
    return x.astype("<f4").tobytes()


def _duration(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.1f} minutes"
    return f"{seconds:.1f} s"


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")


def read_audio_arg(
    arg: str,
    stdin: BinaryIO | None,
    *,
    max_bytes: int = MAX_AUDIO_BYTES,
    max_seconds: float = MAX_AUDIO_SECONDS,
) -> Audio:
    """A clip as the command line names it: `-` for stdin, anything else a local file."""
    if arg == "-":
        if stdin is None:
            raise refuse("-", "stdin is a terminal here: pipe the audio in")
        data = _read_bounded(stdin, max_bytes, "-")
        return load_audio(data, name="-", max_bytes=max_bytes, max_seconds=max_seconds)
    try:
        with Path(arg).open("rb") as f:
            data = _read_bounded(f, max_bytes, arg)
    except FileNotFoundError:
        scheme = _SCHEME.match(arg)
        if scheme is not None and len(scheme.group(1)) > 1:  # not a Windows drive letter
            raise refuse(
                arg, "no such file (and URLs are not fetched): a local file, or - for stdin"
            ) from None
        raise refuse(arg, "no such file") from None
    except IsADirectoryError:
        raise refuse(arg, "is a directory, not an audio file") from None
    except OSError as exc:
        raise refuse(arg, f"cannot be read: {exc.strerror or exc}") from None
    return load_audio(data, name=arg, max_bytes=max_bytes, max_seconds=max_seconds)


def _read_bounded(f: BinaryIO, max_bytes: int, name: str) -> bytes:
    data = read_at_most(f, max_bytes)
    if data is None:
        raise refuse(name, f"more than the {size_text(max_bytes)} a clip may be")
    return data
