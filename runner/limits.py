"""The ranges runner accepts, shared by every layer, and the one check that enforces them.

Here rather than in a layer above so that the engine, the planner and the commands agree on them
without importing each other.
"""

from __future__ import annotations

import math
import re
from typing import BinaryIO

from runner.errors import InvalidSetting

DEFAULT_CTX = 8192  # without --ctx: the trained context, at most this (the planner may choose less)
MIN_CTX = 32
MAX_INT32 = 2**31 - 1  # llama.cpp's n_gpu_layers is an int32, and so are the positions n_ctx counts
CTX_STEP = 256  # llama.cpp pads a context up to a multiple of this
MAX_CTX = MAX_INT32 // CTX_STEP * CTX_STEP  # the largest --ctx whose padded context an int32 still counts
MAX_THREADS = 1024


def check_answer_limits(max_tokens: int | None, stop: tuple[str, ...] | list[str]) -> None:
    """--max-tokens and --stop, as run, chat and run -c take them."""
    if max_tokens is not None:
        check_range(max_tokens, "--max-tokens", 1, None)
    if any(not s for s in stop):
        raise InvalidSetting("--stop needs a non-empty string")


def check_ctx(ctx: int) -> None:
    """--ctx within what llama.cpp takes: at least MIN_CTX, at most MAX_CTX (a larger one pads past
    what its 32-bit positions count, and the plan would then speak of a context nobody asked for)."""
    if ctx > MAX_CTX:
        problem = (
            f"must be at most {MAX_CTX:,}, the largest context llama.cpp counts (got {ctx:,}); a model's "
            "own is the context it was trained on, which runner show MODEL says"
        )
        raise InvalidSetting(f"--ctx {problem}", problem=problem)
    check_range(ctx, "--ctx", MIN_CTX, MAX_CTX)


FLASH_ATTN = {"auto": None, "on": True, "off": False}


def flash_attn_setting(value: str | None) -> bool | None:
    """--flash-attn auto|on|off as the engine takes it: None (auto, or not given), True, False."""
    if value is None:
        return None
    try:
        return FLASH_ATTN[value.strip().lower()]
    except KeyError:
        raise InvalidSetting(f"--flash-attn must be auto, on or off (got {value!r})") from None


SPEC = ("ngram", "none")  # --spec; a draft model is --draft MODEL (runner.engine.speculate)


def spec_setting(value: str | None, draft: str | None) -> str:
    """--spec and --draft as the engine takes them: "ngram" (the default), "none" or "draft"."""
    mode = (value or "").strip().lower() or None
    if mode is not None and mode not in SPEC:
        raise InvalidSetting(f"--spec must be ngram or none (got {value!r}); a draft model is --draft MODEL")
    if draft is not None:
        if mode is not None:
            raise InvalidSetting(f"--draft drafts with a model, --spec {mode} otherwise: give one of them")
        return "draft"
    return mode or "ngram"


def flash_attn_name(value: bool | None) -> str:
    return next(name for name, v in FLASH_ATTN.items() if v is value)


def check_range(
    value: float,
    flag: str,
    lo: float | None,
    hi: float | None,
    lo_open: bool = False,
    field: str | None = None,
) -> None:
    """Raise InvalidSetting naming the flag when value lies outside [lo, hi] ((lo, hi] if lo_open);
    `field`: the setting's own name, for an edge that words it otherwise (InvalidSetting.field)."""
    if isinstance(value, float) and not math.isfinite(value):
        problem = f"must be a finite number (got {value})"
        raise InvalidSetting(f"{flag} {problem}", field=field, problem=problem)
    too_low = lo is not None and (value <= lo if lo_open else value < lo)
    too_high = hi is not None and value > hi
    if too_low or too_high:
        if hi is None:
            bound = f"greater than {lo}" if lo_open else f"at least {lo}"
        else:
            bound = f"in ({lo}, {hi}]" if lo_open else f"between {lo} and {hi}"
        got = value if isinstance(value, int) else f"{value:g}"  # an int as typed, not as 2.14748e+09
        problem = f"must be {bound} (got {got})"
        raise InvalidSetting(f"{flag} {problem}", field=field, problem=problem)


DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?$")
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def parse_duration(text: str | float | int, where: str) -> float | None:
    """Ollama's keep_alive: seconds as a number, or "30s", "5m", "1h"; negative: for ever (None)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        found = DURATION.match(str(text).strip())
        if found is None:
            raise InvalidSetting(f"{where} takes a duration such as 30s, 5m, 1h, 0 or -1 (got {text!r})")
        seconds = float(found.group(1)) * UNITS[found.group(2) or "s"]
    return None if seconds < 0 else seconds


def parse_size(text: str, flag: str) -> int:
    """A size flag's value: bytes, or a number with K, M, G, T in decimal units as runner prints sizes
    (500M = 500,000,000 bytes; B optional), or KiB, MiB, GiB, TiB in powers of 1024."""
    value = text.strip().upper().removesuffix("B")
    scale = 1
    binary = value.endswith("I")
    value = value.removesuffix("I")
    for power, suffix in enumerate("KMGT", start=1):
        if value.endswith(suffix):
            value, scale = value[:-1], (1 << 10 * power) if binary else 10 ** (3 * power)
            break
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number >= 0 or number * scale > 1 << 50:
        raise InvalidSetting(f"{flag} must be a size such as 2G or 500M (got {text!r})")
    return int(number * scale)


def read_at_most(f: BinaryIO, max_bytes: int) -> bytes | None:
    """The whole stream, or None as soon as it is larger than max_bytes (never all read): an image's
    or a clip's file or stdin, each refused in its own words."""
    chunks: list[bytes] = []
    left = max_bytes + 1
    while left > 0:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return None if left <= 0 else b"".join(chunks)


def size_text(n: int) -> str:
    """A byte count as refusals say it: MB from 0.1 MB on, else bytes."""
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n:,} bytes"
