"""The OpenAI Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}, translated to and
from an Ask, so that `client.responses.create(...)` and the agents built on it work against runner.

The request's input items become chat messages in responses_input, its answer the response object
and stream events in responses_output. Unless `store` is false, a response is kept with the conversation
it ends (responses_store), and `previous_response_id` continues that conversation: the same messages,
so a slot's KV cache is reused as for any chat client. Fields that would change the answer but are not
served are a 400 naming them.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal, Optional

from pydantic import Field, StrictBool, StrictInt, StrictStr, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runner.serve.backend import Ask, Backend
from runner.serve.common import (
    ApiError,
    EventStream,
    Loose,
    MaxTokens,
    MinP,
    Seed,
    Temperature,
    TopK,
    TopP,
    collect,
    quoted,
    read_json,
    resolve_model,
    sampling,
    schema_of,
    submit,
)
from runner.serve.responses_input import Item, chat_messages, checked, input_items, stored
from runner.serve.responses_output import events, finished, new_id, whole_output
from runner.serve.responses_store import ResponseStore
from runner.store import StoredResponse


class FunctionTool(Loose):
    type: Literal["function"]
    name: StrictStr = Field(min_length=1, max_length=256)
    description: Optional[StrictStr] = None
    parameters: Optional[dict[str, Any]] = None
    strict: Optional[StrictBool] = None


def function_tools(value: list[Any] | None) -> list[FunctionTool]:
    """The tools, each a function: web_search, file_search, code_interpreter … are a 400 naming them."""
    tools = []
    for i, raw in enumerate(value or ()):
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind != "function":
            shown = json.dumps(kind)[:60] if isinstance(kind, str) else "a tool without a type"
            message = f"tools[{i}].type: {shown} is not supported: only function tools are served"
            raise ApiError(400, message, param=f"tools[{i}].type")
        tools.append(checked(FunctionTool, raw, f"tools[{i}]"))
    return tools


def tool_choice_of(value: Any, tools: list[FunctionTool]) -> str | dict[str, Any] | None:
    """Ask.tool_choice: "auto" | "none" | "required" | {"type": "function", "name"} naming a given tool."""
    names = {tool.name for tool in tools}
    if value is None or value in ("auto", "none"):
        return value
    if value == "required" and names:
        return "required"
    if isinstance(value, dict) and value.get("type") == "function" and value.get("name") in names:
        return {"type": "function", "function": {"name": value["name"]}}
    message = 'tool_choice must be "auto", "none", "required" or {"type": "function", "name"}'
    raise ApiError(400, f"{message} naming one of the tools given", param="tool_choice")


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
    truncation: Optional[Literal["auto", "disabled"]] = None
    conversation: Any = None
    prompt: Any = None
    top_logprobs: Optional[StrictInt] = None
    max_tool_calls: Optional[StrictInt] = None
    context_management: Any = None

    @field_validator(
        "background",
        "include",
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

    @field_validator("truncation")
    @classmethod
    def _truncation(cls, value: str | None) -> str | None:
        if value == "auto":
            raise ValueError('"auto" is not supported: a prompt is never truncated (too long is a 400)')
        return value

    def ask(self, model: str, messages: list[dict[str, Any]], tools: list[FunctionTool]) -> Ask:
        fmt = self.text.format if self.text else None
        json_schema = None
        if fmt is not None and fmt.type == "json_schema":
            json_schema = schema_of(fmt.schema_, "text.format.schema")
        functions = [tool.model_dump(exclude_none=True, exclude={"type", "strict"}) for tool in tools]
        effort = self.reasoning.effort if self.reasoning else None
        return Ask(
            model=model,
            messages=messages,
            sampling=sampling(
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                min_p=self.min_p,
                seed=self.seed,
            ),
            max_tokens=self.max_output_tokens,
            json_schema=json_schema,
            json_object=fmt is not None and fmt.type == "json_object",
            think=None if effort is None else effort != "none",
            tools=[{"type": "function", "function": f} for f in functions] or None,
            tool_choice=tool_choice_of(self.tool_choice, tools),
        )

    def head(self, model: str, tools: list[FunctionTool], keep: bool) -> dict[str, Any]:
        """The response's fields that echo the request, in OpenAI's order; status and the rest to come."""
        fmt = self.text.format if self.text and self.text.format else TextFormat(type="text")
        text: dict[str, Any] = {"format": fmt.model_dump(by_alias=True, exclude_none=True)}
        if self.text and self.text.verbosity:
            text["verbosity"] = self.text.verbosity
        return {
            "id": new_id("resp_"),
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "completed_at": None,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": model,
            "output": [],
            "parallel_tool_calls": self.parallel_tool_calls is not False,
            "previous_response_id": self.previous_response_id,
            "reasoning": self.reasoning.model_dump(exclude_none=True) if self.reasoning else None,
            "store": keep,
            "temperature": self.temperature,
            "text": text,
            "tool_choice": self.tool_choice if self.tool_choice is not None else "auto",
            "tools": [tool.model_dump(exclude_none=True) for tool in tools],
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": None,
            "user": self.user,
            "metadata": self.metadata or {},
        }


# -- routes ---------------------------------------------------------------------------------


class Responses:
    """The routes, over one backend and the store (None: nothing is kept)."""

    def __init__(self, backend: Backend, max_body: int, store: ResponseStore | None) -> None:
        self.backend = backend
        self.max_body = max_body
        self.store = store

    async def create(self, request: Request) -> Response:
        """Everything checked and the prompt submitted (too long is a 400) before anything streams or
        is kept: a refused request leaves nothing behind."""
        req = ResponsesRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        tools = function_tools(req.tools)
        if req.input is None:
            raise ApiError(400, "input: Field required", param="input")
        items = input_items(req.input)
        earlier: list[Item] = []
        if req.previous_response_id is not None:
            previous = await self._load(req.previous_response_id, "previous_response_id")
            earlier = input_items(previous.conversation, "previous_response_id")
        ask = req.ask(model, chat_messages(req.instructions, earlier + items), tools)
        generation = await submit(self.backend, ask, "input")
        keep = self.store is not None and req.store is not False
        head = req.head(model, tools, keep)
        one_call = req.parallel_tool_calls is False

        async def kept(response: dict[str, Any]) -> None:  # once the answer is out, before its end is sent
            if keep:
                await self._keep(response, req.previous_response_id, earlier, items)

        if req.stream:
            return EventStream(
                events(request, generation, head, kept, one_call=one_call), "text/event-stream"
            )
        (outcome,) = await collect(request, [generation])
        response = finished(head, outcome, whole_output(outcome, one_call=one_call))
        await kept(response)
        return JSONResponse(response)

    async def _keep(
        self, response: dict[str, Any], previous: str | None, earlier: list[Item], items: list[Item]
    ) -> None:
        """A response, with its input items and the whole conversation it ends (its output last)."""
        if self.store is None:
            return
        conversation = stored(earlier + items + input_items(response["output"], "output"))
        created = float(response["created_at"])
        row = StoredResponse(
            response["id"], response["model"], created, previous, response, stored(items), conversation
        )
        await self.store.save(row)

    async def retrieve(self, request: Request) -> Response:
        if request.query_params.get("stream", "false").lower() not in ("false", "0"):
            raise ApiError(
                400, "stream: replaying a stored response as events is not supported", param="stream"
            )
        return JSONResponse((await self._load(request.path_params["id"])).response)

    async def delete(self, request: Request) -> Response:
        response_id = request.path_params["id"]
        if self.store is None or len(response_id) > 200 or not await self.store.remove(response_id):
            raise self._missing(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    async def _load(self, response_id: str, param: str | None = None) -> StoredResponse:
        found = None
        if self.store is not None and len(response_id) <= 200:
            found = await self.store.load(response_id)
        if found is None:
            raise self._missing(response_id, param)
        return found

    def _missing(self, response_id: str, param: str | None = None) -> ApiError:
        why = "" if self.store is not None else " (this server keeps none: RUNNER_NO_SAVE, or no store)"
        message = f"no response {quoted(response_id)} is stored here{why}"
        return ApiError(404, message, param=param, kind="not_found_error")


def routes(backend: Backend, max_body: int, store: ResponseStore | None) -> list[Route]:
    api = Responses(backend, max_body, store)
    return [
        Route("/v1/responses", api.create, methods=["POST"]),
        Route("/v1/responses/{id}", api.retrieve, methods=["GET"]),
        Route("/v1/responses/{id}", api.delete, methods=["DELETE"]),
    ]
