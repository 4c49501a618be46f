"""`runner history`: the conversations runner chat kept: list, show, rm, export."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, TextIO

from runner import ui
from runner.errors import UsageError
from runner.store import Store, StoredConversation, StoreError, saving_disabled, to_json

COLUMNS = ("ID", "MODEL", "TURNS", "UPDATED", "FIRST WORDS")


def _open() -> Store:
    if saving_disabled():
        ui.warn("RUNNER_NO_SAVE is set: chats are not being kept; showing what was kept before")
    try:
        return Store.open()
    except StoreError as exc:
        raise StoreError(f"cannot read the conversations: {exc}") from None


def list_conversations(*, out: TextIO, as_json: bool = False, limit: int | None = None) -> None:
    store = _open()
    try:
        rows = store.summaries(limit=limit)
    finally:
        store.close()
    if as_json:
        items = [
            {
                "id": s.id,
                "model": s.model,
                "turns": s.turns,
                "updated": _iso(s.updated),
                "first_words": s.first_words,
            }
            for s in rows
        ]
        out.write(json.dumps(items, ensure_ascii=False, indent=2) + "\n")
        return
    if not rows:
        ui.info("no conversations yet; runner chat starts one")
        return
    table = [(str(s.id), s.model, str(s.turns), ui.human_when(s.updated), s.first_words) for s in rows]
    ui.table_to(out, COLUMNS, table, right={"ID", "TURNS"})


def _conversation(store: Store, conversation: int) -> StoredConversation:
    found = store.load(conversation)
    if found is None:
        raise UsageError(f"no conversation {conversation} (runner history lists them)")
    return found


def show_conversation(conversation: int, *, out: TextIO, as_json: bool = False) -> None:
    store = _open()
    try:
        found = _conversation(store, conversation)
    finally:
        store.close()
    if as_json:
        out.write(json.dumps(_json(found), ensure_ascii=False, indent=2) + "\n")
    else:
        out.write(transcript(found))


def remove_conversation(conversation: int) -> None:
    store = _open()
    try:
        if not store.remove(conversation):
            raise UsageError(f"no conversation {conversation} (runner history lists them)")
    finally:
        store.close()
    ui.info(f"removed conversation {conversation}")


def export_conversations(*, out: TextIO, as_json: bool = False) -> None:
    store = _open()
    try:
        found = [store.load(s.id) for s in reversed(store.summaries())]
    finally:
        store.close()
    conversations = [c for c in found if c is not None]
    if as_json:
        out.write(json.dumps([_json(c) for c in conversations], ensure_ascii=False, indent=2) + "\n")
    else:
        out.write("\n".join(transcript(c) for c in conversations))


def _json(conversation: StoredConversation) -> dict[str, Any]:
    data = to_json(conversation)
    data["created"], data["updated"] = _iso(conversation.created), _iso(conversation.updated)
    return data


def transcript(conversation: StoredConversation) -> str:
    """The conversation as text; where more than one model answered it, each answer names its own."""
    lines = [f"# conversation {conversation.id} · {conversation.model} · {_iso(conversation.updated)}", ""]
    if conversation.system:
        lines += [f"system: {conversation.system}", ""]
    models = {m.model or conversation.model for m in conversation.messages if m.role == "assistant"}
    named = len(models | {conversation.model}) > 1
    for m in conversation.messages:
        notes = [m.model or conversation.model] if named and m.role == "assistant" else []
        notes += ["interrupted"] if m.interrupted else []
        mark = f" ({', '.join(notes)})" if notes else ""
        lines += [f"{m.role}{mark}: {m.content}", ""]
    return "\n".join(lines)


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
