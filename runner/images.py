"""Images in: the one place untrusted image bytes become RGB pixels, before anything reaches libmtmd.

Every image a prompt carries (a path, stdin, a data URL, base64 in a request) comes through
`load_image`, which takes its steps in this order, each cheaper than the next:

1. the size in bytes, against `max_bytes`, before anything is parsed;
2. the magic bytes: PNG, JPEG, WebP, GIF or BMP go on; audio, video, PDF, text, empty input and
   other images are refused with what they look like;
3. the width and height from the format's own header, against `MAX_SIDE` and `MAX_PIXELS` (a
   decompression bomb is refused before Pillow sees it), then again as Pillow reads them;
4. Pillow, restricted to the format sniffed: the first frame, its EXIF orientation, composited on
   white and converted to 8-bit RGB. A truncated or corrupt file is refused, never padded.

Every refusal is an `ImageError`: one line naming where the image came from. Pillow is imported
inside the functions that decode, so `runner --help` and text-only commands never load it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import struct
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from runner.errors import ImageError
from runner.limits import read_at_most, size_text

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

MAX_SIDE = 8192  # pixels on either side
MAX_PIXELS = 32_000_000  # width * height: above it, a decompression bomb
MAX_IMAGE_BYTES = 20_000_000  # an image's encoded size (a file, stdin, a data URL decoded)
MAX_IMAGES = 8  # images in one request or one prompt

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")  # Pillow's names; APNG is PNG, animated WebP is WEBP
ACCEPTED = "accepted: PNG, JPEG, WebP, GIF, BMP"
_PRETTY = {"PNG": "PNG", "JPEG": "JPEG", "WEBP": "WebP", "GIF": "GIF", "BMP": "BMP"}
_BMP_HEADERS = (12, 40, 52, 56, 64, 108, 124)  # the DIB header sizes Pillow reads


@dataclass(frozen=True)
class Image:
    """An image as the model takes it: `rgb` is width * height * 3 bytes, row by row."""

    rgb: bytes = field(repr=False)
    width: int
    height: int
    sha256: str  # hex, of the bytes as given (the same file is the same image, whatever its name)
    size: int  # bytes as given
    format: str  # one of FORMATS
    name: str  # where it came from, for messages: a path, "-" for stdin, an API field
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImageRef:
    """What a kept conversation holds of an image a message carried: never its bytes, only what finds
    the file again (its absolute path) and tells whether it is still the same image."""

    sha256: str
    size: int  # bytes
    path: str

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size, "path": self.path}

    @classmethod
    def from_json(cls, data: Any) -> ImageRef | None:
        """One as a stored row or a conversation file holds it; None where it is not one."""
        if not isinstance(data, dict):
            return None
        sha, size, path = data.get("sha256"), data.get("size"), data.get("path")
        if not isinstance(sha, str) or re.fullmatch(r"[0-9a-f]{64}", sha) is None:
            return None
        if not isinstance(path, str) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return None
        return cls(sha, size, path)


def refuse(name: str, problem: str) -> ImageError:
    """The one-line refusal for the image `name`, `problem` saying what is wrong without naming it."""
    return ImageError(f"{_label(name)}: {problem}", name=name, problem=problem)


def _label(name: str) -> str:
    return "stdin" if name == "-" else name if name.isprintable() else repr(name)


def load_image(
    data: bytes,
    *,
    name: str,
    max_bytes: int = MAX_IMAGE_BYTES,
    max_side: int = MAX_SIDE,
    max_pixels: int = MAX_PIXELS,
) -> Image:
    """Untrusted bytes -> an RGB Image, or an ImageError saying in one line why not."""
    if len(data) > max_bytes:
        size, bound = sizes(len(data), max_bytes)
        raise refuse(name, f"the image is {size}, over the {bound} an image may be")
    fmt = sniff(data, name)
    header = header_size(data, fmt)
    if header is not None:
        check_size(*header, name=name, max_side=max_side, max_pixels=max_pixels)
    rgb, width, height, notes = _decode(data, fmt, name, max_side, max_pixels)
    return Image(
        rgb=rgb,
        width=width,
        height=height,
        sha256=hashlib.sha256(data).hexdigest(),
        size=len(data),
        format=fmt,
        name=name,
        warnings=notes,
    )


def sizes(n: int, bound: int, *more: int) -> tuple[str, ...]:
    """n, the bound it is over and any `more`, in the one unit the bound reads best in (MB, KB or
    bytes), with the decimals that keep n apart from the bound: "481.3 KB" against "100.0 KB", never
    "0.5 MB" against "0.1 MB", and never two sizes that look equal."""
    scale, unit = (1e6, "MB") if bound >= 1_000_000 else (1e3, "KB") if bound >= 1_000 else (1, "bytes")
    for decimals in (1, 2, 3) if scale > 1 else ():
        shown = tuple(f"{x / scale:,.{decimals}f} {unit}" for x in (n, bound, *more))
        if shown[0] != shown[1]:
            return shown
    return tuple(f"{x:,} bytes" for x in (n, bound, *more))


# -- 2. What the bytes are --------------------------------------------------------------------------

# Formats runner refuses, by their magic: (offset, bytes, what it looks like).
_REFUSED_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, b"%PDF", "a PDF document"),
    (0, b"fLaC", "FLAC audio"),
    (0, b"OggS", "Ogg audio or video"),
    (0, b"ID3", "MP3 audio"),
    (0, b"#!AMR", "AMR audio"),
    (0, b"FORM", "AIFF audio"),
    (0, b".snd", "AU audio"),
    (0, b"MThd", "MIDI music"),
    (0, b"\x30\x26\xb2\x75\x8e\x66\xcf\x11", "ASF/WMA/WMV audio or video"),
    (0, b"FLV", "FLV video"),
    (0, b"\x00\x00\x01\xba", "MPEG video"),
    (0, b"\x00\x00\x01\xb3", "MPEG video"),
    (0, b"II*\x00", "a TIFF image"),
    (0, b"MM\x00*", "a TIFF image"),
    (0, b"\x00\x00\x01\x00", "an ICO icon"),
    (0, b"8BPS", "a Photoshop document"),
    (0, b"\xff\x0a", "a JPEG XL image"),
    (4, b"JXL ", "a JPEG XL image"),
    (0, b"\x76\x2f\x31\x01", "an OpenEXR image"),
    (0, b"PK\x03\x04", "a ZIP archive (or a document inside one)"),
    (0, b"\x1f\x8b", "gzip data"),
    (0, b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (0, b"Rar!", "a RAR archive"),
    (0, b"\x7fELF", "a program (ELF)"),
    (0, b"MZ", "a Windows program"),
    (0, b"GGUF", "a GGUF model"),
    (0, b"\x93NUMPY", "a NumPy array"),
)
_FTYP_BRANDS = {  # ISO media (bytes 4..8 "ftyp"), by the brand that follows
    b"M4A ": "M4A audio",
    b"M4B ": "M4B audio",
    b"heic": "a HEIC image",
    b"heix": "a HEIC image",
    b"mif1": "a HEIF image",
    b"avif": "an AVIF image",
    b"qt  ": "QuickTime video",
    b"3gp4": "3GP video",
}
_BASE64_HEADS = ("iVBORw0KGgo", "/9j/", "R0lGOD", "UklGR", "Qk")  # PNG, JPEG, GIF, RIFF, BMP in base64


def sniff(data: bytes, name: str) -> str:
    """The format of `data`, one of FORMATS, by its magic bytes; anything else is refused."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "WEBP"
    if data.startswith(b"BM") and len(data) >= 18 and struct.unpack_from("<I", data, 14)[0] in _BMP_HEADERS:
        return "BMP"
    if not data:
        raise refuse(name, f"is empty: no image ({ACCEPTED})")
    raise refuse(name, f"{_looks_like(data)}, not an image runner reads ({ACCEPTED})")


def _looks_like(data: bytes) -> str:
    if data.startswith(b"RIFF"):
        kind = {b"WAVE": "WAV audio", b"AVI ": "AVI video"}.get(data[8:12], "a RIFF file")
        return f"looks like {kind}"
    if data[4:8] == b"ftyp":
        return f"looks like {_FTYP_BRANDS.get(data[8:12], 'MP4 video')}"
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        return "looks like WebM video" if b"webm" in data[:64] else "looks like Matroska (MKV) video"
    for offset, magic, kind in _REFUSED_MAGIC:
        if data[offset : offset + len(magic)] == magic:
            return f"looks like {kind}"
    if len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0:
        return "looks like MPEG audio (MP3 or AAC)"
    text = _as_text(data[:512])
    if text is not None:
        head = text.lstrip().lower()
        if "<svg" in head:
            return "looks like an SVG drawing"
        if head.startswith(("<!doctype html", "<html")):
            return "looks like HTML"
        if head.startswith("data:") or text.lstrip().startswith(_BASE64_HEADS):
            return "looks like base64 text (give it as a data URL where one is taken, or decode it first)"
        return "looks like text"
    return "is in a format runner does not recognise"


def _as_text(head: bytes) -> str | None:
    """The bytes as text if they read as UTF-8 (a character cut at the end aside), printable."""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:
            return None
        text = head[: exc.start].decode("utf-8")
    text = text.removeprefix("\ufeff")
    return text if all(c.isprintable() or c in "\t\r\n\f" for c in text) else None


# -- 3. How large it says it is ---------------------------------------------------------------------


def header_size(data: bytes, fmt: str) -> tuple[int, int] | None:
    """Width and height as the format's own header states them, or None where it does not say
    (then the size Pillow reads is checked instead, still before any pixel is decoded)."""
    try:
        if fmt == "PNG" and data[12:16] == b"IHDR":
            w, h = struct.unpack_from(">II", data, 16)
            return w, h
        if fmt == "GIF":
            w, h = struct.unpack_from("<HH", data, 6)
            return w, h
        if fmt == "BMP":
            if struct.unpack_from("<I", data, 14)[0] == 12:
                w, h = struct.unpack_from("<HH", data, 18)
                return w, h
            w, h = struct.unpack_from("<ii", data, 18)
            return abs(w), abs(h)
        if fmt == "WEBP":
            return _webp_size(data)
        if fmt == "JPEG":
            return _jpeg_size(data)
    except struct.error:
        return None  # too short to say: Pillow will call it truncated
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X":  # the canvas, as an animation is drawn on
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return w, h
    if chunk == b"VP8L" and data[20:21] == b"\x2f":
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack_from("<HH", data, 26)
        return w & 0x3FFF, h & 0x3FFF
    return None


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """The frame header's size: the markers walked from the start to the first SOF."""
    i = 2
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
        elif marker in _SOF:
            h, w = struct.unpack_from(">HH", data, i + 5)
            return w, h
        elif marker == 0xDA:  # the scan, and no frame header before it
            return None
        else:
            i += 2 + struct.unpack_from(">H", data, i + 2)[0]
    return None


def check_size(width: int, height: int, *, name: str, max_side: int, max_pixels: int) -> None:
    if width <= 0 or height <= 0:
        raise refuse(name, f"its header says {width}x{height} pixels: no image to read")
    if width > max_side or height > max_side:
        raise refuse(name, f"{width}x{height} pixels is over {max_side:,} a side (a decompression bomb?)")
    if width * height > max_pixels:
        raise refuse(
            name,
            f"{width}x{height} is {width * height / 1e6:.1f} megapixels, over the limit of "
            f"{max_pixels / 1e6:g} megapixels (a decompression bomb?)",
        )


# -- 4. Pixels --------------------------------------------------------------------------------------


def _decode(
    data: bytes, fmt: str, name: str, max_side: int, max_pixels: int
) -> tuple[bytes, int, int, tuple[str, ...]]:
    from PIL import Image as pil
    from PIL import ImageFile, features

    if fmt == "WEBP" and not features.check_module("webp"):
        raise refuse(name, "this install's Pillow was built without WebP: convert it to PNG or JPEG")
    ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file is refused, never padded with grey
    notes: list[str] = []
    try:
        # Pillow's own bomb guard as an error too (where the header read above said nothing, or
        # max_pixels is above Pillow's), and its notes on metadata it skipped (corrupt EXIF, an
        # APNG read as its default image) kept off stderr. catch_warnings is process-wide and not
        # thread-safe: two decodes at once can at worst leave these two Pillow-only filters in place.
        with warnings.catch_warnings():
            warnings.simplefilter("error", pil.DecompressionBombWarning)
            warnings.filterwarnings("ignore", category=UserWarning, module=r"PIL\.")
            with pil.open(io.BytesIO(data), formats=[fmt]) as im:
                check_size(*im.size, name=name, max_side=max_side, max_pixels=max_pixels)
                frames = getattr(im, "n_frames", 1)
                if frames > 1:
                    im.seek(0)
                    notes.append(f"an animated {_PRETTY[fmt]} of {frames} frames: only the first is used")
                im.load()
                _upright(im, notes)
                rgb = _to_rgb(im)
                pixels, width, height = rgb.tobytes(), rgb.width, rgb.height
    except ImageError:
        raise
    except (pil.DecompressionBombError, pil.DecompressionBombWarning) as exc:
        raise refuse(name, f"refused as a decompression bomb ({_one_line(exc)})") from exc
    except Exception as exc:  # OSError, SyntaxError, struct.error ... from Pillow's parsers: the file's fault
        raise refuse(name, f"a truncated or corrupt {_PRETTY[fmt]} file ({_one_line(exc)})") from exc
    return pixels, width, height, tuple(f"{_label(name)}: {note}" for note in notes)


def _upright(im: PILImage, notes: list[str]) -> None:
    """The image turned, in place, as its EXIF orientation says; as stored where that cannot be read."""
    from PIL import ImageOps

    try:
        ImageOps.exif_transpose(im, in_place=True)
    except Exception as exc:  # malformed EXIF: the pixels are still good
        notes.append(f"its EXIF orientation could not be read ({_one_line(exc)}); used as stored")


def _to_rgb(im: PILImage) -> PILImage:
    """8-bit RGB: 16-bit samples scaled (not clipped), transparency composited on white."""
    from PIL import Image as pil

    if im.mode in ("I", "I;16", "I;16L", "I;16B", "I;16N", "F"):  # 16-bit grey: 0..65535 -> 0..255
        im = im.convert("I").point(lambda v: v * (1 / 257) + 0.5).convert("L")
    if im.mode == "RGB":
        return im
    if "A" in im.mode or "a" in im.mode or "transparency" in im.info:
        rgba = im if im.mode == "RGBA" else im.convert("RGBA")
        white = pil.new("RGB", rgba.size, (255, 255, 255))
        white.paste(rgba, mask=rgba.getchannel("A"))
        return white
    return im.convert("RGB")


_OBJECT = re.compile(r" ?<[^<>]* at 0x[0-9a-fA-F]+>")  # "cannot identify image file <_io.BytesIO ...>"


def _one_line(exc: BaseException) -> str:
    text = " ".join(_OBJECT.sub("", str(exc)).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


# -- Where the bytes come from ----------------------------------------------------------------------

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_ONLY = "only data URLs (data:image/png;base64,...) and base64 are taken: runner fetches nothing"


def parse_data_url(text: str, *, name: str = "image", max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """`data:image/...;base64,...` or bare base64 -> the bytes (strictly decoded). Any other URL is
    refused: no fetch ever happens."""
    text = text.strip()
    scheme = _SCHEME.match(text)
    if scheme is None:
        payload = text
    elif scheme.group(1).lower() != "data":
        raise refuse(name, f"{scheme.group(1).lower()}: URLs are refused; {_ONLY}")
    else:
        head, comma, payload = text[5:].partition(",")
        params = [p.strip().lower() for p in head.split(";")]
        if not comma or params[-1] != "base64":
            raise refuse(name, f"a data URL that is not base64; {_ONLY}")
        media = params[0] if len(params) > 1 else ""
        if media and not media.startswith("image/") and media != "application/octet-stream":
            raise refuse(name, f"a data URL of {media}, not an image ({ACCEPTED})")
    payload = re.sub(r"\s+", "", payload)  # base64 as wrapped at 76 columns reads the same
    if not payload:
        raise refuse(name, "no image data (an empty data URL or base64 string)")
    if (size := len(payload) // 4 * 3) > max_bytes + 2:  # 2: what padding may take off
        exact = size - (len(payload) - len(payload.rstrip("=")))  # less the bytes padding stands for
        decoded, bound, sent = sizes(exact, max_bytes, len(payload))
        raise refuse(
            name, f"the image is {decoded} once decoded ({sent} of base64), over the {bound} an image may be"
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise refuse(name, f"not valid base64; {_ONLY}") from None


def read_image_arg(arg: str, stdin: BinaryIO, *, max_bytes: int = MAX_IMAGE_BYTES) -> Image:
    """An image as the command line names it: `-` for stdin, anything else a local file."""
    if arg == "-":
        return load_image(_read_bounded(stdin, max_bytes, "-"), name="-", max_bytes=max_bytes)
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
        raise refuse(arg, "is a directory, not an image file") from None
    except PermissionError:
        raise refuse(arg, "cannot be read: permission denied") from None
    except OSError as exc:
        raise refuse(arg, f"cannot be read: {exc.strerror or _one_line(exc)}") from None
    return load_image(data, name=arg, max_bytes=max_bytes)


def _read_bounded(f: BinaryIO, max_bytes: int, name: str) -> bytes:
    data = read_at_most(f, max_bytes)
    if data is None:
        raise refuse(name, f"more than the {size_text(max_bytes)} an image may be")
    return data
