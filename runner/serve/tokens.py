"""Token utilities, as llama-server answers them: POST /tokenize, /detokenize, /apply-template, and
the Responses API's /v1/responses/input_tokens (Anthropic's /v1/messages/count_tokens is its own API's).

/tokenize, /detokenize and /apply-template need the vocabulary and the template only: each served
model's vocabulary is loaded once without its weights (llama.cpp's vocab_only) and kept, so they
answer for a model that is not loaded without loading it. Each runs off the event loop, one call at a
time per vocabulary. `model` picks a served model (none: the first), as every API's does.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runner.engine.text.fim import Infill
from runner.errors import NoInfill
from runner.serve.backend import Backend
from runner.serve.openai.errors import SHAPE as OPENAI
from runner.serve.responses.errors import SHAPE as RESPONSES
from runner.serve.shared.body import read_json, resolve_model
from runner.serve.shared.http import ApiError, guarded

if TYPE_CHECKING:
    from runner.engine.model import Model
    from runner.engine.request import Prompt
    from runner.gguf import GGUFHeader


@dataclass
class Vocab:
    """One served model's vocabulary (no weights) and header, and the lock its calls take turns on."""

    model: Model
    header: GGUFHeader
    lock: threading.Lock

    def render(self, messages: list[Any], tools: list[dict[str, Any]] | None) -> Prompt:
        """A chat as the served model's template renders and tokenizes it (runner.engine.prompt's own
        render_prompt, over the vocabulary alone: runner.engine.vocab)."""
        from runner.engine.text.template import Message
        from runner.engine.vocab import render_chat

        turns = [Message(str(m["role"]), _text(m.get("content")), _extra(m)) for m in messages]
        return render_chat(self.model, self.header, turns, tools)

    def infill(self, infill: Infill, n_ctx: int, name: str) -> list[int]:
        """A fill-in-the-middle prompt's tokens as the engine will evaluate them; a 400 naming the
        model where its GGUF has no FIM tokens."""
        from runner.engine.infill import infill_prompt

        try:
            return infill_prompt(self.model, infill, n_ctx, name).tokens
        except NoInfill as exc:
            raise ApiError(400, str(exc), param="model") from None

    def text(self, tokens: list[int]) -> str:
        """Tokens as text, special ones written out (llama-server's tokens_to_str)."""
        return b"".join(self.model.token_bytes(t, special=True) for t in tokens).decode("utf-8", "replace")


class Vocabularies:
    """Each served model's vocabulary, loaded on first use and kept while the server runs."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._held: dict[str, Vocab] = {}
        self._lock = threading.Lock()

    async def run(self, name: str, work: Any) -> Any:
        """work(vocab) in a worker thread for the served model `name`, one call at a time per vocabulary."""
        path = self.backend.info(name).path

        def call() -> Any:
            vocab = self._vocab(path)
            with vocab.lock:
                return work(vocab)

        return await asyncio.to_thread(call)

    def _vocab(self, path: str) -> Vocab:
        from runner.engine.vocab import open_vocab
        from runner.gguf import read_header

        with self._lock:
            if path not in self._held:
                model = open_vocab(path)
                self._held[path] = Vocab(model, read_header(path), threading.Lock())
            return self._held[path]

    def close(self) -> None:
        with self._lock:
            for vocab in self._held.values():
                vocab.model.close()
            self._held.clear()


# -- the pure parts: pieces as llama-server writes them ----------------------------------------------


def piece_json(data: bytes) -> str | list[int]:
    """A token's piece as /tokenize's with_pieces writes it: the text where it is valid UTF-8, else
    its bytes as numbers (a character split across tokens)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def mixed(value: Any, param: str) -> str | list[str | int]:
    """A prompt as llama-server takes one: text, or a list of text and token ids."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) or _token_id(v) for v in value):
        return value
    raise ApiError(400, f"{param} must be a string or a list of strings and token ids", param=param)


def in_vocab(content: str | list[str | int], n_vocab: int, param: str) -> None:
    """A 400 naming the first token id of a mixed prompt (mixed) that the vocabulary does not have:
    llama.cpp must never see one (its token_to_piece would throw across the C API)."""
    for i, token in enumerate(content if isinstance(content, list) else []):
        if not isinstance(token, str) and not 0 <= token < n_vocab:
            raise ApiError(
                400, f"{param}[{i}]: {token} is not a token of this model (0-{n_vocab - 1})", param=param
            )


def token_ids(value: Any, n_vocab: int, param: str) -> list[int]:
    """A list of token ids, each one the vocabulary has (a 400 naming the first that is not)."""
    if not isinstance(value, list) or not all(_token_id(v) for v in value):
        raise ApiError(400, f"{param} must be a list of token ids", param=param)
    for i, token in enumerate(value):
        if not 0 <= token < n_vocab:
            raise ApiError(
                400, f"{param}[{i}]: {token} is not a token of this model (0-{n_vocab - 1})", param=param
            )
    return list(value)


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(content: Any) -> str:
    """A message's content as text (a list of parts: their text joined, as the chat endpoints do)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, str) for p in content):
        return "".join(content)
    raise ApiError(400, "messages: only text is rendered here (no images)", param="messages")


def _extra(message: dict[str, Any]) -> dict[str, Any] | None:
    extra = {k: v for k, v in message.items() if k not in ("role", "content") and v is not None}
    return extra or None


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false", param=name)
    return value


# -- the routes --------------------------------------------------------------------------------------


class Tokens:
    """The routes, over one backend and the vocabularies."""

    def __init__(self, backend: Backend, max_body: int, vocabularies: Vocabularies) -> None:
        self.backend = backend
        self.max_body = max_body
        self.vocabularies = vocabularies

    async def tokenize(self, request: Request) -> Response:
        body = await read_json(request, self.max_body)
        name = resolve_model(self.backend, body.get("model"))
        add_special = _flag(body, "add_special", False)
        parse_special = _flag(body, "parse_special", True)
        with_pieces = _flag(body, "with_pieces", False)
        if "content" not in body:
            return JSONResponse({"tokens": []})
        content = mixed(body["content"], "content")

        def work(vocab: Vocab) -> list[Any]:
            in_vocab(content, vocab.model.n_vocab, "content")
            tokens = _tokenize(vocab.model, content, add_special, parse_special)
            if not with_pieces:
                return list(tokens)
            return [{"id": t, "piece": piece_json(vocab.model.token_bytes(t, special=True))} for t in tokens]

        return JSONResponse({"tokens": await self.vocabularies.run(name, work)})

    async def detokenize(self, request: Request) -> Response:
        body = await read_json(request, self.max_body)
        name = resolve_model(self.backend, body.get("model"))

        def work(vocab: Vocab) -> str:
            if "tokens" not in body:
                return ""
            tokens = token_ids(body["tokens"], vocab.model.n_vocab, "tokens")
            return vocab.text(tokens)

        return JSONResponse({"content": await self.vocabularies.run(name, work)})

    async def apply_template(self, request: Request) -> Response:
        body = await read_json(request, self.max_body)
        name = resolve_model(self.backend, body.get("model"))
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", param="messages")
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise ApiError(400, "messages: each must be an object with a role", param="messages")
        tools = body.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise ApiError(400, "tools must be a list of objects", param="tools")
        prompt = await self.vocabularies.run(name, lambda vocab: vocab.render(messages, tools or None))
        return JSONResponse({"prompt": prompt.text})

    async def input_tokens(self, request: Request) -> Response:
        """The Responses API's count: the prompt /v1/responses would evaluate, in tokens."""
        from runner.serve.responses import serving
        from runner.serve.responses.input import chat_messages, input_items
        from runner.serve.responses.protocol import ResponsesRequest
        from runner.serve.shared.images import with_pixels

        req = ResponsesRequest.model_validate(await read_json(request, self.max_body))
        model = resolve_model(self.backend, req.model)
        tools = serving.function_tools(req.tools)
        if req.input is None:
            raise ApiError(400, "input: Field required", param="input")
        ask = serving.ask_of(req, model, chat_messages(req.instructions, input_items(req.input)), tools)
        ask = await with_pixels(self.backend, ask)
        counted = await self.backend.count_tokens(ask)
        return JSONResponse({"object": "response.input_tokens", "input_tokens": counted})


def _tokenize(
    model: Model, content: str | list[str | int], add_special: bool, parse_special: bool
) -> list[int]:
    """llama-server's tokenize_mixed: BOS (when asked) only before a first part that is text."""
    if isinstance(content, str):
        return model.tokenize(content, add_special=add_special, parse_special=parse_special)
    tokens: list[int] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            first = add_special and i == 0
            tokens += model.tokenize(part, add_special=first, parse_special=parse_special)
        else:
            tokens.append(part)
    return tokens


def routes(backend: Backend, max_body: int, vocabularies: Vocabularies) -> list[Route]:
    api = Tokens(backend, max_body, vocabularies)
    return [
        Route("/tokenize", guarded(api.tokenize, OPENAI), methods=["POST"]),
        Route("/detokenize", guarded(api.detokenize, OPENAI), methods=["POST"]),
        Route("/apply-template", guarded(api.apply_template, OPENAI), methods=["POST"]),
        Route("/v1/responses/input_tokens", guarded(api.input_tokens, RESPONSES), methods=["POST"]),
    ]
