"""The OpenAI API's requests: /v1/chat/completions and /v1/completions, checked for shape and range
(a 400 naming the field); what only the model knows (a prompt's length in tokens, a schema's grammar,
whether it takes images) is the backend's. A user's image_url parts are read (decoded) later, off the
event loop: runner.serve.shared.images."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import Field, StrictBool, StrictInt, StrictStr, ValidationInfo, field_validator, model_validator

from runner.serve.shared.audio import input_audio
from runner.serve.shared.fields import (
    CallFunction,
    Loose,
    MaxTokens,
    MinP,
    Penalty,
    RepeatPenalty,
    Seed,
    Temperature,
    ToolDef,
    TopK,
    TopP,
    stops,
)
from runner.serve.shared.http import ApiError
from runner.serve.shared.images import ImageRef, Part
from runner.serve.shared.translate import content_of, shown

N_MAX = 16  # answers to one request: each takes a sequence of its own, at most --parallel of them
STOP_LIMIT = 4  # OpenAI's own bound on `stop`: a request that works there works here
TOP_LOGPROBS = 20  # alternatives per token: OpenAI's bound (runner.engine.logprobs.MAX_TOP)
TopLogprobs = Annotated[Optional[StrictInt], Field(ge=0, le=TOP_LOGPROBS)]


class StreamOptions(Loose):
    include_usage: Optional[StrictBool] = None


class ResponseFormat(Loose):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Any = None
    # llama-server's {"type": "json_object", "schema": {...}}: a schema without the json_schema wrapper
    schema_: Any = Field(default=None, alias="schema")


class Knobs(Loose):
    """The fields chat and completions share: sampling, length, stop strings, output format."""

    model: Optional[StrictStr] = None
    stream: Optional[StrictBool] = None
    stream_options: Optional[StreamOptions] = None
    temperature: Temperature = None
    top_p: TopP = None
    top_k: TopK = None
    min_p: MinP = None
    repeat_penalty: RepeatPenalty = None
    presence_penalty: Penalty = None
    frequency_penalty: Penalty = None
    seed: Seed = None
    max_tokens: MaxTokens = None
    max_completion_tokens: MaxTokens = None
    stop: Any = None
    n: Optional[StrictInt] = None
    logit_bias: Optional[dict[str, Any]] = None
    response_format: Optional[ResponseFormat] = None

    @property
    def n_logprobs(self) -> int | None:
        """Ask.logprobs: None unless asked; else the alternatives to list with each token."""
        return None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: Any) -> tuple[str, ...]:
        return stops(value, STOP_LIMIT)

    @field_validator("n")
    @classmethod
    def _n(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= N_MAX:
            raise ValueError(f"must be between 1 and {N_MAX} (and at most the server's --parallel)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, Any] | None) -> None:
        if value:
            raise ValueError("not supported")
        return None


class ToolCall(Loose):
    id: Optional[StrictStr] = None
    type: Literal["function"] = "function"
    function: CallFunction


class ChatMessage(Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Any = Field(default=None, validate_default=True)
    name: Optional[StrictStr] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[StrictStr] = None
    reasoning_content: Optional[StrictStr] = None

    @field_validator("content")
    @classmethod
    def _content(cls, value: Any, info: ValidationInfo) -> str | list[Part]:
        """A string, or a list of text parts (and a user's image_url parts) joined as llama-server joins
        them; null only from the assistant (a tool call)."""
        if value is None:
            if info.data.get("role") in ("assistant", None):
                return ""
            raise ValueError("required (null only in an assistant's message)")
        user = info.data.get("role") == "user"
        return content_of(
            value,
            {"text": "text"},
            not_a_list="must be a string or a list of content parts",
            refused=lambda i, kind: _refused(i, kind, user),
            images={"image_url": _image_url, "input_audio": input_audio} if user else None,
        )


PARTS = (
    'only {"type": "text", "text"} and a user\'s {"type": "image_url", "image_url": {"url"}} and '
    '{"type": "input_audio", "input_audio": {"data", "format"}} parts are served'
)


def _refused(index: int, kind: Any, user: bool) -> str:
    if kind in ("image_url", "input_audio") and not user:
        return f"[{index}]: {kind} parts go in user messages"
    if kind in ("text", "image_url", "input_audio"):
        return f"[{index}]: a {kind} part needs its {kind} field"
    return f"[{index}]: {PARTS} (got {shown(kind, 40)})"


def _image_url(part: dict[str, Any], index: int) -> ImageRef:
    """{"type": "image_url", "image_url": {"url": "data:image/...;base64,..." or base64}}: the URL is
    read when the image is decoded (a URL to fetch is refused there, naming this field)."""
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else None
    if not isinstance(url, str):
        raise ValueError(f'[{index}].image_url must be {{"url": "data:image/png;base64,..."}}')
    return ImageRef(f"content[{index}].image_url.url", url)


class ChatRequest(Knobs):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: Optional[list[ToolDef]] = None
    tool_choice: Any = None
    logprobs: Optional[StrictBool] = None
    top_logprobs: TopLogprobs = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    reasoning_effort: Optional[StrictStr] = None  # OpenAI's: minimal|low|medium|high (none: off)
    reasoning_budget_tokens: Optional[StrictInt] = Field(default=None, ge=-1)  # llama-server's: -1 none

    @model_validator(mode="after")
    def _logprobs(self) -> ChatRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if self.logprobs and self.stream and self.tools and self.tool_choice != "none":
            raise ApiError(
                400,
                "logprobs with tools are served whole, not streamed (the answer may be a call)",
                param="logprobs",
            )
        return self

    @property
    def n_logprobs(self) -> int | None:
        """Ask.logprobs: None unless asked; the alternatives to list with each token."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(Knobs):
    prompt: Any
    echo: Optional[StrictBool] = None
    suffix: Optional[StrictStr] = None
    best_of: Optional[StrictInt] = None
    logprobs: TopLogprobs = None
    # 0 with echo: the prompt scored, nothing generated (evaluation harnesses' log-likelihood)
    max_tokens: Annotated[Optional[StrictInt], Field(ge=0, le=2**31 - 1)] = None

    @model_validator(mode="after")
    def _echo(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ApiError(400, "max_tokens must be at least 1 (0 only with echo)", param="max_tokens")
        if self.echo and self.stream:
            raise ApiError(400, "echo is served whole, not streamed", param="echo")
        if self.echo and (self.n or 1) > 1:
            raise ApiError(400, "echo is served with n=1", param="echo")
        if self.echo and self.suffix is not None:
            raise ApiError(400, "echo is not served with suffix (fill-in-the-middle)", param="echo")
        return self

    @property
    def n_logprobs(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: Any) -> str:
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if not isinstance(value, str):
            raise ValueError("must be a string (or a list of one string)")
        return value

    @field_validator("best_of")
    @classmethod
    def _unserved(cls, value: Any, info: ValidationInfo) -> Any:
        if value and value != 1:
            raise ValueError("not supported")
        return value
