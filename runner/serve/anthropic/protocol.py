"""The Anthropic Messages API's requests, checked for shape and range (a 400 naming the field).

Content blocks: text, `image` (a user's: its base64 source decoded later, off the event loop; a URL
source is refused there, never fetched), `tool_use` (an assistant's), `tool_result` (a user's),
`thinking` (accepted, not shown back to the model); document blocks are refused by name.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator, model_validator

from runner.serve.shared.fields import Loose, TopK, TopP, stops
from runner.serve.shared.translate import joined_text

STOP_LIMIT = 16  # Anthropic sets no small bound; this one keeps the stop checks cheap
Temperature = Annotated[Optional[StrictFloat], Field(ge=0, le=1)]  # Anthropic's range, not OpenAI's 0-2
UNSERVED = ("document",)  # a 400 naming the block: the served models read text and images
TEXTS = 'must be a string or a list of {"type": "text", "text"} blocks'


def text_of(value: Any) -> str:
    """A string, or a list of {"type": "text", "text"} blocks joined by newlines (llama-server's join)."""
    return joined_text(value, {"text": "text"}, not_a_list=TEXTS, refused=lambda _, __: TEXTS)


class TextBlock(Loose):
    type: Literal["text"]
    text: StrictStr


class ImageBlock(Loose):
    type: Literal["image"]
    source: Any  # {"type": "base64", "media_type", "data"}: read by serving.image_ref


class ToolUseBlock(Loose):
    type: Literal["tool_use"]
    id: StrictStr
    name: StrictStr = Field(min_length=1, max_length=256)
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(Loose):
    type: Literal["tool_result"]
    tool_use_id: StrictStr
    content: Any = ""
    is_error: Optional[StrictBool] = None

    @field_validator("content")
    @classmethod
    def _content(cls, value: Any) -> str:
        """Its text; an image or a document the tool returned (Claude Code's Read of a picture or a
        PDF) is named in the text, not a 400 for the whole conversation: results reach the model as text."""
        if isinstance(value, list):
            value = [_said(block) if _kind(block) in RESULT_MEDIA else block for block in value]
        return "" if value is None else text_of(value)


RESULT_MEDIA = ("image", "document")


def _kind(block: Any) -> Any:
    return block.get("type") if isinstance(block, dict) else None


def _said(block: dict[str, Any]) -> dict[str, str]:
    return {"type": "text", "text": f"[the tool returned {block['type']} content, not shown to the model]"}


class ThinkingBlock(Loose):
    type: Literal["thinking", "redacted_thinking"]  # an assistant's past reasoning: not in the prompt


Block = Annotated[
    Union[TextBlock, ImageBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock], Field(discriminator="type")
]
WHERE = {ImageBlock: "user", ToolUseBlock: "assistant", ToolResultBlock: "user", ThinkingBlock: "assistant"}


class Message(Loose):
    role: Literal["user", "assistant", "system"]  # system: where newer clients put it
    content: list[Block]

    @field_validator("content", mode="before")
    @classmethod
    def _blocks(cls, value: Any) -> Any:
        """A string is one text block; document blocks are refused by name."""
        if isinstance(value, str):
            return [{"type": "text", "text": value}]
        if not isinstance(value, list):
            raise ValueError("must be a string or a list of content blocks")
        for i, block in enumerate(value):
            kind = block.get("type") if isinstance(block, dict) else None
            if isinstance(kind, str) and kind in UNSERVED:
                raise ValueError(
                    f"[{i}]: {kind} blocks are not supported (the served models read text and images)"
                )
        return value

    @model_validator(mode="after")
    def _roles(self) -> Message:
        for i, block in enumerate(self.content):
            if self.role == "system" and not isinstance(block, TextBlock):
                raise ValueError(f"content[{i}]: a system message holds text blocks only")
            if WHERE.get(type(block), self.role) != self.role:
                raise ValueError(f"content[{i}]: {block.type} blocks belong in {WHERE[type(block)]} messages")
        return self


class Tool(Loose):
    type: Optional[StrictStr] = None
    name: StrictStr = Field(min_length=1, max_length=256)
    description: Optional[StrictStr] = None
    input_schema: dict[str, Any]

    @field_validator("type")
    @classmethod
    def _type(cls, value: str | None) -> str | None:
        if value not in (None, "custom"):  # web_search_…, bash_…, text_editor_…: Anthropic's own tools
            raise ValueError(f"{json.dumps(value)[:60]} is not supported: only client tools are served")
        return value


class ToolChoice(Loose):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[StrictStr] = None
    disable_parallel_tool_use: Optional[StrictBool] = None  # accepted, not enforced


class Thinking(Loose):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]  # the last two: the model's default
    budget_tokens: Optional[StrictInt] = Field(default=None, ge=1)  # thinking tokens at most (enforced)


class OutputFormat(Loose):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Loose):
    format: Optional[OutputFormat] = None  # structured output, through the grammar sampler
    effort: Any = None  # accepted, without meaning here


class CountRequest(Loose):
    """What shapes the prompt: count_tokens reads only this, /v1/messages the same and more."""

    model: Optional[StrictStr] = None
    system: Any = None
    messages: list[Message] = Field(min_length=1)
    tools: Optional[list[Tool]] = None
    tool_choice: Optional[ToolChoice] = None
    thinking: Optional[Thinking] = None
    output_config: Optional[OutputConfig] = None

    @field_validator("system")
    @classmethod
    def _system(cls, value: Any) -> str | None:
        return None if value is None else text_of(value)


class MessagesRequest(CountRequest):
    max_tokens: StrictInt = Field(ge=1, le=2**31 - 1)  # required, as Anthropic requires it
    stop_sequences: Any = None
    temperature: Temperature = None
    top_p: TopP = None
    top_k: TopK = None
    metadata: Optional[dict[str, Any]] = None  # accepted, without meaning here
    stream: Optional[StrictBool] = None

    @field_validator("stop_sequences")
    @classmethod
    def _stop(cls, value: Any) -> tuple[str, ...]:
        return stops(value, STOP_LIMIT)
