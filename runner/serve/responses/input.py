"""The Responses API's input: its items checked, kept as the store keeps them, and turned into the
chat messages the templates read.

`instructions` and the system or developer messages before the first turn are merged into one system
message first; a `function_call` item is an assistant's tool call (joined to the assistant's turn it
follows), a `function_call_output` item a tool message, a `reasoning` item the next assistant turn's
reasoning_content (the template decides whether to show it). Images, files and audio are a 400 naming
them, as is any other item type.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, TypeVar, Union

from pydantic import BaseModel, Field, StrictStr, ValidationError, field_validator

from runner.serve.shared.fields import Loose
from runner.serve.shared.http import ApiError, loc_param
from runner.serve.shared.translate import call_arguments, joined_text, past_call, shown, with_system

M = TypeVar("M", bound=BaseModel)
UNSERVED_PARTS = ("input_image", "input_file", "input_audio")  # a 400 naming them: the models read text


def _text_of(value: Any) -> str:
    """A string, or a list of text parts (input_text, output_text, refusal) joined."""
    return joined_text(
        value,
        {"input_text": "text", "output_text": "text", "refusal": "refusal"},
        joiner="",
        not_a_list="must be a string or a list of content parts",
        refused=_refused,
    )


def _refused(index: int, kind: Any) -> str:
    if kind in UNSERVED_PARTS:
        return f"[{index}]: {kind} parts are not supported (the served models read text)"
    return f"[{index}]: only input_text and output_text parts are served (got {shown(kind, 60)})"


class MessageItem(Loose):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any) -> str:
        return _text_of(value)


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
        items.append(checked(model, raw, f"{where}[{i}]"))
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
            if not out:
                systems.append(item.content)
                continue
            turn = {"role": "system", "content": item.content}
        else:
            turn = {"role": item.role, "content": item.content}
        if turn["role"] == "assistant" and reasoning:
            turn["reasoning_content"] = reasoning
        reasoning = None
        out.append(turn)
    return with_system(systems, out)
