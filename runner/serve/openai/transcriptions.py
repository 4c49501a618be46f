"""POST /v1/audio/transcriptions: OpenAI's transcription API over a model with an audio projector, so
`openai.audio.transcriptions.create(...)` works unchanged.

The body is multipart (bounded as every body is): `file` (WAV, MP3, FLAC or Ogg Vorbis: runner.audio,
25 MB and 10 minutes at most), `model`, `language`, `prompt`, `temperature`, `max_tokens`,
`response_format` (json, text or verbose_json; srt and vtt are a 400: there are no timestamps) and
`stream` (Server-Sent Events: `transcript.text.delta` for each piece, then `transcript.text.done`).
The request becomes one chat turn as llama-server builds it (runner.commands.transcribe.asr_prompt:
the ASR prompt or the hint, the language, then the clip), through the same Ask and engine loop as a
chat completion.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator
from typing import Any

from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from runner.engine.text.reasoning import ANSWER
from runner.serve.backend import Ask, Backend
from runner.serve.openai import errors
from runner.serve.shared.answers import Drained, EventStream, collect, sse, streamed, submit
from runner.serve.shared.audio import clip_of
from runner.serve.shared.body import resolve_model, too_large
from runner.serve.shared.http import ApiError

ASR_PROMPT = "Transcribe audio to text"  # llama-server's common_chat_get_asr_prompt
FORMATS = ("json", "text", "verbose_json")
FIELDS = ("model", "language", "prompt", "temperature", "max_tokens", "response_format", "stream")


class Transcriptions:
    def __init__(self, backend: Backend, max_body: int) -> None:
        self.backend = backend
        self.max_body = max_body

    async def create(self, request: Request) -> Response:
        form = await _form(request, self.max_body)
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise ApiError(400, "file: required, the audio file as a multipart file part", param="file")
        fields = {name: _text(form, name) for name in FIELDS}
        model = resolve_model(self.backend, fields["model"])
        response_format = fields["response_format"] or "json"
        if response_format not in FORMATS:
            raise ApiError(
                400, f"response_format must be one of {', '.join(FORMATS)} (got {response_format[:20]!r})",
                param="response_format",
            )  # fmt: skip
        clip = await asyncio.to_thread(clip_of, await upload.read(), "file")
        ask = Ask(
            model=model,
            messages=[{"role": "user", "content": [_prompt(fields["prompt"], fields["language"]), clip]}],
            sampling={"temperature": _number(fields["temperature"], "temperature", 0.0, 2.0, 0.0)},
            max_tokens=_tokens(fields["max_tokens"]),
            stream=_flag(fields["stream"]),
        )
        generation = await submit(self.backend, ask, "file")
        if ask.stream:
            return EventStream(_events(request, generation), "text/event-stream")
        [outcome] = await collect(request, [generation])
        text = outcome.text.strip()
        if response_format == "text":
            return PlainTextResponse(text + "\n")
        usage = {
            "type": "tokens",
            "input_tokens": outcome.result.timings.prompt_tokens,
            "output_tokens": outcome.result.timings.completion_tokens,
            "total_tokens": outcome.result.timings.prompt_tokens + outcome.result.timings.completion_tokens,
        }
        if response_format == "verbose_json":
            body = {"task": "transcribe", "language": fields["language"] or "", "duration": clip.seconds}
            return JSONResponse({**body, "text": text, "segments": [], "usage": usage})
        return JSONResponse({"text": text, "usage": usage})


def _prompt(hint: str | None, language: str | None) -> str:
    """llama-server's text before the clip: the hint, or the ASR prompt, and the language asked."""
    text = hint or ASR_PROMPT
    return f"{text} (language: {language})" if language else text


async def _form(request: Request, max_body: int) -> FormData:
    """The multipart body, bounded (413 past max_body, by Content-Length then while reading)."""
    kind = request.headers.get("content-type", "")
    if not kind.startswith("multipart/form-data"):
        raise ApiError(400, "the body must be multipart/form-data (file, model, ...)")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body:
        raise ApiError(413, too_large(max_body, int(declared)), code="body_too_large")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                raise ApiError(413, too_large(max_body), code="body_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(400, "the client left before its body arrived") from None

    async def once() -> AsyncGenerator[bytes, None]:
        yield b"".join(chunks)
        yield b""

    parser = MultiPartParser(request.headers, once(), max_files=1, max_fields=len(FIELDS) + 4)
    try:
        return await parser.parse()
    except MultiPartException as exc:
        raise ApiError(400, f"the multipart body cannot be read: {exc.message}") from None


def _text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"{name}: a text field, not a file", param=name)
    return value


def _number(value: str | None, name: str, low: float, high: float, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise ApiError(400, f"{name} must be a number", param=name) from None
    if not math.isfinite(number) or not low <= number <= high:
        raise ApiError(400, f"{name} must be between {low:g} and {high:g}", param=name)
    return number


def _tokens(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if not value.isdigit() or not 1 <= int(value) <= 1 << 20:
        raise ApiError(400, "max_tokens must be a whole number from 1", param="max_tokens")
    return int(value)


def _flag(value: str | None) -> bool:
    if value is None or value.lower() in ("", "false", "0"):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise ApiError(400, "stream must be true or false", param="stream")


def _events(request: Request, generation: Any) -> AsyncGenerator[str, None]:
    """OpenAI's transcription stream: a transcript.text.delta event a piece, then transcript.text.done."""

    async def chunks(answers: list[Drained]) -> AsyncGenerator[str, None]:
        [answer] = answers
        text = []
        async for kind, piece in answer:
            if kind == ANSWER and piece:
                text.append(piece)
                yield sse({"type": "transcript.text.delta", "delta": piece})
        yield sse({"type": "transcript.text.done", "text": "".join(text).strip()})

    return streamed(request, [generation], chunks, errors.in_stream)
