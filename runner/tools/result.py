"""What a tool call gives back, bounded before runner keeps it.

A tool server is untrusted: it may answer with a megabyte of text, a dozen large images, or content
runner cannot pass on. `from_call` keeps the text parts joined and cut to a byte budget (at a
character boundary, with a note the model will read), at most a few images of bounded size as bytes,
and one line for anything left out, so the model always learns that something was there.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from runner.ui import human_bytes

MAX_RESULT_BYTES = 32 * 1024
MAX_IMAGE_BYTES = 4 * 1024 * 1024
MAX_IMAGES = 4
MAX_MIME = 100  # a mime type longer than this is not one


@dataclass
class ToolResult:
    """One call's outcome. `is_error`: the server said so (isError), or the call failed here (a
    timeout, a crash, an unknown tool), with the reason in `text`. `interrupted`: Ctrl-C cancelled
    it (is_error too). `truncated`: `text` was cut to the budget (the note says so in the text)."""

    text: str
    images: list[tuple[str, bytes]] = field(default_factory=list)  # (mime type, bytes)
    is_error: bool = False
    seconds: float = 0.0
    truncated: bool = False
    interrupted: bool = False


@dataclass(frozen=True)
class Limits:
    """How much of an answer is kept: UTF-8 bytes of text, images and bytes per image."""

    text_bytes: int = MAX_RESULT_BYTES
    images: int = MAX_IMAGES
    image_bytes: int = MAX_IMAGE_BYTES


def failure(text: str, seconds: float = 0.0, *, interrupted: bool = False) -> ToolResult:
    """A call that failed on runner's side, or never reached the server."""
    return ToolResult(text=text, is_error=True, seconds=seconds, interrupted=interrupted)


def from_call(result: Any, limits: Limits, seconds: float) -> ToolResult:
    """An SDK CallToolResult, bounded: text parts joined and cut, images decoded within limits."""
    parts: list[str] = []
    images: list[tuple[str, bytes]] = []
    notes: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)
        elif kind == "image":
            _image(block, images, notes, limits)
        elif kind == "resource":
            _resource(block.resource, parts, notes)
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        else:
            notes.append(f"[{kind} content left out: runner passes on text and images]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text, truncated = cut("\n".join(parts), limits.text_bytes)
    text = "\n".join(part for part in (text, *notes) if part)
    return ToolResult(
        text=text, images=images, is_error=bool(result.is_error), seconds=seconds, truncated=truncated
    )


def cut(text: str, budget: int) -> tuple[str, bool]:
    """The text within `budget` UTF-8 bytes, cut at a character boundary, with a note where cut."""
    encoded = text.encode("utf-8", errors="replace")
    if len(encoded) <= budget:
        return text, False
    kept = encoded[:budget].decode("utf-8", errors="ignore")  # a split character is dropped whole
    note = f"[result cut at {human_bytes(budget)} of {human_bytes(len(encoded))}]"
    return f"{kept}\n{note}", True


def _image(block: Any, images: list[tuple[str, bytes]], notes: list[str], limits: Limits) -> None:
    mime = str(getattr(block, "mime_type", "") or "image")[:MAX_MIME]
    data = block.data or ""
    size = len(data.rstrip("=")) * 3 // 4  # base64's decoded size, known before decoding
    if len(images) >= limits.images:
        notes.append(f"[{mime} left out: at most {limits.images} images are kept]")
        return
    if size > limits.image_bytes:
        notes.append(f"[{mime} of {human_bytes(size)} left out: over {human_bytes(limits.image_bytes)}]")
        return
    try:
        images.append((mime, base64.b64decode(data, validate=True)))
    except (binascii.Error, ValueError):
        notes.append(f"[{mime} left out: its data is not base64]")


def _resource(resource: Any, parts: list[str], notes: list[str]) -> None:
    text = getattr(resource, "text", None)
    if isinstance(text, str):
        parts.append(text)
    else:
        notes.append(f"[binary resource {resource.uri} left out]")
