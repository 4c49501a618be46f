"""The Responses API's input: its items checked, kept as the store keeps them, and turned into the
chat messages the templates read.

`instructions` and the system or developer messages before the first turn are merged into one system
message first; a `function_call` item is an assistant's tool call (joined to the assistant's turn it
follows), a `function_call_output` item a tool message, a `reasoning` item the next assistant turn's
reasoning_content (the template decides whether to show it). A user message's `input_image` parts
(a data URL or base64 in `image_url`) are kept with its text and decoded when the messages are made,
off the event loop (runner.serve.shared.images: a URL to fetch is refused there); a `file_id` image,
files and audio are a 400 naming them, as is any other item type.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, TypeVar, Union

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from runner.serve.shared.audio import input_audio
from runner.serve.shared.fields import Loose
from runner.serve.shared.http import ApiError, loc_param
from runner.serve.shared.images import ImageRef, Part
from runner.serve.shared.translate import (
    call_arguments,
    content_of,
    joined_text,
    past_call,
    shown,
    with_system,
)

M = TypeVar("M", bound=BaseModel)
UNSERVED_PARTS = ("input_file",)  # a 400 naming them: the models read text, images and audio
TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}  # part type -> its text
PARTS = "must be a string or a list of content parts"


def _text_of(value: Any) -> str:
    """A string, or a list of text parts (input_text, output_text, refusal) joined as llama-server joins
    them."""
    return joined_text(value, TEXT_PARTS, not_a_list=PARTS, refused=_refused)


def _refused(index: int, kind: Any) -> str:
    if kind == "input_image":
        return f"[{index}]: input_image parts go in user messages"
    if kind in UNSERVED_PARTS:
        return f"[{index}]: {kind} parts are not supported (the served models read text, images and audio)"
    return (
        f"[{index}]: only input_text, output_text, input_image and input_audio parts are served "
        f"(got {shown(kind, 60)})"
    )


def _image(part: dict[str, Any], index: int) -> ImageRef:
    """An input_image part: its `image_url` (a data URL or base64) to decode; by file_id, not served."""
    url = part.get("image_url")
    if not isinstance(url, str):
        why = "by file_id is not served" if part.get("file_id") is not None else "needs its image_url"
        raise ValueError(
            f'[{index}]: an input_image {why}: send it as "image_url": "data:image/png;base64,..."'
        )
    return ImageRef(f"content[{index}].image_url", url)


IMAGES = {"input_image": _image, "input_audio": input_audio}  # a clip: shared.audio


class MessageItem(Loose):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: Union[str, list[dict[str, Any]]]  # text; a user's with images: its parts, as kept
    _where: str = PrivateAttr(default="input")  # its field (input[2]): where its images are said to be

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any, info: ValidationInfo) -> str | list[dict[str, Any]]:
        """Text parts joined; a user's parts with images kept as they are (their served fields), read
        when the messages are made."""
        if info.data.get("role") != "user":
            return _text_of(value)
        content = content_of(value, TEXT_PARTS, not_a_list=PARTS, refused=_refused, images=IMAGES)
        return content if isinstance(content, str) else [_kept(part) for part in value]

    def parts(self) -> str | list[Part]:
        """Its content as Ask.messages carries it: text, or text and images (each named by its field)."""
        if isinstance(self.content, str):
            return self.content
        joined = content_of(self.content, TEXT_PARTS, not_a_list=PARTS, refused=_refused, images=IMAGES)
        if isinstance(joined, str):
            return joined
        return [p.under(self._where) if isinstance(p, ImageRef) else p for p in joined]


def _kept(part: dict[str, Any]) -> dict[str, Any]:
    """A part as the store keeps it: its type and the field that holds its text or image."""
    kind = part["type"]
    field = TEXT_PARTS.get(kind, "input_audio" if kind == "input_audio" else "image_url")
    return {"type": kind, field: part[field]}


class FunctionCallItem(Loose):
    type: Literal["function_call"]
    call_id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1, max_length=256)
    arguments: StrictStr  # the arguments' JSON text, as the model wrote it


class FunctionCallOutputItem(Loose):
    type: Literal["function_call_output"]
    call_id: StrictStr = Field(min_length=1)
    output: str

    @field_validator("output", mode="before")
    @classmethod
    def _output(cls, value: Any) -> str:
        return _text_of(value)


class ReasoningText(Loose):
    type: Optional[StrictStr] = None
    text: StrictStr


class ReasoningItem(Loose):
    type: Literal["reasoning"]
    summary: list[ReasoningText] = Field(default_factory=list)
    content: Optional[list[ReasoningText]] = None

    def text(self) -> str:
        return "\n".join(part.text for part in (self.content or self.summary))


Item = Union[MessageItem, FunctionCallItem, FunctionCallOutputItem, ReasoningItem]
ITEMS: dict[str, type[Item]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


def checked(model: type[M], value: Any, where: str) -> M:
    """model_validate, its first error named from `where` (a field path: "input[2]", "tools[0]")."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        param = f"{where}.{loc_param(first['loc'])}" if first["loc"] else where
        message = first["msg"].removeprefix("Value error, ")
        raise ApiError(400, f"{param}: {message}", param=param) from None


def input_items(value: Any, where: str = "input") -> list[Item]:
    """`input` as items: a string is one user message; an item's type is message when it has only a role."""
    if isinstance(value, str):
        return [MessageItem(role="user", content=value)]
    if not isinstance(value, list):
        raise ApiError(400, f"{where}: must be a string or a list of items", param=where)
    items: list[Item] = []
    for i, raw in enumerate(value):
        kind = raw.get("type", "message" if "role" in raw else None) if isinstance(raw, dict) else None
        model = ITEMS.get(kind) if isinstance(kind, str) else None
        if model is None:
            said = json.dumps(kind)[:60] if isinstance(kind, str) else "an item without a type"
            served = ", ".join(ITEMS)
            message = f"{where}[{i}].type: {said} items are not supported (served: {served})"
            raise ApiError(400, message, param=f"{where}[{i}].type")
        item = checked(model, raw, f"{where}[{i}]")
        if isinstance(item, MessageItem):
            item._where = f"{where}[{i}]"
        items.append(item)
    return items


def stored(items: list[Item]) -> list[dict[str, Any]]:
    """Items as the store keeps them: their served fields only, content as text."""
    return [item.model_dump(exclude_none=True) for item in items]


def chat_messages(instructions: str | None, items: list[Item]) -> list[dict[str, Any]]:
    """Ask.messages: the system texts before the first turn as one system message, then each item as
    the templates read it (consecutive calls one assistant turn, outputs tool messages)."""
    systems = [instructions] if instructions else []
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # call_id -> the function's name, for the tool message that answers it
    reasoning: str | None = None  # for the assistant turn that comes next
    for item in items:
        if isinstance(item, ReasoningItem):
            reasoning = item.text()
            continue
        if isinstance(item, FunctionCallItem):
            names[item.call_id] = item.name
            call = past_call(item.call_id, item.name, call_arguments(item.arguments))
            if out and out[-1]["role"] == "assistant" and reasoning is None:
                out[-1].setdefault("tool_calls", []).append(call)
                continue
            turn: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
        elif isinstance(item, FunctionCallOutputItem):
            name = {"name": names[item.call_id]} if item.call_id in names else {}
            turn = {"role": "tool", "tool_call_id": item.call_id, **name, "content": item.output}
        elif item.role in ("system", "developer"):
            text = item.content if isinstance(item.content, str) else ""  # text only (_content)
            if not out:
                systems.append(text)
                continue
            turn = {"role": "system", "content": text}
        else:
            turn = {"role": item.role, "content": item.parts()}
        if turn["role"] == "assistant" and reasoning:
            turn["reasoning_content"] = reasoning
        reasoning = None
        out.append(turn)
    return with_system(systems, out)
