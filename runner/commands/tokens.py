"""`runner tokens MODEL [TEXT]`: how many tokens a text (or, with --template, a whole chat) is for a
model, counted with its vocabulary alone (no weights loaded: runner.engine.vocab); the ids or each
token's piece after the count where asked."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, BinaryIO, TextIO

from runner.errors import UsageError


@dataclass(frozen=True)
class TokensRequest:
    model: str
    text: str | None  # None: stdin
    ids: bool = False  # --ids: the ids on a second line
    pieces: bool = False  # --pieces: a line per token, its id and its piece
    template: bool = False  # --template: the text is a chat, as JSON messages, rendered by the template
    offline: bool = False


def read_text(argument: str | None, stdin: BinaryIO | None) -> str:
    """TEXT, else stdin whole (nothing stripped: every byte is counted)."""
    if argument is not None:
        return argument
    if stdin is None:
        raise UsageError("no text: give TEXT, or pipe text in (cat file | runner tokens MODEL)")
    data = stdin.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"stdin is not UTF-8 text (byte {exc.start})") from None


def chat_of(text: str) -> tuple[list[Any], list[dict[str, Any]] | None]:
    """--template's text: a JSON list of messages, or an object with "messages" (and "tools")."""
    from runner.engine.text.template import Message

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--template takes JSON messages: {exc}") from None
    tools = None
    if isinstance(value, dict):
        tools = value.get("tools")
        value = value.get("messages")
    if not isinstance(value, list) or not value or not all(_is_message(m) for m in value):
        raise UsageError(
            '--template takes a JSON list of messages ([{"role": "user", "content": "Hi"}]), '
            'or {"messages": [...], "tools": [...]}'
        )
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise UsageError("--template: tools must be a list of objects")
    extra = [{k: v for k, v in m.items() if k not in ("role", "content")} or None for m in value]
    return [Message(m["role"], m.get("content") or "", x) for m, x in zip(value, extra, strict=True)], tools


def _is_message(m: Any) -> bool:
    return (
        isinstance(m, dict)
        and isinstance(m.get("role"), str)
        and isinstance(m.get("content", ""), (str, type(None)))
    )


def count_tokens(request: TokensRequest, *, stdin: BinaryIO | None, out: TextIO) -> int:
    """Print the count (then the ids or the pieces); returns the count."""
    from runner import interrupt
    from runner.engine.vocab import open_vocab, render_chat
    from runner.loader import locate_model

    text = read_text(request.text, stdin)
    chat = chat_of(text) if request.template else None
    _name, path, header = locate_model(request.model, request.offline)
    with interrupt.deferred():
        vocab = open_vocab(path)
        try:
            tokens = render_chat(vocab, header, *chat).tokens if chat is not None else vocab.tokenize(text)
            pieces = [vocab.token_bytes(t, special=True) for t in tokens] if request.pieces else []
        finally:
            vocab.close()
    out.write(f"{len(tokens)}\n")
    if request.pieces:
        for token, piece in zip(tokens, pieces, strict=True):
            out.write(f"{token}\t{json.dumps(piece.decode('utf-8', 'replace'), ensure_ascii=False)}\n")
    elif request.ids:
        out.write(" ".join(str(t) for t in tokens) + "\n")
    return len(tokens)
