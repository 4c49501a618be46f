"""The summaries of chats that outgrew their context (runner.commands.compact), kept beside their turns.

A compaction stands for a conversation's messages up to one of them (`through`, a messages.id): the
model is sent its summary in their place, and they stay stored as they were (history shows them,
export has them). It is written in one transaction once whole, so an interrupt before that leaves
none; removing the messages it stands for (/undo far enough) removes it (Store.delete_messages).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from runner.store.conversations import Store


@dataclass(frozen=True)
class Compaction:
    """A conversation's first turns summarised by its model."""

    summary: str
    turns: int  # the messages it stands for: the conversation's first `turns`
    model: str | None = None  # the model that wrote it
    created: float = field(default_factory=time.time)
    stats: dict[str, Any] | None = None  # the summarising answers' figures (ttft_s, tokens, seconds)
    through: int | None = None  # the last of those messages, as stored (messages.id)


def save_compaction(store: Store, conversation: int, compaction: Compaction) -> None:
    """The summary of the messages up to `compaction.through`, in one transaction (the messages are
    not touched)."""
    with store._write("save a summary") as db:
        db.execute(
            "INSERT INTO compactions (conversation_id, through, summary, model, created, stats)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                conversation,
                compaction.through,
                compaction.summary,
                compaction.model,
                compaction.created,
                json.dumps(compaction.stats) if compaction.stats else None,
            ),
        )
        db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation))


def latest_compaction(store: Store, conversation: int) -> Compaction | None:
    """The conversation's latest summary, with the count of the messages it stands for (None: none)."""
    with store._errors("read"):
        row = store._db.execute(
            "SELECT k.summary, (SELECT COUNT(*) FROM messages m"
            " WHERE m.conversation_id = k.conversation_id AND m.id <= k.through),"
            " k.model, k.created, k.stats, k.through FROM compactions k"
            " WHERE k.conversation_id = ? ORDER BY k.id DESC LIMIT 1",
            (conversation,),
        ).fetchone()
    if row is None:
        return None
    summary, turns, model, created, stats, through = row
    return Compaction(summary, int(turns), model, created, json.loads(stats) if stats else None, through)
