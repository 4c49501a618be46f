"""The conversation store's schema, grown by migrations: small named functions applied in order (as
simonw/llm does); PRAGMA user_version counts those applied (runner.store.conversations.Store)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = []
migration = MIGRATIONS.append


@migration
def m001_conversations(db: sqlite3.Connection) -> None:
    # one statement each: executescript would commit the migration's transaction half-way
    db.execute(
        """CREATE TABLE conversations (
            id INTEGER PRIMARY KEY,
            model TEXT NOT NULL,
            system TEXT,
            created REAL NOT NULL,
            updated REAL NOT NULL
        )"""
    )
    db.execute(
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
            content TEXT NOT NULL,
            reasoning TEXT,
            interrupted INTEGER NOT NULL DEFAULT 0,
            created REAL NOT NULL,
            stats TEXT
        )"""
    )
    db.execute("CREATE INDEX messages_of_conversation ON messages (conversation_id, id)")


@migration
def m002_settings(db: sqlite3.Connection) -> None:
    # what /set (or a flag) chose for the conversation, as JSON: it comes back on --resume
    db.execute("ALTER TABLE conversations ADD COLUMN settings TEXT")


@migration
def m003_responses(db: sqlite3.Connection) -> None:
    # /v1/responses: each stored response whole (JSON), with the conversation it ends, as items
    db.execute(
        """CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            model TEXT NOT NULL,
            created REAL NOT NULL,
            previous_id TEXT,
            response TEXT NOT NULL,
            input TEXT NOT NULL,
            conversation TEXT NOT NULL
        )"""
    )


@migration
def m004_turn_models(db: sqlite3.Connection) -> None:
    # the model that gave each answer (a conversation may be continued with another); the answers
    # stored before were all given by the conversation's one model
    db.execute("ALTER TABLE messages ADD COLUMN model TEXT")
    db.execute(
        "UPDATE messages SET model = (SELECT c.model FROM conversations c WHERE c.id = conversation_id)"
        " WHERE role = 'assistant'"
    )


@migration
def m005_message_images(db: sqlite3.Connection) -> None:
    # the images a user message carried (chat's /image), as a JSON list of runner.images.ImageRef
    db.execute("ALTER TABLE messages ADD COLUMN images TEXT")


@migration
def m006_tool_steps(db: sqlite3.Connection) -> None:
    # tools (chat/run --mcp): a "tool" message holds a call's result; `tool` (JSON) an assistant's
    # calls, or the call a result answers. SQLite cannot change a CHECK: the table is made again.
    db.execute(
        """CREATE TABLE messages_new (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
            content TEXT NOT NULL,
            reasoning TEXT,
            interrupted INTEGER NOT NULL DEFAULT 0,
            created REAL NOT NULL,
            stats TEXT,
            model TEXT,
            images TEXT,
            tool TEXT
        )"""
    )
    db.execute(
        "INSERT INTO messages_new (id, conversation_id, role, content, reasoning, interrupted, created,"
        " stats, model, images) SELECT id, conversation_id, role, content, reasoning, interrupted, created,"
        " stats, model, images FROM messages"
    )
    db.execute("DROP TABLE messages")
    db.execute("ALTER TABLE messages_new RENAME TO messages")
    db.execute("CREATE INDEX messages_of_conversation ON messages (conversation_id, id)")


@migration
def m007_titles(db: sqlite3.Connection) -> None:
    # a conversation's name, given in runner serve's chat page (None: its first words name it)
    db.execute("ALTER TABLE conversations ADD COLUMN title TEXT")


@migration
def m008_compactions(db: sqlite3.Connection) -> None:
    # a chat that outgrew its context (runner.commands.compact): the summary of its messages up to
    # `through` (messages.id), which the model gets in their place; the messages themselves stay
    db.execute(
        """CREATE TABLE compactions (
            id INTEGER PRIMARY KEY,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            through INTEGER NOT NULL,
            summary TEXT NOT NULL,
            model TEXT,
            created REAL NOT NULL,
            stats TEXT
        )"""
    )
    db.execute("CREATE INDEX compactions_of_conversation ON compactions (conversation_id, id)")
