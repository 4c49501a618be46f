"""The conversation API's request bodies, checked field by field (pydantic): anything else is a 400
naming the field. The settings are the ones `runner chat` stores with a conversation (its /set values,
by the same names), so a chat resumed in the terminal takes them as the page set them."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from runner.engine.text.sampling import SamplingConfig
from runner.errors import InvalidSetting

Number = Optional[Union[StrictInt, StrictFloat]]
TITLE_MAX = 200  # characters of a conversation's name
MAX_IMAGES = 16  # images a turn may carry at most (the model's own --max-images bounds it further)


class Settings(BaseModel):
    """The per-chat settings: sampling (ranges checked by the engine's SamplingConfig), max_tokens, think."""

    model_config = ConfigDict(extra="forbid")

    temperature: Number = None
    top_k: Optional[StrictInt] = None
    top_p: Number = None
    min_p: Number = None
    repeat_penalty: Number = None
    presence_penalty: Number = None
    frequency_penalty: Number = None
    seed: Optional[StrictInt] = None
    max_tokens: Optional[StrictInt] = Field(default=None, ge=1, le=1_000_000)
    think: Optional[Union[StrictBool, Literal["off", "low", "medium", "high"]]] = None

    @model_validator(mode="after")
    def _in_range(self) -> Settings:
        """Each sampling value in its range, as the engine checks it (a stored value out of range
        would stop `runner chat --resume`)."""
        sampling = {k: v for k, v in self.stored().items() if k not in ("max_tokens", "think")}
        try:
            SamplingConfig(**sampling)
        except InvalidSetting as exc:
            raise ValueError(str(exc)) from None
        return self

    def stored(self) -> dict[str, Any]:
        """As the store keeps them: the ones set."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class TurnBody(BaseModel):
    """POST /runner/v1/turns: a message sent, the last answer regenerated, or the last message edited
    and sent again. `conversation` none: a new one, with `system` and `settings`."""

    model_config = ConfigDict(extra="forbid")

    conversation: Optional[StrictInt] = Field(default=None, ge=1, le=10**18 - 1)  # as a path's id
    model: Optional[StrictStr] = None
    action: Literal["send", "regenerate", "edit"] = "send"
    content: StrictStr = ""
    images: list[StrictStr] = Field(default_factory=list, max_length=MAX_IMAGES)  # data URLs
    system: Optional[StrictStr] = None
    settings: Optional[Settings] = None


class Change(BaseModel):
    """PATCH /runner/v1/conversations/ID: its name, system message, settings or model."""

    model_config = ConfigDict(extra="forbid")

    title: Optional[StrictStr] = Field(default=None, max_length=TITLE_MAX)
    system: Optional[StrictStr] = None
    settings: Optional[Settings] = None
    model: Optional[StrictStr] = None


class Approval(BaseModel):
    """POST /runner/v1/conversations/ID/approve: the page's answer to the tool call waiting there
    (the `id` of its approval event): allow it, deny it, or always allow this tool in this chat."""

    model_config = ConfigDict(extra="forbid")

    id: StrictStr = Field(max_length=64)
    decision: Literal["allow", "deny", "always"]
