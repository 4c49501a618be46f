"""The Responses API's routes over one backend and the store, each failure said in OpenAI's shape
(errors.SHAPE).

Unless `store` is false, a response is kept with the conversation it ends (store.py), and
`previous_response_id` continues that conversation: the same messages, so a slot's KV cache is reused
as for any chat client.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runner import ui
from runner.serve.backend import Ask, Backend
from runner.serve.responses import serving
from runner.serve.responses.errors import SHAPE
from runner.serve.responses.input import Item, chat_messages, input_items, stored
from runner.serve.responses.output import events, finished, whole_output
from runner.serve.responses.protocol import ResponsesRequest
from runner.serve.responses.store import ResponseStore
from runner.serve.responses.truncation import submit_fitted
from runner.serve.shared.answers import EventStream, collect
from runner.serve.shared.body import read_json, resolve_model
from runner.serve.shared.http import ApiError, guarded, quoted
from runner.store import StoredResponse

SAID_AT_MOST = 32  # the distinct left-out tools said on stderr (a client's names: bounded)


class Responses:
    """The routes, over one backend and the store (None: nothing is kept)."""

    def __init__(self, backend: Backend, max_body: int, store: ResponseStore | None) -> None:
        self.backend = backend
        self.max_body = max_body
        self.store = store
        self.said: set[str] = set()  # the tools left out, each said once on stderr

    def _left_out(self, why: str) -> None:
        """Said once each, and a few dozen at most: the reasons carry a client's tool names."""
        if why not in self.said and len(self.said) < SAID_AT_MOST:
            self.said.add(why)
            ui.warn(f"/v1/responses: {why} (said once)")

    async def create(self, request: Request) -> Response:
        """Everything checked and the prompt submitted (too long is a 400) before anything streams or
        is kept: a refused request leaves nothing behind."""
        req = ResponsesRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        tools = serving.function_tools(req.tools, self._left_out)
        if req.input is None:
            raise ApiError(400, "input: Field required", param="input")
        items = input_items(req.input)
        earlier: list[Item] = []
        if req.previous_response_id is not None:
            previous = await self._load(req.previous_response_id, "previous_response_id")
            earlier = input_items(previous.conversation, "previous_response_id")

        def ask_for(kept: list[Item]) -> Ask:
            return serving.ask_of(req, model, chat_messages(req.instructions, kept), tools)

        auto = req.truncation == "auto"  # the oldest turns dropped until it fits (truncation.py)
        generation = await submit_fitted(self.backend, ask_for, earlier + items, auto=auto)
        keep = self.store is not None and req.store is not False
        head = serving.head_of(req, model, tools, keep)
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
        Route("/v1/responses", guarded(api.create, SHAPE), methods=["POST"]),
        Route("/v1/responses/{id}", guarded(api.retrieve, SHAPE), methods=["GET"]),
        Route("/v1/responses/{id}", guarded(api.delete, SHAPE), methods=["DELETE"]),
    ]
