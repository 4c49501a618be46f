"""`runner history`: what runner kept, in its one store: the conversations of `runner chat` and `runner
run -c`, and the responses `runner serve` kept for /v1/responses (each chain listed once, by its last
response's `resp_…` id, marked `serve`): list, show, rm, export."""

from __future__ import annotations

import json
from typing import Any, TextIO

from runner import ui
from runner.errors import UsageError
from runner.store import (
    ORIGIN_SERVE,
    Compaction,
    Store,
    StoredConversation,
    StoredResponse,
    StoreError,
    latest_compaction,
    saving_disabled,
)
from runner.store.file import iso_time, to_json, transcript

COLUMNS = ("ID", "FROM", "MODEL", "TURNS", "UPDATED", "FIRST WORDS")
RESPONSE_FORMAT = "runner-response"


def _open() -> Store:
    if saving_disabled():
        ui.warn("RUNNER_NO_SAVE is set: chats are not being kept; showing what was kept before")
    try:
        return Store.open()
    except StoreError as exc:
        raise StoreError(f"cannot read the conversations: {exc}") from None


def parse_id(text: str) -> int | str:
    """A conversation's number, or a served response's id ("resp_…"): what the listing's ID shows."""
    if text.isdigit():
        return int(text)
    if text.startswith("resp_") and len(text) <= 200:
        return text
    raise UsageError(
        f"{text!r} is neither a conversation number nor a response id (resp_…); runner history lists them"
    )


def list_conversations(*, out: TextIO, as_json: bool = False, limit: int | None = None) -> None:
    store = _open()
    try:
        rows = store.summaries(limit=limit) + store.response_summaries(limit=limit)
    finally:
        store.close()
    rows.sort(key=lambda s: s.updated, reverse=True)
    rows = rows[:limit] if limit else rows
    if as_json:
        items = [
            {
                "id": s.id,
                "origin": s.origin,
                "model": s.model,
                "turns": s.turns,
                "updated": iso_time(s.updated),
                "first_words": s.first_words,
            }
            for s in rows
        ]
        out.write(json.dumps(items, ensure_ascii=False, indent=2) + "\n")
        return
    if not rows:
        ui.info("no conversations yet; runner chat starts one")
        return
    table = [
        (str(s.id), s.origin, s.model, str(s.turns), ui.human_when(s.updated), s.first_words) for s in rows
    ]
    ui.table_to(out, COLUMNS, table, right={"ID", "TURNS"})


def _response(store: Store, response_id: str) -> StoredResponse:
    found = store.load_response(response_id)
    if found is None:
        raise UsageError(f"no response {response_id} (runner history lists them)")
    return found


def _conversation(store: Store, conversation: int) -> StoredConversation:
    found = store.load(conversation)
    if found is None:
        raise UsageError(f"no conversation {conversation} (runner history lists them)")
    return found


def show_conversation(conversation: int | str, *, out: TextIO, as_json: bool = False) -> None:
    store = _open()
    try:
        if isinstance(conversation, str):
            response = _response(store, conversation)
        else:
            found, summary = _conversation(store, conversation), latest_compaction(store, conversation)
    finally:
        store.close()
    if isinstance(conversation, str):
        text = json.dumps(_response_json(response), ensure_ascii=False, indent=2) + "\n" if as_json else None
        out.write(text or response_transcript(response))
    elif as_json:
        out.write(json.dumps(_json(found, summary), ensure_ascii=False, indent=2) + "\n")
    else:
        out.write(transcript(found, summary))


def remove_conversation(conversation: int | str) -> None:
    store = _open()
    try:
        if isinstance(conversation, str):
            removed = store.remove_response_chain(conversation)
            if not removed:
                raise UsageError(f"no response {conversation} (runner history lists them)")
        elif not store.remove(conversation):
            raise UsageError(f"no conversation {conversation} (runner history lists them)")
    finally:
        store.close()
    if isinstance(conversation, str):
        earlier = (
            f" and {ui.count(len(removed) - 1, 'earlier response')} of its chain" if len(removed) > 1 else ""
        )
        ui.info(f"removed response {conversation}{earlier}")
    else:
        ui.info(f"removed conversation {conversation}")


def export_conversations(*, out: TextIO, as_json: bool = False) -> None:
    store = _open()
    try:
        found = [store.load(s.id) for s in reversed(store.summaries()) if isinstance(s.id, int)]
        served = [store.load_response(str(s.id)) for s in reversed(store.response_summaries())]
        conversations = [(c, latest_compaction(store, c.id)) for c in found if c is not None]
    finally:
        store.close()
    responses = [r for r in served if r is not None]
    if as_json:
        kept = [_json(*c) for c in conversations] + [_response_json(r) for r in responses]
        out.write(json.dumps(kept, ensure_ascii=False, indent=2) + "\n")
    else:
        out.write(
            "\n".join([transcript(*c) for c in conversations] + [response_transcript(r) for r in responses])
        )


def _json(conversation: StoredConversation, summary: Compaction | None = None) -> dict[str, Any]:
    data = to_json(conversation, summary)
    data["created"], data["updated"] = iso_time(conversation.created), iso_time(conversation.updated)
    return data


def _response_json(response: StoredResponse) -> dict[str, Any]:
    """A kept response as the server keeps it: the response object (GET /v1/responses/{id}), the
    request's input items, and the whole conversation it ends."""
    return {
        "format": RESPONSE_FORMAT,
        "origin": ORIGIN_SERVE,
        "id": response.id,
        "model": response.model,
        "created": iso_time(response.created),
        "previous_response_id": response.previous_id,
        "response": response.response,
        "input": response.input,
        "conversation": response.conversation,
    }


def response_transcript(response: StoredResponse) -> str:
    """The conversation a kept response ends, as text: its messages, tool calls and their outputs."""
    when = iso_time(response.created)
    head = f"# response {response.id} · {response.model} · {when} · runner serve (/v1/responses)"
    lines = [head, ""]
    instructions = response.response.get("instructions")
    if isinstance(instructions, str) and instructions:
        lines += [f"instructions: {instructions}", ""]
    for item in response.conversation:
        kind = item.get("type", "message")
        if kind == "message":
            line = f"{item.get('role')}: {shown_content(item.get('content'))}"
        elif kind == "function_call":
            line = f"assistant (calls {item.get('name')}, {item.get('call_id')}): {item.get('arguments')}"
        elif kind == "function_call_output":
            line = f"tool ({item.get('call_id')}): {item.get('output')}"
        else:
            continue  # reasoning: in --json
        lines += [line, ""]
    return "\n".join(lines)


def shown_content(content: Any) -> str:
    """A kept message's content as the chat shows a turn: its text, each image as `[image …]` (its
    format and size, never its bytes), never a Python repr."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return "" if content is None else json.dumps(content, ensure_ascii=False)
    out = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        text = part.get("text", part.get("refusal")) if isinstance(part, dict) else None
        if isinstance(text, str):
            out.append(text)
        elif kind == "input_image":
            out.append(image_label(part.get("image_url")))
        else:  # a part this runner does not keep: named by its type, its contents left to --json
            out.append(f"[{kind if isinstance(kind, str) else 'part'}]")
    return " ".join(piece for piece in out if piece)


def image_label(url: Any) -> str:
    """`[image PNG, 12.3 KB]` for a served image (a data URL or bare base64): its media type and its
    decoded size, from the text alone (nothing decoded)."""
    if not isinstance(url, str):
        return "[image]"
    head, comma, payload = url.partition(",") if url.startswith("data:") else ("", ",", url)
    media = head[5:].split(";")[0].strip().lower()
    kind = f" {media.removeprefix('image/').upper()}" if media.startswith("image/") else ""
    if not comma:
        return f"[image{kind}]"
    data = "".join(payload.split())
    size = len(data) * 3 // 4 - (len(data) - len(data.rstrip("=")))
    return f"[image{kind}{',' if kind else ''} {ui.human_bytes(max(0, size))}]"
