"""What every API translates the same way into the engine's `Ask` (runner.serve.backend): text and
image parts joined as llama-server joins them, the system texts merged into one system message, tool
definitions, tool_choice, a past tool call as the templates read it (OpenAI's shape), and the ids of
what an answer makes.

Each API maps its own shapes onto these (Anthropic's blocks, the Responses API's items, OpenAI's and
Ollama's messages), and says their failures in its own words.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from runner.serve.shared.images import ImageRef, Part, joined


def new_id(prefix: str) -> str:
    """An id for what an answer makes (chatcmpl-…, msg_…, toolu_…, call_…): random, 24 hex digits."""
    return prefix + secrets.token_hex(12)


def shown(kind: Any, limit: int) -> str:
    """A part's `type` as a message names it: JSON-quoted and cut, or what it lacks."""
    return json.dumps(kind)[:limit] if isinstance(kind, str) else "a part without a type"


def content_of(
    value: Any,
    fields: Mapping[str, str],
    *,
    not_a_list: str,
    refused: Callable[[int, Any], str],
    images: Mapping[str, Callable[[dict[str, Any], int], ImageRef]] | None = None,
) -> str | list[Part]:
    """A string, or a list of parts joined as llama-server joins them (shared.images.joined): `fields`
    maps each text part type served to the field that holds its text, `images` each image part type
    to what reads it (the part and its index: an ImageRef, or a ValueError). Anything else is a
    ValueError: `not_a_list`, or `refused(index, type)` for a part."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ValueError(not_a_list)
    parts: list[Part] = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        image = (images or {}).get(kind) if isinstance(kind, str) else None
        if image is not None and isinstance(part, dict):
            parts.append(image(part, i))
            continue
        field = fields.get(kind) if isinstance(kind, str) else None
        if field is None or not isinstance(part, dict) or not isinstance(part.get(field), str):
            raise ValueError(refused(i, kind))
        parts.append(part[field])
    return joined(parts)


def joined_text(
    value: Any, fields: Mapping[str, str], *, not_a_list: str, refused: Callable[[int, Any], str]
) -> str:
    """content_of for a field that holds text only: a string, or its text parts joined."""
    text = content_of(value, fields, not_a_list=not_a_list, refused=refused)
    return text if isinstance(text, str) else ""  # always a string: no image part is read here


def with_system(systems: list[str], turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ask.messages: the system texts (the request's own field first) as one system message, a blank
    line between them, before the turns."""
    return [{"role": "system", "content": "\n\n".join(systems)}, *turns] if systems else turns


def function_tool(
    name: str, description: str | None = None, parameters: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One of Ask.tools: a function the model may call, in OpenAI's shape (what the templates read)."""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


class NoTools(ValueError):
    """A tool_choice that needs a call of a tool, in a request that gives none."""


class NoSuchTool(ValueError):
    """A tool_choice naming a function that is none of the request's tools."""


def tool_choice(kind: str | None, name: str | None, tools: Iterable[str]) -> str | dict[str, Any] | None:
    """Ask.tool_choice, from what every API's tool_choice means: None or "auto" (the model decides),
    "none" (no call), "required" (a call of one of the tools), "function" (a call of `name`)."""
    if kind is None or kind in ("auto", "none"):
        return kind
    names = set(tools)
    if not names:
        raise NoTools(kind)
    if kind == "required":
        return "required"
    if name not in names:
        raise NoSuchTool(name)
    return {"type": "function", "function": {"name": name}}


def call_arguments(value: Any) -> Any:
    """A tool call's arguments as the templates read them: a JSON object's text parsed to a dict."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return parsed if isinstance(parsed, dict) else value
    if isinstance(value, dict):
        return value
    raise ValueError("arguments must be a JSON object or its text")


def past_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """A tool call an assistant made earlier in the conversation, as Ask.messages carries it."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
