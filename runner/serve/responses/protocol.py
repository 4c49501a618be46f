"""The Responses API's request, checked for shape and range (a 400 naming the field). Fields that
would change the answer but are not served are a 400 naming them (their off values accepted)."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator

from runner.serve.shared.fields import Loose, MaxTokens, MinP, Seed, Temperature, TopK, TopP

# `include` values that ask for parts of output items a local model never makes (hosted tools' results,
# encrypted reasoning: Codex asks for it with store false): accepted, with nothing to add
NOTHING_TO_INCLUDE = frozenset(
    {
        "reasoning.encrypted_content",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
        "message.input_image.image_url",
    }
)


class FunctionTool(Loose):
    type: Literal["function"]
    name: StrictStr = Field(min_length=1, max_length=256)
    description: Optional[StrictStr] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[StrictBool] = None


class TextFormat(Loose):
    type: Literal["text", "json_object", "json_schema"]
    name: Optional[StrictStr] = None
    description: Optional[StrictStr] = None
    schema_: Any = Field(default=None, alias="schema")
    strict: Optional[StrictBool] = None


class TextConfig(Loose):
    format: Optional[TextFormat] = None
    verbosity: Optional[StrictStr] = None  # accepted, without meaning here


class ReasoningConfig(Loose):
    effort: Optional[StrictStr] = None  # "none": the template's thinking off; any other: on
    summary: Optional[StrictStr] = None  # accepted: the reasoning comes whole, as reasoning_text


class ResponsesRequest(Loose):
    model: Optional[StrictStr] = None
    input: Any = None
    instructions: Optional[StrictStr] = None
    max_output_tokens: MaxTokens = None
    temperature: Temperature = None
    top_p: TopP = None
    top_k: TopK = None  # llama-server's extras, as on /v1/chat/completions
    min_p: MinP = None
    seed: Seed = None
    tools: Optional[list[Any]] = None
    tool_choice: Any = None
    parallel_tool_calls: Optional[StrictBool] = None
    text: Optional[TextConfig] = None
    reasoning: Optional[ReasoningConfig] = None
    stream: Optional[StrictBool] = None
    store: Optional[StrictBool] = None
    previous_response_id: Optional[StrictStr] = None
    metadata: Optional[dict[str, StrictStr]] = None
    user: Optional[StrictStr] = None
    # would change the answer, and are not served: a 400 when set (their off values accepted)
    background: Optional[StrictBool] = None
    include: Optional[list[Any]] = None
    truncation: Optional[Literal["auto", "disabled"]] = None  # auto: the oldest turns go (truncation.py)
    conversation: Any = None
    prompt: Any = None
    top_logprobs: Optional[StrictInt] = None
    max_tool_calls: Optional[StrictInt] = None
    context_management: Any = None

    @field_validator("include")
    @classmethod
    def _include(cls, value: list[Any] | None) -> list[Any] | None:
        for i, item in enumerate(value or ()):
            if not isinstance(item, str) or item not in NOTHING_TO_INCLUDE:  # logprobs, or not OpenAI's
                raise ValueError(f"[{i}]: {str(item)[:60]!r} is not supported")
        return value

    @field_validator(
        "background",
        "conversation",
        "prompt",
        "top_logprobs",
        "max_tool_calls",
        "context_management",
    )
    @classmethod
    def _unserved(cls, value: Any) -> Any:
        if value:
            shown = f" ({', '.join(map(str, value))[:100]})" if isinstance(value, list) else ""
            raise ValueError(f"not supported{shown}")
        return value
