"""The Responses API's request as the engine's Ask (its input items as chat messages: input.py), and the
fields of the response that echo the request (output.py builds the rest)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from runner.serve.backend import Ask
from runner.serve.responses.input import checked
from runner.serve.responses.protocol import FunctionTool, ResponsesRequest, TextFormat
from runner.serve.shared.fields import sampling, schema_of
from runner.serve.shared.http import ApiError
from runner.serve.shared.translate import NoSuchTool, NoTools, function_tool, new_id, tool_choice


def function_tools(
    value: list[Any] | None, skipped: Callable[[str], None] | None = None
) -> list[FunctionTool]:
    """The function tools. A tool of another type (web_search, file_search, code_interpreter, a
    namespace of tools: what Codex sends beside its functions) is one a local model cannot run: it is
    left out, `skipped` told why (if given), and the request answered with the others."""
    tools = []
    for i, raw in enumerate(value or ()):
        kind = raw.get("type") if isinstance(raw, dict) else None
        if not isinstance(kind, str):
            message = f"tools[{i}].type: a tool needs a type (function tools are served)"
            raise ApiError(400, message, param=f"tools[{i}].type")
        if kind != "function":
            name = raw.get("name") if isinstance(raw.get("name"), str) else None
            said = f"{json.dumps(kind)[:60]} tool" + (f" {json.dumps(name)[:60]}" if name else "")
            if skipped is not None:
                skipped(f"tools[{i}]: the {said} is left out: only function tools are served")
            continue
        tools.append(checked(FunctionTool, raw, f"tools[{i}]"))
    return tools


def tool_choice_of(value: Any, tools: list[FunctionTool]) -> str | dict[str, Any] | None:
    """Ask.tool_choice: "auto" | "none" | "required" | {"type": "function", "name"} naming a given tool."""
    kind, name = "unknown", None
    if value is None or value in ("auto", "none", "required"):
        kind = value
    elif isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        kind, name = "function", value["name"]
    try:
        if kind != "unknown":
            return tool_choice(kind, name, (tool.name for tool in tools))
    except (NoTools, NoSuchTool):
        pass
    message = 'tool_choice must be "auto", "none", "required" or {"type": "function", "name"}'
    raise ApiError(400, f"{message} naming one of the tools given", param="tool_choice")


def ask_of(
    req: ResponsesRequest, model: str, messages: list[dict[str, Any]], tools: list[FunctionTool]
) -> Ask:
    """The request as the engine's Ask, its input already turned into `messages`."""
    fmt = req.text.format if req.text else None
    json_schema = None
    if fmt is not None and fmt.type == "json_schema":
        json_schema = schema_of(fmt.schema_, "text.format.schema")
    effort = req.reasoning.effort if req.reasoning else None
    return Ask(
        model=model,
        messages=messages,
        sampling=sampling(
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            seed=req.seed,
        ),
        max_tokens=req.max_output_tokens,
        json_schema=json_schema,
        json_object=fmt is not None and fmt.type == "json_object",
        think=None if effort is None else effort_level(effort),
        tools=[function_tool(tool.name, tool.description, tool.parameters) for tool in tools] or None,
        tool_choice=tool_choice_of(req.tool_choice, tools),
    )


EFFORTS = {"none": "off", "minimal": "low", "low": "low", "medium": "medium", "high": "high"}


def effort_level(effort: str) -> str:
    """reasoning.effort as a think level (runner.engine.text.reasoning.think_settings); a 400 naming
    the field for any other value."""
    if effort not in EFFORTS:
        raise ApiError(400, f"reasoning.effort must be one of {', '.join(EFFORTS)}", param="reasoning.effort")
    return EFFORTS[effort]


def head_of(req: ResponsesRequest, model: str, tools: list[FunctionTool], keep: bool) -> dict[str, Any]:
    """The response's fields that echo the request, in OpenAI's order; status and the rest to come."""
    fmt = req.text.format if req.text and req.text.format else TextFormat(type="text")
    text: dict[str, Any] = {"format": fmt.model_dump(by_alias=True, exclude_none=True)}
    if req.text and req.text.verbosity:
        text["verbosity"] = req.text.verbosity
    return {
        "id": new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "completed_at": None,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": req.reasoning.model_dump(exclude_none=True) if req.reasoning else None,
        "store": keep,
        "temperature": req.temperature,
        "text": text,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": [tool.model_dump(exclude_none=True) for tool in tools],
        "top_p": req.top_p,
        "truncation": req.truncation or "disabled",
        "usage": None,
        "user": req.user,
        "metadata": req.metadata or {},
    }
