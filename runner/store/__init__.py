"""Conversations kept: the SQLite store (conversations), its schema's migrations, and a conversation
as a JSON file (file: /save, /load, history export). `from runner.store import Store` is the way in."""

from runner.store.compactions import Compaction, latest_compaction, save_compaction
from runner.store.conversations import (
    DB_NAME,
    NO_SAVE_ENV,
    ORIGIN_CHAT,
    ORIGIN_SERVE,
    Store,
    StoredConversation,
    StoredMessage,
    StoredResponse,
    StoreError,
    Summary,
    default_path,
    first_words,
    inspect,
    saving_disabled,
    user_turns,
)
from runner.store.migrations import MIGRATIONS

__all__ = [
    "Compaction",
    "DB_NAME",
    "MIGRATIONS",
    "NO_SAVE_ENV",
    "ORIGIN_CHAT",
    "ORIGIN_SERVE",
    "Store",
    "StoreError",
    "StoredConversation",
    "StoredMessage",
    "StoredResponse",
    "Summary",
    "default_path",
    "first_words",
    "inspect",
    "latest_compaction",
    "save_compaction",
    "saving_disabled",
    "user_turns",
]
