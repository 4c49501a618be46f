"""The page's conversation API under /runner/v1/, over the store and the one backend: list, read,
rename, delete, export, a turn (streamed as JSON lines), stop, and the images the turns carried.

Every request is untrusted: ids are numbers, an image is named by its sha256 and looked for in
runner's own folder, nothing names a path. A state-changing request needs a JSON body
(Content-Type: application/json, which no cross-site form can send) and the key when one is set (the
app's ApiKey, as for every API). A failure is a 4xx in OpenAI's error shape, never a bare 500.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from runner.errors import ImageError
from runner.images import Image, ImageRef, load_image, parse_data_url
from runner.paths import data_dir
from runner.serve.backend import Ask, Backend, Generation
from runner.serve.shared.answers import EventStream, submit
from runner.serve.shared.body import read_json, resolve_model
from runner.serve.shared.http import ApiError, ErrorShape, Traffic, guarded, json_line, traffic
from runner.serve.webui.conversations import Conversations, as_json
from runner.serve.webui.protocol import Approval, Change, Settings, TurnBody
from runner.serve.webui.tools import ToolTurn
from runner.serve.webui.turns import Turn, ask_messages, keep_image, read_images
from runner.store import StoredConversation, StoredMessage
from runner.store.file import to_json, transcript

if TYPE_CHECKING:
    from runner.serve.webui.tools import PageTools

PREFIX = "/runner/v1"
IMAGE_FOLDERS = ("page-images", "tool-images")  # of runner's data folder: the page's, a tool's (chat)
SAMPLING = Settings.model_fields.keys() - {"max_tokens", "think"}  # SamplingConfig's, by its names


def _body(err: ApiError) -> dict[str, Any]:
    return {"error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}}


SHAPE = ErrorShape("runner", (PREFIX + "/",), _body, lambda err: json_line({"type": "error", **_body(err)}))


class Page:
    """The conversation API over one store and one backend; the turns in progress, by conversation."""

    def __init__(
        self, backend: Backend, store: Conversations, max_body: int, tools: PageTools | None = None
    ) -> None:
        self.backend = backend
        self.store = store
        self.max_body = max_body
        self.tools = tools  # runner serve --mcp: the page's turns may call them, each call asked first
        self.turns: dict[int, Turn] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- reading ---------------------------------------------------------------------------------

    async def listing(self, request: Request) -> Response:
        rows = await self.store.summaries()
        return JSONResponse(
            {
                "conversations": [
                    {
                        "id": s.id,
                        "title": s.title or s.first_words,
                        "model": s.model,
                        "turns": s.turns,
                        "updated": s.updated,
                        "active": s.id in self.turns,
                    }
                    for s in rows
                ]
            }
        )

    async def read(self, request: Request) -> Response:
        found = await self._conversation(request)
        data = to_json(found)
        data["messages"] = [as_json(m) for m in found.messages]
        data["title"] = found.title
        data["served_model"] = self._served(found.model)
        data["active"] = found.id in self.turns
        return JSONResponse(data)

    async def export(self, request: Request) -> Response:
        found = await self._conversation(request)
        kind = request.query_params.get("format", "md")
        if kind == "json":
            body, media, ext = json_line(to_json(found)) + "\n", "application/json", "json"
        elif kind in ("md", "markdown"):
            body, media, ext = transcript(found), "text/markdown; charset=utf-8", "md"
        else:
            raise ApiError(400, "format must be md or json", param="format")
        name = f"conversation-{found.id}.{ext}"
        return Response(
            body, media_type=media, headers={"Content-Disposition": f'attachment; filename="{name}"'}
        )

    async def image(self, request: Request) -> Response:
        sha = request.path_params["sha"]
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ApiError(404, "no such image", kind="not_found_error")
        for folder in IMAGE_FOLDERS:
            for found in (data_dir() / folder).glob(f"{sha}.*"):
                return FileResponse(found, headers={"Cache-Control": "private, max-age=31536000, immutable"})
        raise ApiError(404, "no such image", kind="not_found_error")

    # -- changing --------------------------------------------------------------------------------

    async def change(self, request: Request) -> Response:
        _json_only(request)
        change = Change.model_validate(await read_json(request, self.max_body))
        found = await self._conversation(request)
        given = change.model_fields_set
        model = self._reference(resolve_model(self.backend, change.model)) if change.model else None

        def write(store: Any) -> None:
            if "title" in given:
                store.set_title(found.id, (change.title or "").strip() or None)
            if "system" in given:
                store.set_system(found.id, change.system or None)
            if "settings" in given:
                store.set_settings(found.id, change.settings.stored() if change.settings else {})
            if model is not None:
                store.set_model(found.id, model)

        await self.store.call(write)
        return JSONResponse({"ok": True})

    async def delete(self, request: Request) -> Response:
        number = _number(request)
        turn = self.turns.get(number)
        if turn is not None:
            turn.stop()
        if not await self.store.call(lambda s: s.remove(number)):
            raise ApiError(404, f"no conversation {number}", kind="not_found_error")
        self._forget_always(number)
        return JSONResponse({"ok": True})

    async def _exists(self, number: int) -> bool:
        return await self.store.call(lambda s: s.load(number)) is not None

    def _forget_always(self, number: int) -> None:
        """The tools allowed "always" in conversation `number`: gone with it (the store may give its
        id to the next new conversation)."""
        if self.tools is not None:
            self.tools.always.pop(number, None)

    async def stop(self, request: Request) -> Response:
        _json_only(request)
        turn = self.turns.get(_number(request))
        if turn is not None:
            turn.stop()
        return JSONResponse({"stopped": turn is not None})

    async def approve(self, request: Request) -> Response:
        """The page's answer to the tool call waiting in a conversation's turn (its approval event)."""
        _json_only(request)
        number = _number(request)
        body = Approval.model_validate(await read_json(request, self.max_body))
        turn = self.turns.get(number)
        question = turn.question if isinstance(turn, ToolTurn) else None
        if question is None or question.id != body.id:
            raise ApiError(
                409, f"no tool call {body.id!r} waits for an answer in conversation {number}", param="id"
            )
        if not question.answer_with(body.decision):
            raise ApiError(409, f"tool call {body.id!r} was answered already", param="id")
        return JSONResponse({"ok": True})

    async def live(self, request: Request) -> Response:
        """The turn in progress on a conversation, followed from its first event (a page opened again)."""
        turn = self.turns.get(_number(request))
        if turn is None:
            return Response(status_code=204)
        return EventStream(_lines(turn), "application/x-ndjson")

    # -- a turn ----------------------------------------------------------------------------------

    async def turn(self, request: Request) -> Response:
        _json_only(request)
        body = TurnBody.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, body.model)
        info = self.backend.info(model)
        images = (
            await asyncio.to_thread(self._images, body.images, info.max_images, info.max_image_bytes)
            if body.images
            else []
        )
        if body.action != "regenerate" and not body.content.strip() and not images:
            raise ApiError(400, "content: an empty message", param="content")
        number = body.conversation
        if number is not None and not await self._exists(number):  # before any lock file is made
            raise ApiError(404, f"no conversation {number}", kind="not_found_error")
        if number is None:
            settings = (body.settings or Settings()).stored()
            reference = self._reference(model)
            number = await self.store.call(lambda s: s.new_conversation(reference, body.system, settings))
            self._forget_always(number)  # an id a deleted conversation had: its "always" is not this one's
        try:
            turn, user = await self._begin(number, body, model, images, body.conversation is None)
        except BaseException:
            if body.conversation is None:  # nothing of it was kept: no empty conversation left behind
                await self.store.call(lambda s: s.remove(number))
            raise
        turn.emit({"type": "start", "conversation": number, "model": model, "user": user})
        task = asyncio.get_running_loop().create_task(self._run(turn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return EventStream(_lines(turn, traffic(request)), "application/x-ndjson")

    async def _begin(
        self, number: int, body: TurnBody, model: str, images: list[tuple[ImageRef, Image]], new: bool
    ) -> tuple[Turn, dict[str, Any] | None]:
        """The conversation held, what the model is sent worked out, submitted; the Turn that keeps
        the question (written while the answer's first tokens come: the prompt is known to fit) and
        the answer."""
        held = await self.store.hold(number)
        try:
            found = (
                StoredConversation(number, "", body.system, 0, 0, [])
                if new
                else await self.store.load(number)
            )
            if found is None:
                raise ApiError(404, f"no conversation {number}", kind="not_found_error")
            if new:
                found.settings = (body.settings or Settings()).stored()
            keep, gone, user = _edited(found, body, images)
            pixels = await self._pixels(keep, model, images)
            first = (
                self.tools.settings.api_choice(0, [t["function"]["name"] for t in self.tools.defs()])
                if self.tools
                else None
            )
            generation = await submit(self.backend, self._ask(found, keep, model, pixels, first), "content")
        except BaseException:
            held.release()
            raise
        reference = self._reference(model)

        def asked(store: Any) -> int | None:
            return _apply(store, found, gone, user, reference)

        if self.tools is None:
            turn = Turn(number, generation, held, self.store, reference, asked)
        else:

            async def again(turns: Sequence[StoredMessage], choice: str | dict[str, Any]) -> Generation:
                return await submit(
                    self.backend, self._ask(found, list(turns), model, pixels, choice), "content"
                )

            turn = ToolTurn(
                number,
                generation,
                held,
                self.store,
                reference,
                asked,
                tools=self.tools,
                sent=keep,
                again=again,
            )
        return turn, as_json(user) if user is not None else None

    async def _pixels(
        self, turns: list[StoredMessage], model: str, fresh: list[tuple[ImageRef, Image]]
    ) -> dict[str, Image]:
        """The images the model is sent: the turn's, and the latest the earlier turns carried."""
        info = self.backend.info(model)
        pixels = {ref.sha256: image for ref, image in fresh}
        if info.max_images > 0:
            older = await asyncio.to_thread(
                read_images, turns, info.max_images - len(pixels), info.max_image_bytes
            )
            pixels = older | pixels
        return pixels

    def _ask(
        self,
        found: StoredConversation,
        turns: list[StoredMessage],
        model: str,
        pixels: dict[str, Image],
        choice: str | dict[str, Any] | None,
    ) -> Ask:
        """What the backend is asked: the conversation as it stands, its settings, and with --mcp the
        tools (`choice`: the step's tool_choice; None or "none": no tools)."""
        settings = found.settings
        think = settings.get("think")
        tools = self.tools.defs() if self.tools is not None and choice not in (None, "none") else []
        return Ask(
            model=model,
            messages=ask_messages(found, turns, pixels),
            sampling={k: settings[k] for k in SAMPLING if isinstance(settings.get(k), (int, float))},
            max_tokens=settings["max_tokens"] if isinstance(settings.get("max_tokens"), int) else None,
            think=think if isinstance(think, (bool, str)) else None,
            tools=tools or None,
            tool_choice=choice if tools else None,
            stream=True,
        )

    async def _run(self, turn: Turn) -> None:
        self.turns[turn.conversation] = turn
        try:
            await turn.run()
        finally:
            if self.turns.get(turn.conversation) is turn:
                del self.turns[turn.conversation]

    def _images(self, urls: list[str], at_most: int, max_bytes: int) -> list[tuple[ImageRef, Image]]:
        """A turn's images: decoded and checked (in a worker thread), kept as files named by digest."""
        if urls and at_most <= 0:
            raise ApiError(
                400, "images: this model takes no images (served without --mmproj)", param="images"
            )
        if len(urls) > at_most:
            raise ApiError(400, f"images: at most {at_most} a message", param="images")
        out = []
        for n, url in enumerate(urls):
            field = f"images[{n}]"
            try:
                data = parse_data_url(url, name=field, max_bytes=max_bytes)
                image = load_image(data, name=field, max_bytes=max_bytes)
            except ImageError as exc:
                raise ApiError(400, str(exc), param=field) from None
            try:
                out.append((keep_image(data_dir() / IMAGE_FOLDERS[0], data, image), image))
            except OSError as exc:
                raise ApiError(
                    507, f"{field}: cannot keep the image: {exc.strerror}", kind="server_error"
                ) from None
        return out

    # -- helpers ---------------------------------------------------------------------------------

    async def _conversation(self, request: Request) -> StoredConversation:
        number = _number(request)
        found = await self.store.load(number)
        if found is None:
            raise ApiError(404, f"no conversation {number}", kind="not_found_error")
        return found

    def _reference(self, name: str) -> str:
        """A served model as the store names it: what `runner run -c` opens again (the path or alias
        `runner serve` was given), as runner chat stores the model it loaded."""
        return self.backend.info(name).reference or name

    def _served(self, stored: str) -> str | None:
        """The served model a stored conversation continues with: its name, or the one served from it."""
        for name in self.backend.names():
            if stored in (name, self.backend.info(name).reference):
                return name
        return None


def _edited(
    found: StoredConversation, body: TurnBody, images: list[tuple[ImageRef, Image]]
) -> tuple[list[StoredMessage], list[StoredMessage], StoredMessage | None]:
    """What the turn sends, what it drops from the stored turns, the question it adds: a message sent
    after the others; regenerate drops what answered the last question (as chat's /retry); edit drops
    the last question and what answered it, and sends the edited one in its place."""
    turns = list(found.messages)
    last_user = max((i for i, m in enumerate(turns) if m.role == "user"), default=None)
    if body.action == "send":
        user = StoredMessage("user", body.content, images=tuple(ref for ref, _ in images))
        return [*turns, user], [], user
    if last_user is None:
        raise ApiError(400, f"action: {body.action}: there is no message of yours yet", param="action")
    if body.action == "regenerate":
        return turns[: last_user + 1], turns[last_user + 1 :], None
    kept = turns[last_user].images if not images else tuple(ref for ref, _ in images)
    user = StoredMessage("user", body.content, images=kept)
    return [*turns[:last_user], user], turns[last_user:], user


def _apply(
    store: Any, found: StoredConversation, gone: list[StoredMessage], user: StoredMessage | None, model: str
) -> int | None:
    """The question kept, what it replaces dropped, on the store's thread (each write its own
    transaction inside runner.interrupt.deferred())."""
    ids = [m.id for m in gone if m.id is not None]
    if ids:
        store.delete_messages(found.id, ids)
    if found.model and model != found.model:
        store.set_model(found.id, model)
    return store.add_message(found.id, user) if user is not None else None


async def _lines(turn: Turn, note: Traffic | None = None) -> AsyncGenerator[str, None]:
    """A turn's events, a JSON object a line; the access line says what its answer made. The pages
    following a turn are counted (a tool call's question goes unanswered when none is left)."""
    if isinstance(turn, ToolTurn):
        turn.followers += 1
    try:
        async for event in turn.follow():
            if event["type"] == "done" and note is not None:
                outcome = turn.generation.outcome
                note.prompt_tokens, note.completion_tokens = outcome.prompt_tokens, outcome.completion_tokens
                note.ttft_s, note.finish = outcome.ttft_s, outcome.finish_reason
            yield json_line(event) + "\n"
    finally:
        if isinstance(turn, ToolTurn):
            turn.followers -= 1


def _number(request: Request) -> int:
    text = request.path_params["id"]
    if not (text.isascii() and text.isdigit()) or len(text) > 18:  # "²".isdigit(), and int() refuses it
        raise ApiError(404, f"no conversation {text[:40]!r}", kind="not_found_error")
    return int(text)


def _json_only(request: Request) -> None:
    """A state-changing request carries JSON: no cross-site form can send it without a preflight."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise ApiError(415, "the body must be JSON (Content-Type: application/json)")


def routes(
    backend: Backend, store: Conversations, max_body: int, tools: PageTools | None = None
) -> list[Route]:
    page = Page(backend, store, max_body, tools)
    one = PREFIX + "/conversations/{id}"
    return [
        Route(PREFIX + "/conversations", guarded(page.listing, SHAPE), methods=["GET"]),
        Route(one, guarded(page.read, SHAPE), methods=["GET"]),
        Route(one, guarded(page.change, SHAPE), methods=["PATCH"]),
        Route(one, guarded(page.delete, SHAPE), methods=["DELETE"]),
        Route(one + "/export", guarded(page.export, SHAPE), methods=["GET"]),
        Route(one + "/stop", guarded(page.stop, SHAPE), methods=["POST"]),
        Route(one + "/live", guarded(page.live, SHAPE), methods=["GET"]),
        Route(one + "/approve", guarded(page.approve, SHAPE), methods=["POST"]),
        Route(PREFIX + "/turns", guarded(page.turn, SHAPE), methods=["POST"]),
        Route(PREFIX + "/images/{sha}", guarded(page.image, SHAPE), methods=["GET"]),
    ]
