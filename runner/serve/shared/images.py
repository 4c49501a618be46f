"""Images in a request, as every API takes them: where each one is (an `ImageRef`: the field that holds
it and its data URL or base64, as sent), a message's text and images joined as llama-server joins
them, and the images decoded off the event loop into the pixels the model's thread renders.

Nothing is ever fetched: an http, https or file URL is a 400 naming its field. So is an image the
model cannot take (served without a projector), one more than --max-images, and one runner.images
will not read: over --max-image-bytes, not an image, truncated or corrupt. Pillow's work happens in a
worker thread (asyncio.to_thread), never on the event loop and never in the model's thread.
"""

from __future__ import annotations

import asyncio
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Union

from runner.errors import ImageError
from runner.images import Image, load_image, parse_data_url
from runner.serve.backend import Ask, Backend
from runner.serve.shared.http import ApiError


@dataclass(frozen=True)
class ImageRef:
    """An image a request carries, not yet decoded: the field that holds it (messages[0].content[1]
    .image_url.url) and what it holds there (a data URL or base64; anything else is refused)."""

    field: str
    data: str

    def under(self, prefix: str) -> ImageRef:
        """The same image, its field named from further out (messages[2] + content[1]...)."""
        return replace(self, field=f"{prefix}.{self.field}")

    def decoded(self, max_bytes: int) -> Any:
        """The image's pixels (in a worker thread: base64, then Pillow); a 400 naming the field if
        not. An audio part's kind (shared.audio.AudioRef) decodes a clip instead."""
        try:
            data = parse_data_url(self.data, name=self.field, max_bytes=max_bytes)
            return load_image(data, name=self.field, max_bytes=max_bytes)
        except ImageError as exc:
            raise ApiError(400, str(exc), param=exc.name) from None


Part = Union[str, ImageRef]


def joined(parts: Sequence[Part]) -> str | list[Part]:
    """A message's parts as llama-server joins them (common/chat.cpp, concat_content_parts): text
    parts with a newline between them, but none before or after an image. Text alone is one string;
    with images, the text runs and the images in order."""
    out: list[Part] = []
    empty, after_image = True, False
    for part in parts:
        if isinstance(part, ImageRef):
            out.append(part)
            empty, after_image = False, True
            continue
        text = part if empty or after_image else "\n" + part
        if out and isinstance(out[-1], str):
            out[-1] += text
        else:
            out.append(text)
        empty, after_image = empty and not text, False
    if all(isinstance(part, str) for part in out):
        return "".join(part for part in out if isinstance(part, str))
    return out


def with_images(text: str, refs: Sequence[ImageRef]) -> str | list[Part]:
    """Ollama's order, as `runner run --image`: the images first, then the text."""
    return joined([*refs, text]) if refs else text


def refs_in(messages: Sequence[dict[str, Any]]) -> Iterator[ImageRef]:
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            yield from (part for part in content if isinstance(part, ImageRef))


async def with_pixels(backend: Backend, ask: Ask) -> Ask:
    """The Ask with its images decoded (off the event loop), each in its place; a 400 naming the image's
    field where the model takes none, there are more than it takes, or one cannot be read."""
    refs = list(refs_in(ask.messages or ()))
    if not refs:
        return ask
    info = backend.info(ask.model)
    if info.max_images <= 0:
        field = refs[0].field
        raise ApiError(
            400,
            f"{field}: {ask.model} takes no images: it is served without a vision projector "
            f"(runner serve {_as_typed(info.reference or ask.model)} --mmproj FILE)",
            param=field,
        )
    if len(refs) > info.max_images:
        field = refs[info.max_images].field
        raise ApiError(
            400,
            f"{field}: {len(refs)} images in one request; at most {info.max_images} "
            "(runner serve --max-images)",
            param=field,
        )
    pixels = await asyncio.to_thread(_decoded, refs, info.max_image_bytes)
    messages = []
    for message in ask.messages or ():
        content = message.get("content")
        if isinstance(content, list):
            content = [pixels[id(p)] if isinstance(p, ImageRef) else p for p in content]
            message = {**message, "content": content}
        messages.append(message)
    return replace(ask, messages=messages)


def _as_typed(reference: str) -> str:
    """A model's reference as a shell takes it: quoted only where a shell would split or expand it
    (a leading ~ left to expand, as it was typed)."""
    return shlex.quote(reference) if re.search(r"[^\w@%+=:,./~-]", reference) else reference


def _decoded(refs: list[ImageRef], max_bytes: int) -> dict[int, Image]:
    """Each image's pixels (or clip's samples), by the id of its ImageRef (in a worker thread)."""
    return {id(ref): ref.decoded(max_bytes) for ref in refs}
