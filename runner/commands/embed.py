"""`runner embed`: texts in, unit vectors out, one JSON line per text (runner.engine.embed pools them).

One text (the argument, piped stdin before it, as `runner run` reads a prompt), or with --each-line one
per stdin line, embedded in batches and written in input order as each batch is done. Plain: one JSON
array of floats per line. --jsonl: {"id", "embedding", "usage": {"prompt_tokens"}} per line, `id` the
line number as `runner run --jsonl` names it, or {"id", "error"} in its place. Bad input (an empty or
non-UTF-8 line, a text longer than the context without --truncate) exits 2: a single text at once;
under --each-line once the other lines are written (plain output keeps an empty line in its place).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, TextIO

from runner import interrupt, ui
from runner.commands.output import describe_model
from runner.engine.context import CTX_PAD, Interrupted
from runner.engine.embed import Embedder
from runner.engine.threads import Threads
from runner.errors import PromptTooLong, UsageError
from runner.loader import open_model
from runner.settings import DEFAULTS, LoadSettings


@dataclass(frozen=True)
class EmbedRequest:
    model: str
    text: str | None = None
    each_line: bool = False
    jsonl: bool = False
    truncate: bool = False
    settings: LoadSettings = DEFAULTS  # its ctx: the longest input in tokens (None: embed.EMBED_CTX)
    verbose: bool = False


@dataclass
class _Item:
    id: int  # the line number (1 for a single text)
    text: str = ""
    tokens: list[int] | None = None
    error: str | None = None


def embed_command(request: EmbedRequest, *, stdin: BinaryIO | None, out: TextIO) -> int:
    """Embed every text and write its vector; returns the exit code (0, or 2 when some line was bad)."""
    items = _read(request, stdin)
    loaded = open_model(request.model, replace(request.settings, chat_template=False, generates=False))
    try:
        loaded.engine.context.close()  # the generation context: never used here
        with interrupt.deferred(), Embedder(loaded.engine, request.settings.ctx, standalone=True) as embedder:
            if request.verbose:
                ui.info(
                    f"{describe_model(loaded)} · {embedder.pooling} pooling · {embedder.n_embd} dimensions · "
                    f"up to {embedder.n_ctx:,} tokens a text · threads {loaded.engine.context.threads.n}"
                )
            for item in items:
                _tokenize(embedder, item, request, loaded.engine.model.n_ctx_train)
            if not request.each_line and items[0].error is not None:
                raise PromptTooLong(items[0].error) if items[0].tokens else UsageError(items[0].error)
            start = time.perf_counter()
            written = _write(embedder, items, request, out)
            if request.verbose:
                ui.info(_summary(loaded.engine.context.threads, items, written, time.perf_counter() - start))
    finally:
        loaded.close()
    return 2 if any(item.error for item in items) else 0


def _summary(threads: Threads, items: list[_Item], written: int, took: float) -> str:
    """--verbose's last line: texts, tokens, the rate, the threads they ran on."""
    tokens = sum(len(item.tokens or ()) for item in items if item.error is None)
    changed = f", changed {threads.changes}x" if threads.changes else ""
    return (
        f"{ui.count(written, 'text')}, {ui.count(tokens, 'token')} in {took:.2f} s "
        f"({written / max(took, 1e-9):.1f} texts/s) · {ui.count(threads.used(), 'thread')}{changed}"
    )


def _read(request: EmbedRequest, stdin: BinaryIO | None) -> list[_Item]:
    """The texts: one (piped stdin, then the argument), or with --each-line one per stdin line."""
    if not request.each_line:
        return [_Item(1, _one_text(request.text, stdin))]
    if request.text is not None:
        raise UsageError("with --each-line the texts come from stdin, one a line: leave TEXT out")
    if stdin is None:
        raise UsageError(
            "--each-line reads texts from stdin: pipe them in (runner embed MODEL --each-line < f)"
        )
    items = []
    for n, line in enumerate(stdin.read().splitlines(), start=1):
        item = _Item(n)
        try:
            item.text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            item.error = f"line {n} is not UTF-8 text (byte {exc.start})"
        else:
            if not item.text.strip():
                item.error = f"line {n} is empty"
        items.append(item)
    if not items:
        raise UsageError("no texts: the input is empty")
    return items


def _one_text(argument: str | None, stdin: BinaryIO | None) -> str:
    """Piped text first, then the argument, as `runner run` joins a prompt. stdin: None on a terminal."""
    piped = ""
    if stdin is not None:
        data = stdin.read()
        try:
            piped = data.decode("utf-8").rstrip("\n")
        except UnicodeDecodeError as exc:
            raise UsageError(f"stdin is not UTF-8 text (byte {exc.start})") from exc
    if argument is None and stdin is None:
        raise UsageError("no text: give TEXT, or pipe text in (echo hi | runner embed MODEL)")
    text = "\n\n".join(part for part in (piped, argument or "") if part)
    if not text.strip():
        raise UsageError("the text is empty")
    return text


def _tokenize(embedder: Embedder, item: _Item, request: EmbedRequest, trained: int) -> None:
    """The item's tokens, or why it cannot be embedded as asked (too long without --truncate)."""
    if item.error is not None:
        return
    item.tokens = embedder.tokenize(item.text)
    n, limit = len(item.tokens), embedder.n_ctx
    where = f"line {item.id}: the text" if request.each_line else "the text"
    if not item.tokens:
        item.error = f"{where} has no tokens"
    elif n > limit and not request.truncate:
        suggest = -(-n // CTX_PAD) * CTX_PAD
        fix = f"--ctx {suggest} or --truncate" if not trained or suggest <= trained else "--truncate"
        item.error = f"{where} is {n:,} tokens, more than the {limit:,} an embedding takes here; use {fix}"


def _write(embedder: Embedder, items: list[_Item], request: EmbedRequest, out: TextIO) -> int:
    """Each item's line in input order, as its batch is done; the vectors written."""
    good = [item.tokens or [] for item in items if item.error is None]
    vectors = _vectors(embedder, good, request.truncate)
    written = 0
    for item in items:
        record: dict[str, Any]
        if item.error is not None:
            record = {"id": item.id, "error": item.error}
            if not request.jsonl:
                ui.error(item.error)
        else:
            vector = next(vectors, None)
            if vector is None:  # Ctrl-C: what was written stays; deferred() raises at its end
                break
            record = {"id": item.id, "embedding": vector, "usage": {"prompt_tokens": len(item.tokens or ())}}
            written += 1
        if request.jsonl:
            out.write(json.dumps(record) + "\n")
        else:
            out.write(json.dumps(record["embedding"]) + "\n" if "embedding" in record else "\n")
        out.flush()
    return written


def _vectors(embedder: Embedder, inputs: list[list[int]], truncate: bool) -> Iterator[list[float]]:
    """The vectors in order, one llama_decode at a time; they stop at a Ctrl-C."""
    try:
        for batch in embedder.stream(inputs, truncate=truncate):
            yield from batch
            if interrupt.requested():
                return
    except Interrupted:
        return
