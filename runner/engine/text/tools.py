"""Tool calls: the tools shown to a model whose template does not show them, a call forced by a
grammar (tool_choice "required" or a named function), and calls read back out of an answer.

Calls are read in the format the model's template speaks, by runner.engine.text.toolcalls' table
(Hermes/Qwen, Llama 3.x, Mistral, gpt-oss, Granite, Phi-4-mini, DeepSeek, Command R7B,
Functionary, Gemma's generic JSON ...); every format also reads what tools_as_system asks of a model,
one JSON object {"name", "arguments"}. A name not among the request's tools is no call.

The server's engine thread uses this beside the template (runner.serve.engine_backend); it sits in the
engine's bottom layer with template.py and imports nothing of it: a message here is any frozen
dataclass with `role` and `content` (template.Message), copied with dataclasses.replace.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

from runner.engine.text.constrain import Constraint, schema_shape
from runner.engine.text.schemawalk import subschemas
from runner.engine.text.toolcalls import GENERIC, functions, parse_calls

__all__ = ["call_shape", "forced_call_schema", "functions", "parse_tool_calls", "tools_as_system"]


def tools_as_system(messages: list[Any], tools: list[dict[str, Any]]) -> list[Any]:
    """The tools described in the system message, for a template that has no place for them: added to
    the system message there is, or a system message of its own before the first (a conversation of
    no messages has none to copy, and is left as it is)."""
    listed = "\n".join(json.dumps(fn, ensure_ascii=False) for fn in functions(tools).values())
    text = (
        "You can call these functions:\n"
        f"{listed}\n"
        'To call one, answer with only a JSON object: {"name": <function name>, "arguments": {...}}.'
    )
    if not messages:
        return messages
    first = messages[0]
    if first.role == "system":
        return [replace(first, content=f"{first.content}\n\n{text}"), *messages[1:]]
    return [replace(first, role="system", content=text, extra=None), *messages]


def forced_call_schema(tools: list[dict[str, Any]], choice: Any) -> dict[str, Any]:
    """A JSON Schema every answer matches that is a call of one of the tools (or the named one)."""
    fns = functions(tools)
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        fns = {name: fns[name]} if name in fns else {}
    options = []
    for i, (name, fn) in enumerate(fns.items()):
        params = fn.get("parameters")
        if not isinstance(params, dict) or not params:
            params = {"type": "object"}
        if params.get("type") == "object" and "additionalProperties" not in params:
            # as llama.cpp's grammar reads a tool's parameters: the properties named, no others (a
            # small model forced to call a tool of no parameters otherwise writes keys for ever)
            params = {**params, "additionalProperties": False}
        at = "/properties/arguments" if len(fns) == 1 else f"/oneOf/{i}/properties/arguments"
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": _rebased(params, at)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    return options[0] if len(options) == 1 else {"oneOf": options}


def _rebased(schema: dict[str, Any], at: str) -> dict[str, Any]:
    """A tool's parameters moved to `at` (a JSON pointer) inside the call's schema: each local $ref
    pointed there too. Pydantic's models refer to their own root ("#/$defs/Address"), which the call's
    schema would otherwise not have: instructor's nested models in TOOLS mode were refused."""
    out = copy.deepcopy(schema)
    for _, sub in subschemas(out):  # schemas only: a "$ref" inside enum, const or default is data
        ref = sub.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            sub["$ref"] = "#" + at + ref[1:]
    return out


def parse_tool_calls(
    text: str, tools: list[dict[str, Any]], fmt: str = GENERIC, *, whole_json: bool = False
) -> tuple[list[dict[str, Any]], str]:
    """The calls an answer makes ({"name", "arguments": dict}, "id" where the format has one) and the
    text around them, read in format `fmt` (Prompt.tool_format); `whole_json`: a forced call."""
    return parse_calls(text, tools, fmt, whole_json=whole_json)


def call_shape(tools: list[dict[str, Any]], choice: Any) -> Constraint:
    """tool_choice required (or a tool's name) as an answer's shape: a call of one of the tools."""
    return schema_shape(forced_call_schema(tools, choice))
