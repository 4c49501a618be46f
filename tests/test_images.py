"""runner/images.py: untrusted bytes -> RGB pixels, or one line saying why not.

Every image here is made in memory with Pillow (or by hand, where Pillow would not write it: a
header that lies about its size, a 16-bit RGB PNG); nothing is read from disk but tmp_path.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import struct
import subprocess
import sys
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image as PIL
from PIL import ImageFile

from runner.errors import ImageError, UsageError, exit_code_for
from runner.images import (
    ACCEPTED,
    MAX_IMAGE_BYTES,
    MAX_IMAGES,
    MAX_PIXELS,
    MAX_SIDE,
    Image,
    load_image,
    parse_data_url,
    read_image_arg,
    sizes,
)
from tests.helpers import wav

ROOT = Path(__file__).resolve().parent.parent

# A 5x3 image whose every pixel differs, so a flip, a rotation or a channel swap shows.
COLOURS = [(r, g, b) for r in (0, 90, 255) for g in (10, 200) for b in (0, 128, 255)][:15]


def pattern(mode: str = "RGB") -> PIL.Image:
    im = PIL.new("RGB", (5, 3))
    im.putdata(COLOURS)
    return im.convert(mode)


def encode(im: PIL.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, **options)
    return out.getvalue()


def png_chunk(tag: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))


def png(width: int, height: int, *, depth: int = 8, colour: int = 2, rows: bytes | None = None) -> bytes:
    """A PNG by hand: its IHDR says width x height; IDAT only where rows are given."""
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 0))
    idat = png_chunk(b"IDAT", zlib.compress(rows)) if rows is not None else b""
    return b"\x89PNG\r\n\x1a\n" + ihdr + idat + png_chunk(b"IEND", b"")


def gif_claiming(screen: tuple[int, int], frame: tuple[int, int]) -> bytes:
    """A GIF whose screen is small and whose first frame says it is larger (Pillow grows the image)."""
    head = b"GIF89a" + struct.pack("<HHBBB", *screen, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    return head + b"," + struct.pack("<HHHHB", 0, 0, *frame, 0) + b"\x02\x02\x44\x01\x00;"


def refusal(data: bytes, name: str = "in.bin", **limits: int) -> str:
    with pytest.raises(ImageError) as caught:
        load_image(data, name=name, **limits)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{name}: ")
    assert caught.value.name == name and message.endswith(caught.value.problem)
    return message


def close(a: bytes, b: bytes, tolerance: int) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) <= tolerance


def test_importing_images_does_not_import_pillow() -> None:
    code = "import sys, runner.images; assert not any(m.split('.')[0] == 'PIL' for m in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.fast
def test_limits_are_named() -> None:
    assert (MAX_SIDE, MAX_PIXELS, MAX_IMAGE_BYTES, MAX_IMAGES) == (8192, 32_000_000, 20_000_000, 8)


# -- Formats decode to the right pixels -------------------------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize(
    ("fmt", "im", "options"),
    [
        ("PNG", pattern(), {}),
        ("BMP", pattern(), {}),
        ("GIF", pattern().convert("P", palette=PIL.Palette.ADAPTIVE, colors=16), {}),
        ("WEBP", pattern(), {"lossless": True}),
        ("PNG", pattern().convert("P", palette=PIL.Palette.ADAPTIVE, colors=16), {}),  # palette
    ],
    ids=["png", "bmp", "gif", "webp-lossless", "png-palette"],
)
def test_each_format_decodes_to_exact_pixels(fmt: str, im: PIL.Image, options: dict[str, object]) -> None:
    data = encode(im, fmt, **options)
    image = load_image(data, name="pic")
    assert (image.width, image.height, image.format) == (5, 3, fmt)
    assert image.rgb == pattern().tobytes()
    assert image.sha256 == hashlib.sha256(data).hexdigest() and image.size == len(data)
    assert image.name == "pic" and image.warnings == ()


@pytest.mark.fast
def test_jpeg_decodes_within_tolerance() -> None:
    im = PIL.new("RGB", (32, 16), (200, 30, 40))
    im.paste((20, 90, 230), (16, 0, 32, 16))
    image = load_image(encode(im, "JPEG", quality=95, subsampling=0), name="a.jpg")
    assert (image.width, image.height, image.format) == (32, 16, "JPEG")
    assert close(image.rgb, im.tobytes(), 8)


@pytest.mark.fast
def test_cmyk_jpeg_ends_as_rgb() -> None:
    im = PIL.new("CMYK", (16, 8), (0, 0, 0, 0))  # white
    im.paste((0, 255, 255, 0), (8, 0, 16, 8))  # red
    image = load_image(encode(im, "JPEG", quality=95), name="cmyk.jpg")
    expected = PIL.new("RGB", (16, 8), (255, 255, 255))
    expected.paste((255, 0, 0), (8, 0, 16, 8))
    assert close(image.rgb, expected.tobytes(), 8)


@pytest.mark.fast
def test_transparency_is_composited_on_white() -> None:
    im = PIL.new("RGBA", (3, 1))
    im.putdata([(10, 20, 30, 0), (10, 20, 30, 255), (0, 0, 0, 128)])
    image = load_image(encode(im, "PNG"), name="a.png")
    assert image.rgb[:6] == bytes([255, 255, 255, 10, 20, 30])
    assert close(image.rgb[6:], bytes([127, 127, 127]), 1)  # half-transparent black on white
    grey_alpha = PIL.new("LA", (2, 1))
    grey_alpha.putdata([(0, 0), (40, 255)])
    assert load_image(encode(grey_alpha, "PNG"), name="la.png").rgb == bytes([255] * 3 + [40] * 3)
    assert load_image(encode(im, "WEBP", lossless=True), name="a.webp").rgb[:6] == image.rgb[:6]


@pytest.mark.fast
def test_palette_transparency_is_white() -> None:
    im = PIL.new("P", (2, 1))
    im.putpalette([0, 0, 0, 200, 0, 0] + [0] * 762)
    im.putdata([0, 1])
    for fmt in ("PNG", "GIF"):
        assert load_image(encode(im, fmt, transparency=0), name="p").rgb == bytes([255, 255, 255, 200, 0, 0])


@pytest.mark.fast
def test_sixteen_bit_samples_are_scaled_not_clipped() -> None:
    grey = PIL.new("I;16", (4, 1))
    grey.putdata([0, 65535, 32896, 400])  # 400 / 257 = 1.56 -> 2
    image = load_image(encode(grey, "PNG"), name="g16.png")
    assert image.rgb == bytes([0] * 3 + [255] * 3 + [128] * 3 + [2] * 3)
    # 16-bit RGB, which Pillow will not write: samples v * 257 read back as v.
    row = b"\x00" + struct.pack(">6H", 0xABAB, 0x0000, 0xFFFF, 0x1111, 0x2222, 0x3333)
    image = load_image(png(2, 1, depth=16, rows=row), name="rgb16.png")
    assert (image.width, image.height, image.rgb) == (2, 1, bytes([0xAB, 0, 0xFF, 0x11, 0x22, 0x33]))


@pytest.mark.fast
def test_exif_orientation_is_applied() -> None:
    exif = PIL.Exif()
    exif[0x0112] = 6  # the camera was turned: rotate 90 degrees clockwise to view
    image = load_image(encode(pattern(), "PNG", exif=exif), name="turned.png")
    upright = pattern().transpose(PIL.Transpose.ROTATE_270)
    assert (image.width, image.height, image.rgb) == (3, 5, upright.tobytes())
    exif[0x0112] = 8
    big = PIL.new("RGB", (40, 16), (0, 128, 0))
    image = load_image(encode(big, "JPEG", exif=exif), name="turned.jpg")
    assert (image.width, image.height) == (16, 40)


@pytest.mark.fast
@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "PNG"])
def test_animation_gives_its_first_frame_and_a_warning(fmt: str) -> None:
    first, second = pattern(), PIL.new("RGB", (5, 3), (0, 0, 255))
    options = {"lossless": True} if fmt == "WEBP" else {}
    data = encode(first, fmt, save_all=True, append_images=[second], duration=100, **options)
    image = load_image(data, name="anim")
    assert (image.width, image.height) == (5, 3)
    assert close(image.rgb, first.tobytes(), 0 if fmt != "GIF" else 4)
    assert len(image.warnings) == 1 and "anim: an animated" in image.warnings[0]
    assert "2 frames: only the first is used" in image.warnings[0]


@pytest.mark.fast
def test_image_repr_leaves_the_pixels_out() -> None:
    image = load_image(encode(pattern(), "PNG"), name="a.png")
    assert "rgb" not in repr(image) and isinstance(image, Image)
    with pytest.raises(AttributeError):
        image.width = 1  # type: ignore[misc]


# -- What is refused, before Pillow decodes anything ------------------------------------------------


NOT_IMAGES = [
    ("wav", wav(100), "WAV audio"),
    ("mp3-id3", b"ID3\x04\x00\x00\x00\x00\x00\x00" + b"\xff\xfb\x90\x00" * 10, "MP3 audio"),
    ("mp3-frame", b"\xff\xfb\x90\x64" + bytes(400), "MPEG audio"),
    ("flac", b"fLaC\x00\x00\x00\x22" + bytes(40), "FLAC audio"),
    ("ogg", b"OggS\x00\x02" + bytes(40), "Ogg audio or video"),
    ("mp4", b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2", "MP4 video"),
    ("m4a", b"\x00\x00\x00\x18ftypM4A \x00\x00\x02\x00", "M4A audio"),
    ("heic", b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00", "HEIC image"),
    ("webm", b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01\x42\x82\x84webm", "WebM video"),
    ("mkv", b"\x1a\x45\xdf\xa3\xa3\x42\x86\x81\x01\x42\x82\x88matroska", "Matroska (MKV) video"),
    ("avi", b"RIFF\x00\x10\x00\x00AVI LIST", "AVI video"),
    ("pdf", b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj", "a PDF document"),
    ("text", b"Hello, this is not a picture.\n", "looks like text"),
    ("svg", b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"/>', "SVG drawing"),
    ("base64", base64.b64encode(encode(pattern(), "PNG")), "base64 text"),
    ("tiff", encode(pattern(), "TIFF"), "a TIFF image"),
    ("zip", b"PK\x03\x04\x14\x00" + bytes(30), "a ZIP archive"),
    ("bm-text", b"BMW is a car maker, not a bitmap.", "looks like text"),
    ("binary", bytes(range(256)) * 2, "a format runner does not recognise"),
    ("empty", b"", "is empty"),
]


@pytest.mark.fast
@pytest.mark.parametrize(
    ("data", "looks"), [(d, looks) for _, d, looks in NOT_IMAGES], ids=[i for i, *_ in NOT_IMAGES]
)
def test_what_is_not_an_image_is_refused_by_its_magic(
    data: bytes, looks: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(PIL, "open", lambda *a, **k: pytest.fail("Pillow was asked"))
    message = refusal(data, name="clip")
    assert looks in message and message.endswith(f"({ACCEPTED})")


@pytest.mark.fast
def test_stdin_and_api_fields_are_named() -> None:
    with pytest.raises(ImageError, match=r"^stdin: is empty") as caught:
        load_image(b"", name="-")
    assert caught.value.name == "-"
    field = "messages[0].content[1].image_url"
    with pytest.raises(ImageError, match=rf"^{re.escape(field)}: looks like text"):
        load_image(b"hi", name=field)


@pytest.mark.fast
def test_image_error_is_a_usage_error_exiting_2() -> None:
    with pytest.raises(UsageError) as caught:
        load_image(b"hi", name="x")
    assert exit_code_for(caught.value) == 2


@pytest.mark.fast
def test_truncated_and_corrupt_files_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    good = encode(PIL.effect_noise((64, 64), 60).convert("RGB"), "PNG")
    assert "a truncated or corrupt PNG file" in refusal(good[: len(good) // 2], name="cut.png")
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)  # someone else's setting: not ours
    assert "a truncated or corrupt PNG file" in refusal(good[: len(good) // 2], name="cut.png")
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False
    jpeg = bytearray(encode(PIL.new("RGB", (64, 64), (200, 10, 10)), "JPEG"))
    huffman = jpeg.find(b"\xff\xc4")
    jpeg[huffman + 5 : huffman + 21] = b"\xff" * 16  # code counts that no Huffman table can have
    assert "a truncated or corrupt JPEG file" in refusal(bytes(jpeg), name="bad.jpg")
    gif = encode(pattern().convert("P"), "GIF")
    assert "a truncated or corrupt GIF file" in refusal(gif[:-12], name="cut.gif")
    assert refusal(b"\x89PNG\r\n\x1a\n", name="sig.png") == (
        "sig.png: a truncated or corrupt PNG file (cannot identify image file)"
    )


@pytest.mark.fast
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (png(9000, 10), "9000x10 pixels is over 8,192 a side"),
        (png(6000, 6000), "6000x6000 is 36.0 megapixels, over the limit of 32 megapixels"),
        (png(0, 10), "its header says 0x10 pixels"),
        (encode(PIL.new("RGB", (4, 4)), "BMP")[:18] + struct.pack("<ii", 10, -9000), "10x9000 pixels"),
        (b"GIF89a" + struct.pack("<HH", 60000, 2), "60000x2 pixels"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8X" + bytes(8) + b"\xff\xff\x00\xff\xff\x00", "65536x65536 pixels"),
    ],
    ids=["png-wide", "png-36mp", "png-empty", "bmp-tall", "gif-wide", "webp-canvas"],
)
def test_a_header_too_large_is_refused_before_pillow(
    data: bytes, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(PIL, "open", lambda *a, **k: pytest.fail("Pillow was asked"))
    tracemalloc.start()
    started = time.perf_counter()
    message = refusal(data, name="bomb")
    elapsed = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert expected in message and elapsed < 0.1 and peak < 100_000


@pytest.mark.fast
def test_a_jpeg_header_too_large_is_refused_before_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    jpeg = bytearray(encode(PIL.new("RGB", (8, 8)), "JPEG"))
    sof = jpeg.find(b"\xff\xc0")
    jpeg[sof + 5 : sof + 9] = struct.pack(">HH", 6000, 6000)
    monkeypatch.setattr(PIL, "open", lambda *a, **k: pytest.fail("Pillow was asked"))
    assert "6000x6000 is 36.0 megapixels" in refusal(bytes(jpeg), name="bomb.jpg")


@pytest.mark.fast
@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ((6000, 6000), "6000x6000 is 36.0 megapixels"),  # the size Pillow reads, checked before load
        ((20000, 20000), "refused as a decompression bomb"),  # Pillow's DecompressionBombError
    ],
)
def test_the_size_pillow_reads_is_checked_too(frame: tuple[int, int], expected: str) -> None:
    started = time.perf_counter()
    assert expected in refusal(gif_claiming((2, 2), frame), name="grows.gif")
    assert time.perf_counter() - started < 0.5


@pytest.mark.fast
def test_pillows_bomb_warning_is_a_refusal_too() -> None:
    """Limits set above Pillow's own: its DecompressionBombWarning is refused, not printed."""
    message = refusal(gif_claiming((2, 2), (10000, 10000)), name="g", max_side=20000, max_pixels=10**9)
    assert "refused as a decompression bomb" in message


@pytest.mark.fast
def test_too_many_bytes_are_refused_before_anything_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    data = encode(pattern(), "PNG")
    said = f"big: the image is {len(data):,} bytes, over the 10 bytes an image may be"
    assert refusal(data, name="big", max_bytes=10) == said
    assert "is 11 bytes, over the" in refusal(b"x" * 11, name="big", max_bytes=10)  # not even sniffed
    assert load_image(data, name="ok", max_bytes=len(data)).width == 5


# -- Data URLs and base64 ---------------------------------------------------------------------------

PNG_BYTES = encode(pattern(), "PNG")
B64 = base64.b64encode(PNG_BYTES).decode()


@pytest.mark.fast
@pytest.mark.parametrize(
    "text",
    [
        f"data:image/png;base64,{B64}",
        f"DATA:image/jpeg;base64,{B64}",  # the declared type may be wrong: the bytes are sniffed
        f"data:;base64,{B64}",
        f"data:image/png;name=x.png;base64,{B64}",
        B64,
        f"  {B64}\n",
        "\n".join(B64[i : i + 76] for i in range(0, len(B64), 76)),  # as `base64` wraps it
    ],
    ids=["png", "upper-scheme", "no-type", "parameter", "bare", "spaces", "wrapped"],
)
def test_data_urls_and_base64_decode(text: str) -> None:
    assert parse_data_url(text) == PNG_BYTES
    assert load_image(parse_data_url(text), name="u").rgb == pattern().tobytes()


@pytest.mark.fast
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://example.com/cat.png", "http: URLs are refused; only data URLs"),
        ("HTTPS://example.com/cat.png", "https: URLs are refused; only data URLs"),
        ("file:///etc/passwd", "file: URLs are refused; only data URLs"),
        ("ftp://example.com/x.png", "ftp: URLs are refused"),
        ("data:image/png,%89PNG", "a data URL that is not base64"),
        ("data:image/png;base64", "a data URL that is not base64"),
        (f"data:text/plain;base64,{B64}", "a data URL of text/plain, not an image"),
        (f"data:audio/wav;base64,{B64}", "a data URL of audio/wav"),
        ("data:image/png;base64,", "no image data"),
        ("", "no image data"),
        (B64[:-2], "not valid base64"),  # padding cut
        (B64.replace("A", "-", 1), "not valid base64"),  # the URL-safe alphabet
        ("not base64 at all!", "not valid base64"),
    ],
)
def test_bad_data_urls_and_every_other_url_are_refused(text: str, expected: str) -> None:
    with pytest.raises(ImageError) as caught:
        parse_data_url(text, name="messages[0].content[1].image_url")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("messages[0].content[1].image_url: ")
    assert expected in message


@pytest.mark.fast
def test_base64_over_the_limit_is_refused_before_decoding() -> None:
    """The bound is on the decoded image: the refusal says so, in the bound's own unit, with the base64
    as sent beside it (481 KB of image is 642 KB of base64, never "0.5 MB of base64 over 0.1 MB")."""
    with pytest.raises(ImageError) as caught:
        parse_data_url("A" * 4000, max_bytes=1000)
    assert str(caught.value).endswith(
        "the image is 3.0 KB once decoded (4.0 KB of base64), over the 1.0 KB an image may be"
    )
    image = base64.b64encode(b"\0" * 481_263).decode()
    with pytest.raises(ImageError) as caught:
        parse_data_url(f"data:image/png;base64,{image}", name="images[0]", max_bytes=100_000)
    said = "images[0]: the image is 481.3 KB once decoded (641.7 KB of base64), over the 100.0 KB an "
    said += "image may be"
    assert str(caught.value) == said
    assert len(parse_data_url("A" * 1336 + "AA==", max_bytes=1003)) == 1003


# -- The command line's argument --------------------------------------------------------------------


@pytest.mark.fast
def test_read_image_arg_reads_files_and_stdin(tmp_path: Path) -> None:
    path = tmp_path / "cat.png"
    path.write_bytes(PNG_BYTES)
    assert read_image_arg(str(path), io.BytesIO()).rgb == pattern().tobytes()
    from_stdin = read_image_arg("-", io.BytesIO(PNG_BYTES))
    assert from_stdin.name == "-" and from_stdin.sha256 == hashlib.sha256(PNG_BYTES).hexdigest()


class Endless(io.RawIOBase):
    """A stdin that never ends, counting what was read from it."""

    def __init__(self) -> None:
        self.read_so_far = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        self.read_so_far += len(buffer)
        buffer[:] = b"\x89" * len(buffer)
        return len(buffer)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("n", "bound", "shown"),
    [
        (481_263, 100_000, ("481.3 KB", "100.0 KB")),
        (25_000_000, 20_000_000, ("25.0 MB", "20.0 MB")),
        (20_040_000, 20_000_000, ("20.04 MB", "20.00 MB")),  # decimals until they differ
        (20_000_001, 20_000_000, ("20,000,001 bytes", "20,000,000 bytes")),  # else bytes, exact
        (11, 10, ("11 bytes", "10 bytes")),
    ],
)
def test_a_size_and_its_bound_are_said_in_one_unit(n: int, bound: int, shown: tuple[str, str]) -> None:
    assert sizes(n, bound) == shown


@pytest.mark.fast
def test_read_image_arg_stops_reading_past_the_limit() -> None:
    stdin = Endless()
    with pytest.raises(ImageError, match=r"^stdin: more than the 1.0 MB an image may be$"):
        read_image_arg("-", stdin, max_bytes=1_000_000)  # type: ignore[arg-type]
    assert stdin.read_so_far <= 1_000_001


@pytest.mark.fast
def test_read_image_arg_refuses_in_one_line(tmp_path: Path) -> None:
    cases = {
        str(tmp_path / "missing.png"): "no such file",
        str(tmp_path): "is a directory",
        "https://example.com/cat.png": "no such file (and URLs are not fetched)",
    }
    for arg, expected in cases.items():
        with pytest.raises(ImageError) as caught:
            read_image_arg(arg, io.BytesIO())
        assert str(caught.value).startswith(f"{arg}: ") and expected in str(caught.value)
        assert "\n" not in str(caught.value)


@pytest.mark.fast
def test_read_image_arg_refuses_an_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a file without read permission opens for anyone but root (who may run this suite)."""

    def denied(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", denied)
    with pytest.raises(ImageError, match=r"^.*locked.png: cannot be read: permission denied$"):
        read_image_arg(str(tmp_path / "locked.png"), io.BytesIO())


# -- Any bytes at all: an Image that adds up, or ImageError -----------------------------------------

SEEDS = [
    encode(pattern(), "PNG"),
    encode(pattern(), "JPEG", quality=90),
    encode(pattern().convert("P"), "GIF", save_all=True, append_images=[pattern().convert("P")]),
    encode(pattern(), "WEBP", lossless=True),
    encode(pattern(), "BMP"),
]


def consistent_or_refused(data: bytes) -> None:
    try:
        image = load_image(data, name="fuzz")
    except ImageError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzz: ")
        return
    assert 0 < image.width <= MAX_SIDE and 0 < image.height <= MAX_SIDE
    assert len(image.rgb) == image.width * image.height * 3
    assert image.sha256 == hashlib.sha256(data).hexdigest() and image.size == len(data)


@pytest.mark.fast
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_decode_or_are_refused(data: bytes) -> None:
    consistent_or_refused(data)


@pytest.mark.fast
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(SEEDS),
    st.lists(st.tuples(st.integers(min_value=0, max_value=4096), st.integers(0, 255)), max_size=8),
    st.integers(min_value=0, max_value=4096),
)
def test_mutated_images_decode_or_are_refused(seed: bytes, edits: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(seed)
    for at, value in edits:
        data[at % len(data)] = value
    consistent_or_refused(bytes(data[: len(data) - cut % 64]))
