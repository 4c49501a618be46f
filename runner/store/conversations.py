"""Conversations, kept as they happen in SQLite (stdlib sqlite3, WAL) in runner's data directory; and
the responses `runner serve` answers on /v1/responses, kept so that a later request can continue them.

A user message is committed before its answer is generated, the answer when it ends (or what came of
it, marked interrupted): a `kill -9` mid-answer loses at most that answer's unfinished text, and WAL
keeps the file consistent. Writes happen only at those points, inside runner.interrupt.deferred(), so a
Ctrl-C never lands in the middle of one. Runners continuing one conversation at once take turns
(runner.commands.session holds it from a question to its answer), so questions and answers alternate.

The schema grows by migrations, small named functions applied in order (as simonw/llm does);
PRAGMA user_version counts those applied. A database from a newer runner (a higher user_version) is
refused, never rewritten.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner import interrupt
from runner.errors import RunnerError
from runner.images import ImageRef
from runner.paths import data_dir
from runner.store.migrations import MIGRATIONS

DB_NAME = "conversations.db"
NO_SAVE_ENV = "RUNNER_NO_SAVE"  # set to 1: nothing is stored, as --no-save


class StoreError(RunnerError):
    """The conversation database cannot be opened or written (corrupt, unwritable, from a newer runner)."""


def tool_step(data: Any) -> dict[str, Any]:
    """A message's tool fields (StoredMessage.tool_fields) read back, whatever a file or a row holds:
    calls that are objects with a name and object arguments, ids and names that are text."""
    if not isinstance(data, dict):
        return {}
    calls = data.get("tool_calls")
    kept = tuple(
        {"id": str(c.get("id") or ""), "name": c["name"], "arguments": c.get("arguments") or {}}
        for c in (calls if isinstance(calls, list) else [])
        if isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments", {}), dict)
    )
    out: dict[str, Any] = {"tool_calls": kept} if kept else {}
    for name in ("call_id", "tool"):
        if isinstance(data.get(name), str):
            out[name] = data[name]
    return out


def user_turns(turns: list[StoredMessage]) -> int:
    """How many of these turns are the user's: the count /show, /undo and a resumed chat report."""
    return sum(1 for m in turns if m.role == "user")


def saving_disabled() -> bool:
    return os.environ.get(NO_SAVE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def default_path() -> Path:
    return data_dir() / DB_NAME


@dataclass
class StoredMessage:
    role: str
    content: str
    reasoning: str | None = None
    interrupted: bool = False
    stats: dict[str, Any] | None = None
    id: int | None = None  # the row, once stored
    created: float = field(default_factory=time.time)
    model: str | None = None  # the model that gave an answer (None: a user message, or not known)
    images: tuple[ImageRef, ...] = ()  # what a user message carried: each image's sha256, size, path
    # a tool step (runner chat/run --mcp): an assistant's calls, each {"id", "name", "arguments"}; a
    # "tool" message's result answers the call `call_id`, of the tool `tool`
    tool_calls: tuple[dict[str, Any], ...] = ()
    call_id: str | None = None
    tool: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning:
            data["reasoning"] = self.reasoning
        if self.interrupted:
            data["interrupted"] = True
        if self.model:
            data["model"] = self.model
        if self.images:
            data["images"] = [i.to_json() for i in self.images]
        data.update(self.tool_fields())
        return data

    def tool_fields(self) -> dict[str, Any]:
        """What a tool step adds to a message, as the store keeps it (JSON): its calls, or the call it
        answers and that call's tool. Empty for any other message."""
        fields: dict[str, Any] = {}
        if self.tool_calls:
            fields["tool_calls"] = [dict(call) for call in self.tool_calls]
        if self.call_id is not None:
            fields["call_id"] = self.call_id
        if self.tool is not None:
            fields["tool"] = self.tool
        return fields


@dataclass
class StoredConversation:
    id: int
    model: str  # the model it continues with: the one that answered it last
    system: str | None
    created: float
    updated: float
    messages: list[StoredMessage]
    settings: dict[str, Any] = field(default_factory=dict)  # the chat's /set values (Session.settings)
    title: str | None = None  # the name it was given (runner serve's page); None: its first words


@dataclass(frozen=True)
class StoredResponse:
    """A response of the server's Responses API, as the API shapes it (the store reads none of it)."""

    id: str  # "resp_…"
    model: str
    created: float
    previous_id: str | None  # the response it continued
    response: dict[str, Any]  # the response object, as GET /v1/responses/{id} returns it
    input: list[dict[str, Any]]  # the request's input items
    conversation: list[dict[str, Any]]  # every item up to and including its output: what a next one continues


@dataclass(frozen=True)
class Summary:
    id: int | str  # a conversation's number, or a served response's "resp_…"
    model: str
    turns: int  # user messages
    updated: float
    first_words: str
    origin: str = "chat"  # ORIGIN_CHAT or ORIGIN_SERVE
    title: str | None = None  # the name a conversation was given (None: none)


ORIGIN_CHAT = "chat"  # a conversation: runner chat, runner run -c
ORIGIN_SERVE = "serve"  # the last response of a chain runner serve keeps (/v1/responses)


class Store:
    """One open database. Every method raises StoreError, never sqlite3's own errors."""

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self._db = db
        self.path = path

    @classmethod
    def open(cls, path: Path | None = None) -> Store:
        path = path or default_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(path, timeout=5.0, isolation_level=None)  # transactions are explicit
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open {path}: {exc}") from exc
        store = cls(db, path)
        try:
            with store._errors("open"):
                store._check_version()  # before anything writes, even the journal mode's header bytes
                db.execute("PRAGMA foreign_keys = ON")
                store._wal()
                db.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: a killed process loses nothing
                store._migrate()
        except StoreError:
            db.close()
            raise
        return store

    def close(self) -> None:
        self._db.close()

    def _wal(self, within: float = 5.0) -> None:
        """The journal in WAL mode (once per database: it stays). Switching needs the database to
        itself, and SQLite answers "database is locked" at once, without its busy timeout, while
        another runner opening the same new database holds it: so try again for a while."""
        deadline = time.monotonic() + within
        while True:
            try:
                self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot {doing}: {exc}") from exc

    @contextmanager
    def _write(self, doing: str) -> Iterator[sqlite3.Connection]:
        """One transaction, at a safe point: Ctrl-C waits until it is committed or rolled back."""
        with interrupt.deferred(), self._errors(doing):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _check_version(self) -> int:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version > len(MIGRATIONS):
            raise StoreError(
                f"{self.path} was written by a newer runner (schema {version}; this one knows "
                f"{len(MIGRATIONS)}): left as it is; upgrade runner to use it"
            )
        return version

    def _migrate(self) -> None:
        """Each step in its own write transaction, the version read inside it: two runners opening a
        new database at once migrate it once (the second finds the first's work done)."""
        while self._check_version() < len(MIGRATIONS):
            with self._write("migrate the schema") as db:
                version = self._check_version()
                if version < len(MIGRATIONS):
                    MIGRATIONS[version](db)
                    db.execute(f"PRAGMA user_version = {version + 1}")

    # -- writing ---------------------------------------------------------------------------------

    def new_conversation(self, model: str, system: str | None, settings: dict[str, Any] | None = None) -> int:
        now = time.time()
        with self._write("start a conversation") as db:
            cursor = db.execute(
                "INSERT INTO conversations (model, system, created, updated, settings)"
                " VALUES (?, ?, ?, ?, ?)",
                (model, system, now, now, json.dumps(settings) if settings else None),
            )
        return int(cursor.lastrowid or 0)

    def add_message(self, conversation: int, message: StoredMessage) -> int:
        with self._write("save a message") as db:
            cursor = db.execute(
                "INSERT INTO messages"
                " (conversation_id, role, content, reasoning, interrupted, created, stats, model, images,"
                " tool)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation,
                    message.role,
                    message.content,
                    message.reasoning,
                    int(message.interrupted),
                    message.created,
                    json.dumps(message.stats) if message.stats else None,
                    message.model,
                    json.dumps([i.to_json() for i in message.images]) if message.images else None,
                    json.dumps(message.tool_fields()) if message.tool_fields() else None,
                ),
            )
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation))
        message.id = int(cursor.lastrowid or 0)
        return message.id

    def delete_messages(self, conversation: int, ids: list[int]) -> None:
        with self._write("delete messages") as db:
            db.executemany(
                "DELETE FROM messages WHERE id = ? AND conversation_id = ?", [(i, conversation) for i in ids]
            )
            # a summary of messages no longer there goes with them (/undo past a compaction)
            db.execute(
                "DELETE FROM compactions WHERE conversation_id = ? AND through >= ?", (conversation, min(ids))
            )
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation))

    def set_system(self, conversation: int, system: str | None) -> None:
        with self._write("set the system message") as db:
            db.execute(
                "UPDATE conversations SET system = ?, updated = ? WHERE id = ?",
                (system, time.time(), conversation),
            )

    def set_model(self, conversation: int, model: str) -> None:
        """The model the conversation continues with from now on (each answer keeps its own)."""
        with self._write("set the model") as db:
            db.execute(
                "UPDATE conversations SET model = ?, updated = ? WHERE id = ?",
                (model, time.time(), conversation),
            )

    def set_settings(self, conversation: int, settings: dict[str, Any]) -> None:
        with self._write("save the settings") as db:
            db.execute(
                "UPDATE conversations SET settings = ?, updated = ? WHERE id = ?",
                (json.dumps(settings) if settings else None, time.time(), conversation),
            )

    def set_title(self, conversation: int, title: str | None) -> None:
        with self._write("rename a conversation") as db:
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation))

    def remove(self, conversation: int) -> bool:
        with self._write("remove a conversation") as db:
            cursor = db.execute("DELETE FROM conversations WHERE id = ?", (conversation,))
        return cursor.rowcount > 0

    def save_response(self, stored: StoredResponse) -> None:
        with self._write("save a response") as db:
            db.execute(
                "INSERT OR REPLACE INTO responses"
                " (id, model, created, previous_id, response, input, conversation)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    stored.id,
                    stored.model,
                    stored.created,
                    stored.previous_id,
                    json.dumps(stored.response, ensure_ascii=False),
                    json.dumps(stored.input, ensure_ascii=False),
                    json.dumps(stored.conversation, ensure_ascii=False),
                ),
            )

    def remove_response(self, response_id: str) -> bool:
        with self._write("remove a response") as db:
            cursor = db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        return cursor.rowcount > 0

    def remove_response_chain(self, response_id: str) -> list[str]:
        """A response and the earlier ones of its chain (previous_response_id) that no other kept response
        continues, as one write: `runner history rm` of the conversation a response ends. The removed
        ids, latest first; none when there is no such response."""
        removed: list[str] = []
        with self._write("remove a response") as db:
            at: str | None = response_id
            while at is not None:
                row = db.execute("SELECT previous_id FROM responses WHERE id = ?", (at,)).fetchone()
                if row is None:
                    break
                db.execute("DELETE FROM responses WHERE id = ?", (at,))
                removed.append(at)
                at = row[0]
                if (
                    at is not None
                    and db.execute("SELECT 1 FROM responses WHERE previous_id = ? LIMIT 1", (at,)).fetchone()
                ):
                    break  # another branch goes on from it: kept
        return removed

    # -- reading ---------------------------------------------------------------------------------

    def load_response(self, response_id: str) -> StoredResponse | None:
        with self._errors("read"):
            row = self._db.execute(
                "SELECT id, model, created, previous_id, response, input, conversation FROM responses"
                " WHERE id = ?",
                (response_id,),
            ).fetchone()
        if row is None:
            return None
        try:
            response, items, conversation = (json.loads(text) for text in row[4:])
        except ValueError as exc:
            raise StoreError(f"{self.path}: response {row[0]} is not readable JSON: {exc}") from exc
        return StoredResponse(row[0], row[1], row[2], row[3], response, items, conversation)

    def latest(self) -> int | None:
        with self._errors("read"):
            row = self._db.execute(
                "SELECT id FROM conversations ORDER BY updated DESC, id DESC LIMIT 1"
            ).fetchone()
        return int(row[0]) if row else None

    def load(self, conversation: int) -> StoredConversation | None:
        with self._errors("read"):
            head = self._db.execute(
                "SELECT id, model, system, created, updated, settings, title FROM conversations WHERE id = ?",
                (conversation,),
            ).fetchone()
            if head is None:
                return None
            rows = self._db.execute(
                "SELECT id, role, content, reasoning, interrupted, created, stats, model, images, tool"
                " FROM messages WHERE conversation_id = ? ORDER BY id",
                (conversation,),
            ).fetchall()
        messages = [
            StoredMessage(
                role=role,
                content=content,
                reasoning=reasoning,
                interrupted=bool(interrupted),
                stats=json.loads(stats) if stats else None,
                id=row_id,
                created=created,
                model=model,
                images=tuple(i for i in map(ImageRef.from_json, json.loads(images or "[]")) if i),
                **tool_step(json.loads(tool) if tool else {}),
            )
            for row_id, role, content, reasoning, interrupted, created, stats, model, images, tool in rows
        ]
        settings = json.loads(head[5]) if head[5] else {}
        return StoredConversation(head[0], head[1], head[2], head[3], head[4], messages, settings, head[6])

    def summaries(self, limit: int | None = None) -> list[Summary]:
        """Conversations with at least one message, most recently updated first."""
        query = (
            "SELECT c.id, c.model, c.updated, c.title,"
            " (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id AND m.role = 'user'),"
            " (SELECT content FROM messages m WHERE m.conversation_id = c.id ORDER BY m.id LIMIT 1)"
            " FROM conversations c WHERE EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id)"
            " ORDER BY c.updated DESC, c.id DESC"
        )
        return [
            Summary(i, model, turns, updated, first_words(first or ""), title=title)
            for i, model, updated, title, turns, first in self._listed(query, limit)
        ]

    def _listed(self, query: str, limit: int | None) -> list[Any]:
        """A listing's rows, the first `limit` of them (None: all)."""
        with self._errors("read"):
            rows = self._db.execute(query + (" LIMIT ?" if limit else ""), (limit,) if limit else ())
            return rows.fetchall()

    def response_summaries(self, limit: int | None = None) -> list[Summary]:
        """The responses no other kept response continues (each the end of one served conversation),
        latest first: its turns and first words read from the conversation it ends."""
        query = (
            "SELECT r.id, r.model, r.created, r.conversation FROM responses r"
            " WHERE NOT EXISTS (SELECT 1 FROM responses n WHERE n.previous_id = r.id)"
            " ORDER BY r.created DESC, r.rowid DESC"
        )
        found = []
        for response_id, model, created, conversation in self._listed(query, limit):
            try:
                items = json.loads(conversation)
            except ValueError:
                items = []
            asked = [i.get("content") for i in items if isinstance(i, dict) and i.get("role") == "user"]
            first = next((text for text in asked if isinstance(text, str)), "")
            found.append(Summary(response_id, model, len(asked), created, first_words(first), ORIGIN_SERVE))
        return found

    def integrity(self) -> str:
        with self._errors("check"):
            return str(self._db.execute("PRAGMA integrity_check").fetchone()[0])


def inspect(path: Path) -> tuple[int, str]:
    """(schema version, SQLite's integrity check) of a database, read only: nothing written, nothing
    migrated, nothing created (runner doctor). StoreError when it cannot be read at all."""
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    except (OSError, sqlite3.Error) as exc:
        raise StoreError(f"cannot open {path}: {exc}") from exc
    try:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        return version, str(db.execute("PRAGMA integrity_check").fetchone()[0])
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot check: {exc}") from exc
    finally:
        db.close()


def first_words(text: str, width: int = 48) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "…"
