"""The Ollama API's requests: /api/chat, /api/generate and the embeddings, checked for shape and range
(a 400 naming the field, said as Ollama says errors)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, Field, StrictBool, StrictInt, StrictStr, ValidationInfo, field_validator

from runner.engine.logprobs import MAX_TOP as TOP_LOGPROBS
from runner.errors import InvalidSetting
from runner.limits import parse_duration
from runner.serve.shared.embeddings import texts_of
from runner.serve.shared.fields import (
    CallFunction,
    Loose,
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

STOP_LIMIT = 16  # Ollama sets no bound; this one keeps the stop checks cheap


def _keep_alive(value: Any) -> float | None:
    """Seconds, or a duration such as "5m": how long the model stays loaded once idle (0: unload now;
    negative: for ever, -1.0). None: as it is."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError('must be a number of seconds or a duration such as "5m"')
    try:
        seconds = parse_duration(value, "keep_alive")
    except InvalidSetting as exc:
        raise ValueError(str(exc)) from None
    return -1.0 if seconds is None else seconds


KeepAlive = Annotated[Any, AfterValidator(_keep_alive)]


class Options(Loose):
    temperature: Temperature = None
    top_k: TopK = None
    top_p: TopP = None
    min_p: MinP = None
    seed: Seed = None
    stop: Any = None
    num_predict: Optional[StrictInt] = Field(default=None, ge=-2, le=2**31 - 1)
    repeat_penalty: RepeatPenalty = None
    presence_penalty: Penalty = None
    frequency_penalty: Penalty = None
    num_ctx: Optional[StrictInt] = Field(default=None, ge=1, le=2**31 - 1)

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: Any) -> tuple[str, ...]:
        return stops(value, STOP_LIMIT)

    @field_validator("num_predict")
    @classmethod
    def _num_predict(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("must be -1 (no limit) or at least 1")
        return None if value is None or value < 0 else value


def _images(value: Any) -> list[str]:
    """Ollama's `images`: base64 strings (or data URLs), decoded later, off the event loop
    (runner.serve.shared.images); a URL to fetch is refused there."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(image, str) for image in value):
        raise ValueError("must be a list of base64-encoded images")
    return value


Images = Annotated[Any, AfterValidator(_images)]


def _no_audio(value: Any) -> None:
    """`audio` / `audios`: no field of Ollama's API (it drops them); a WAV clip goes in `images`."""
    if value is not None:
        raise ValueError(
            "is no field of Ollama's API: a WAV clip goes in images (base64), as Ollama takes one"
        )


NoAudio = Annotated[Any, AfterValidator(_no_audio)]


class Base(Loose):
    """What /api/chat and /api/generate share."""

    model: Optional[StrictStr] = None
    stream: Optional[StrictBool] = None
    options: Optional[Options] = None
    format: Any = None
    think: Any = None
    keep_alive: KeepAlive = None
    logprobs: Optional[StrictBool] = None
    top_logprobs: Annotated[Optional[StrictInt], Field(ge=0, le=TOP_LOGPROBS)] = None

    @property
    def n_logprobs(self) -> int | None:
        """Ask.logprobs: as Ollama reads them, top_logprobs counts only with logprobs: true."""
        return (self.top_logprobs or 0) if self.logprobs else None

    images: Images = None
    audio: NoAudio = None
    audios: NoAudio = None

    @field_validator("format")
    @classmethod
    def _format(cls, value: Any) -> Any:
        if value in (None, "", "json") or isinstance(value, dict):
            return value
        raise ValueError('must be "json" or a JSON Schema object')

    @field_validator("think")
    @classmethod
    def _think(cls, value: Any) -> bool | str | None:
        if value is None or isinstance(value, bool) or value in ("low", "medium", "high"):
            return value  # a level: the template's own (gpt-oss), else a reasoning budget
        raise ValueError('must be true, false, "low", "medium" or "high"')


class ToolCall(Loose):
    function: CallFunction


class Message(Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[StrictStr] = None
    thinking: Optional[StrictStr] = None
    images: Images = None
    audio: NoAudio = None
    audios: NoAudio = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_name: Optional[StrictStr] = None


class ChatRequest(Base):
    messages: Optional[list[Message]] = None
    tools: Optional[list[ToolDef]] = None


class GenerateRequest(Base):
    prompt: Optional[StrictStr] = None
    system: Optional[StrictStr] = None
    raw: Optional[StrictBool] = None
    suffix: Optional[StrictStr] = None
    template: Optional[StrictStr] = None
    context: Optional[list[Any]] = None

    @field_validator("template", "context")
    @classmethod
    def _unserved(cls, value: Any, info: ValidationInfo) -> Any:
        if value:
            why = {"context": ": send the conversation to /api/chat", "template": ": the model's own is used"}
            raise ValueError("not supported" + why.get(info.field_name or "", ""))
        return value


class EmbedRequest(Loose):
    model: Optional[StrictStr] = None
    input: Any = Field(default=None, validate_default=True)
    truncate: Optional[StrictBool] = None  # Ollama's default: true
    dimensions: Optional[StrictInt] = Field(default=None, ge=1)
    options: Optional[dict[str, Any]] = None  # accepted: the served model's settings stay
    keep_alive: KeepAlive = None

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> list[str]:
        if value is None:
            raise ValueError("required")
        return [] if value == "" else texts_of(value)  # "" alone: Ollama's way to load the model


class EmbeddingsRequest(Loose):
    """/api/embeddings, Ollama's older endpoint: one `prompt`, one vector; "" only loads the model."""

    model: Optional[StrictStr] = None
    prompt: Optional[StrictStr] = None
    options: Optional[dict[str, Any]] = None  # accepted: the served model's settings stay
    keep_alive: KeepAlive = None
