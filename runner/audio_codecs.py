"""MP3, FLAC and Ogg Vorbis to mono float samples, and the one resampler, through miniaudio
(pyminiaudio): the library libmtmd's own helper decodes `input_audio` with in llama-server
(tools/mtmd/mtmd-helper.cpp), the same release (0.11.25), called the same way, so a clip reaches
libmtmd as llama-server's does.

llama-server's recipe, which `decode` follows: a decoder over the bytes in memory asked for 32-bit
float, one channel (miniaudio averages the channels) and the projector's rate (its linear resampler);
the length in frames from the format's header, scaled to that rate; that many frames read. Runner
adds what llama-server leaves out: the format is forced to the one the magic bytes named (no guess),
the header's length is bounded before a frame is decoded (`header`), and a clip with fewer frames
than its header says, or an MP3 whose last frame is cut, is refused rather than padded with silence.

Nothing here raises runner's errors: a ValueError says what is wrong, and runner.audio turns it into
the clip's one-line refusal. miniaudio is imported inside the functions, so this module loads nothing
until a clip needs it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

FORMATS = ("MP3", "FLAC", "Ogg Vorbis")  # what miniaudio decodes besides WAV
# stb_vorbis, miniaudio's Vorbis decoder, aborts or segfaults on some malformed streams (fuzzing
# found both within a few hundred mutated files; dr_mp3 and dr_flac none in thousands): an Ogg clip
# is read in a child process, so a bad one costs that process, not runner's or the server's
APART = frozenset({"Ogg Vorbis"})


@dataclass(frozen=True)
class Header:
    """What a compressed clip says of itself before any frame is decoded."""

    channels: int
    rate: int
    frames: int  # its length at `rate`: MP3: its Xing/Info count, else its frames counted (headers
    # only, no synthesis); FLAC: STREAMINFO's total; Vorbis: the last page's granule position


def header(data: bytes, fmt: str) -> Header:
    """The channels, rate and length in frames `data` declares (miniaudio's own readers)."""
    import miniaudio

    read = {
        "MP3": miniaudio.mp3_get_info,
        "FLAC": miniaudio.flac_get_info,
        "Ogg Vorbis": miniaudio.vorbis_get_info,
        "WAV": miniaudio.wav_get_info,  # runner reads a WAV's header itself (runner.audio); for tests
    }
    try:
        info = read[fmt](data)
    except (miniaudio.DecodeError, ArithmeticError, ValueError):  # dr_flac takes a rate of 0, then / 0
        raise ValueError(f"is not {fmt} runner can decode (its header does not read)") from None
    frames = int(info.num_frames)
    if fmt == "MP3" and frames >= 2**40:
        frames = 0  # dr_mp3 says "unknown" as all ones
    return Header(int(info.nchannels), int(info.sample_rate), frames)


def read_apart(data: bytes, fmt: str, max_seconds: float) -> tuple[Header, bytes]:
    """`header` and, when the header is one runner takes, `decode` at the clip's own rate, in a
    child process (`python -m runner.audio_codecs`); b"" for the samples when the header is not
    taken (the caller refuses it by the header). A child that crashes is a ValueError."""
    import json
    import subprocess
    import sys

    try:
        done = subprocess.run(  # not -m, which puts the working directory first on the child's path
            [sys.executable, "-c", CHILD, fmt, repr(max_seconds)],
            input=data,
            capture_output=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        raise ValueError(f"is {fmt} that takes too long to decode") from None
    said, _, samples = done.stdout.partition(b"\n")
    if done.returncode != 0 or not said:
        raise ValueError(f"is {fmt} whose decoder fails on it (a malformed stream)")
    reply = json.loads(said)
    if "error" in reply:
        raise ValueError(reply["error"])
    return Header(*reply["header"]), samples


CHILD = (  # the working directory off the path first: a json.py there is not imported
    "import sys; del sys.path[0]; from runner.audio_codecs import _child; "
    "_child(sys.argv[1], float(sys.argv[2]))"
)
DECODE_MOST_HZ = 48_000  # compressed clips above it decode at it: 10 minutes stay ~115 MB of float32


def decode_at(head: Header) -> tuple[int, int]:
    """(rate, frames) a clip is decoded at: its own, or at most DECODE_MOST_HZ (a 384 kHz FLAC of
    silence is a few kB and would be 0.9 GB of samples at its own rate)."""
    if head.rate <= DECODE_MOST_HZ:
        return head.rate, head.frames
    return DECODE_MOST_HZ, frames_at(DECODE_MOST_HZ, head.rate, head.frames)


def _child(fmt: str, max_seconds: float) -> None:
    """`read_apart`'s other side: the clip on stdin; one JSON line, then the samples, on stdout."""
    import json
    import sys

    data = sys.stdin.buffer.read()
    out = sys.stdout.buffer
    try:
        head = header(data, fmt)
        taken = 1 <= head.channels <= 8 and 1000 <= head.rate <= 384_000
        samples = b""
        if taken and 0 < head.frames <= max_seconds * head.rate:
            rate, frames = decode_at(head)
            samples = decode(data, fmt, rate, frames, pad=2 if rate != head.rate else 0)
    except ValueError as exc:
        out.write(json.dumps({"error": str(exc)}).encode() + b"\n")
        return
    out.write(json.dumps({"header": [head.channels, head.rate, head.frames]}).encode() + b"\n" + samples)


ENCODINGS = {"WAV": "ma_encoding_format_wav", "MP3": "ma_encoding_format_mp3",
             "FLAC": "ma_encoding_format_flac", "Ogg Vorbis": "ma_encoding_format_vorbis"}  # fmt: skip


def decode(data: bytes, fmt: str, rate: int, frames: int, *, pad: int = 0) -> bytes:
    """`frames` frames of `data` as mono little-endian float32 at `rate` Hz, as llama-server reads
    them. Up to `pad` frames fewer there than asked are zeros, as llama-server's buffer is (a resampled
    length can count a frame more than the resampler gives; an MP3 counted frame by frame counts the
    encoder's delay and padding its LAME tag takes off); more is a ValueError: a truncated clip."""
    from miniaudio import ffi, lib

    config = lib.ma_decoder_config_init(lib.ma_format_f32, 1, rate)
    config.encodingFormat = getattr(lib, ENCODINGS[fmt])
    decoder = ffi.new("ma_decoder *")
    source = ffi.from_buffer(data)  # kept alive while the decoder reads it
    if lib.ma_decoder_init_memory(source, len(data), ffi.addressof(config), decoder) != lib.MA_SUCCESS:
        raise ValueError(f"is not {fmt} runner can decode")
    try:
        out = ffi.new("float[]", max(frames, 1))
        got = ffi.new("ma_uint64 *")
        result = lib.ma_decoder_read_pcm_frames(decoder, out, frames, got)
        if result not in (lib.MA_SUCCESS, lib.MA_AT_END) or got[0] + pad < frames:
            raise ValueError(
                f"is a truncated {fmt} file: its header says {frames:,} frames, {got[0]:,} are there"
            )
        return bytes(ffi.buffer(out, frames * 4))
    finally:
        lib.ma_decoder_uninit(decoder)


def frames_at(rate_out: int, rate_in: int, frames: int) -> int:
    """A length in frames at `rate_in` as miniaudio counts it at `rate_out`
    (ma_calculate_frame_count_after_resampling, what ma_decoder_get_length_in_pcm_frames says)."""
    from miniaudio import lib

    return int(lib.ma_calculate_frame_count_after_resampling(rate_out, rate_in, frames))


def resample(samples: bytes, rate_in: int, rate_out: int) -> bytes:
    """Mono float32 samples at `rate_in` -> at `rate_out`, through the decoder llama-server's clips
    take (miniaudio's linear resampler, its low-pass filter included), fed as a float WAV: a clip
    mixed to mono first gives the same samples as a decoder doing both in one pass."""
    n = len(samples) // 4
    fmt = struct.pack("<HHIIHH", 3, 1, rate_in, rate_in * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", n * 4)
    wav = b"RIFF" + struct.pack("<I", len(body) + n * 4) + body + samples[: n * 4]
    return decode(wav, "WAV", rate_out, frames_at(rate_out, rate_in, n), pad=2)


# -- MP3 frames walked: where the stream ends, so a cut last frame is seen ---------------------------

_KBPS: dict[tuple[bool, int], tuple[int, ...]] = {
    (True, 3): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),  # MPEG-1 layer I
    (True, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 1): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 3): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),  # MPEG-2/2.5
    (False, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 1): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def mpeg_frame_bytes(head: bytes) -> int:
    """The length of the MPEG audio frame whose 4-byte header is `head`; 0 if it is none (or free
    format, whose length no header says)."""
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return 0
    version, layer = head[1] >> 3 & 3, head[1] >> 1 & 3
    rate_index, kbps_index, pad = head[2] >> 2 & 3, head[2] >> 4, head[2] >> 1 & 1
    if version == 1 or layer == 0 or rate_index == 3 or kbps_index in (0, 15):
        return 0
    mpeg1 = version == 3
    bits = _KBPS[(mpeg1, layer)][kbps_index] * 1000
    rate = _RATES[version][rate_index]
    if layer == 3:
        return (12 * bits // rate + pad) * 4
    return (144 if mpeg1 or layer == 2 else 72) * bits // rate + pad


MP3_SLACK = 8192  # frames: a LAME tag's delay and padding (12 bits each) at most


def ogg_cut(data: bytes) -> bool:
    """Whether an Ogg stream stops short of its last page: the final page is cut, or is not marked
    the end of the stream (a cut on a page boundary)."""
    at = data.rfind(b"OggS")
    if at < 0 or len(data) < at + 27:
        return True
    segments = data[at + 26]
    size = 27 + segments + sum(data[at + 27 : at + 27 + segments])
    return at + size > len(data) or not data[at + 5] & 0x04


def id3_end(data: bytes) -> int:
    """Where the ID3v2 tags at the start of `data` end (0 if there are none)."""
    at = 0
    while data[at : at + 3] == b"ID3" and len(data) >= at + 10:
        size = data[at + 6] << 21 | data[at + 7] << 14 | data[at + 8] << 7 | data[at + 9]
        at += 10 + size + (10 if data[at + 5] & 0x10 else 0)
    return at


def mp3_cut(data: bytes, start: int, max_frames: int) -> bool:
    """Whether the MPEG frames from `start` run past the end of `data` (a file cut mid-frame). The
    walk stops, judging nothing, at what is not a frame (a trailing tag) or after `max_frames`."""
    at, n = start, len(data)
    for _ in range(max_frames):
        if n - at < 4:
            return n - at > 0 and data[at] == 0xFF
        size = mpeg_frame_bytes(data[at : at + 4])
        if size == 0:
            return False
        if at + size > n:
            return True
        at += size
    return False


if __name__ == "__main__":
    import sys

    _child(sys.argv[1], float(sys.argv[2]))
