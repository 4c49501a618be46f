"""The request fields the APIs have in common: a request object's base, the sampling fields with the
ranges SamplingConfig takes, stop strings, schemas, and OpenAI's tool definition (Ollama copied it)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, field_validator

from runner.serve.shared.http import ApiError
from runner.serve.shared.translate import call_arguments, function_tool

SEED_MAX = 2**32 - 2  # llama.cpp's seeds are uint32; 0xFFFFFFFF means "random"

# Sampling fields, the ranges SamplingConfig takes (a value outside is a 400 naming the field).
Temperature = Annotated[Optional[StrictFloat], Field(ge=0, le=2)]
TopP = Annotated[Optional[StrictFloat], Field(gt=0, le=1)]
TopK = Annotated[Optional[StrictInt], Field(ge=0, le=2**31 - 1)]
MinP = Annotated[Optional[StrictFloat], Field(ge=0, le=1)]
RepeatPenalty = Annotated[Optional[StrictFloat], Field(gt=0, le=10)]
Penalty = Annotated[Optional[StrictFloat], Field(ge=-2, le=2)]
Seed = Annotated[Optional[StrictInt], Field(ge=-(2**63), le=2**64 - 1)]
MaxTokens = Annotated[Optional[StrictInt], Field(ge=1, le=2**31 - 1)]


class Loose(BaseModel):
    """A request object: unknown fields ignored (clients send many), known ones checked for type."""

    model_config = ConfigDict(extra="ignore")


def sampling(**values: Any) -> dict[str, Any]:
    """Ask.sampling from the fields a request set: unset ones left to the model's defaults.

    A negative seed asks for a random one (llama-server's -1); a seed past uint32 is folded into it,
    so any int64 a client sends gives a repeatable answer.
    """
    out = {name: value for name, value in values.items() if value is not None}
    seed = out.pop("seed", None)
    if seed is not None and seed >= 0:
        out["seed"] = seed % (SEED_MAX + 1)
    return out


def stops(value: Any, limit: int) -> tuple[str, ...]:
    """`stop` as a string or a list of at most `limit` strings (empty ones dropped); ValueError else."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise ValueError("must be a string or a list of strings")
    if len(items) > limit:
        raise ValueError(f"at most {limit} stop strings are served (got {len(items)})")
    if any(len(s) > 1000 for s in items):
        raise ValueError("a stop string is over 1000 characters")
    return tuple(s for s in items if s)


def schema_of(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ApiError(400, f"{param} must be a JSON Schema object", param=param)
    return value


class FunctionDef(Loose):
    name: StrictStr = Field(min_length=1, max_length=256)
    description: Optional[StrictStr] = None
    parameters: Optional[dict[str, Any]] = None


class ToolDef(Loose):
    """A tool the model may call, in the shape OpenAI's chat and Ollama share (Ollama copied it)."""

    type: Literal["function"] = "function"
    function: FunctionDef


def tool_list(tools: list[ToolDef] | None) -> list[dict[str, Any]] | None:
    """Ask.tools from ToolDefs (None when there are none)."""
    fns = [tool.function for tool in tools or ()]
    return [function_tool(fn.name, fn.description, fn.parameters) for fn in fns] or None


class CallFunction(Loose):
    """A past tool call's function in an assistant's message, as OpenAI and Ollama send it."""

    name: StrictStr
    arguments: Any = None

    @field_validator("arguments")
    @classmethod
    def _arguments(cls, value: Any) -> Any:
        return call_arguments(value)
