"""The conversation store: migrations, a newer schema left alone, corrupt files, the JSON format."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from runner.errors import UsageError
from runner.store import MIGRATIONS, Store, StoredConversation, StoredMessage, StoreError
from runner.store.file import from_json, to_json

pytestmark = pytest.mark.fast


def test_a_conversation_round_trips(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "c.db")
    try:
        cid = store.new_conversation("smollm2", "Be brief.")
        store.add_message(cid, StoredMessage("user", "Hi"))
        store.add_message(cid, StoredMessage("assistant", "Hel", reasoning="hmm", interrupted=True))
        loaded = store.load(cid)
        assert loaded is not None
        assert [(m.role, m.content, m.reasoning, m.interrupted) for m in loaded.messages] == [
            ("user", "Hi", None, False),
            ("assistant", "Hel", "hmm", True),
        ]
        assert store.latest() == cid
        [summary] = store.summaries()
        assert (summary.id, summary.turns, summary.first_words) == (cid, 1, "Hi")
        again = from_json(to_json(loaded), "test")
        assert again.system == "Be brief." and [m.to_json() for m in again.messages] == [
            m.to_json() for m in loaded.messages
        ]
        assert store.remove(cid) and store.load(cid) is None and not store.remove(cid)
        assert store.integrity() == "ok"
    finally:
        store.close()


def test_the_schema_version_counts_the_migrations(tmp_path: Path) -> None:
    Store.open(tmp_path / "c.db").close()
    with sqlite3.connect(tmp_path / "c.db") as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_database_from_a_newer_runner_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE future (x)")
        db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    before = path.read_bytes()
    with pytest.raises(StoreError, match="written by a newer runner"):
        Store.open(path)
    assert path.read_bytes() == before


def test_a_file_that_is_not_a_database_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="c.db"):
        Store.open(path)
    assert path.read_bytes() == b"this is not sqlite" * 100


@pytest.mark.parametrize(
    "data, why",
    [
        ([], "expected a JSON object"),
        ({"messages": "no"}, 'no "messages" list'),
        ({"messages": [{"role": "robot", "content": "x"}]}, "message 1 needs a"),
        ({"messages": [{"role": "user", "content": 3}]}, "content"),
    ],
)
def test_a_malformed_conversation_file_says_what_is_wrong(data: object, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        from_json(data, "saved.json")


def test_a_system_message_first_is_read_as_the_system(tmp_path: Path) -> None:
    found = from_json(
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}, "x"
    )
    assert found.system == "S" and [m.role for m in found.messages] == ["user"]


def test_runners_opening_a_new_database_at_once_migrate_it_once(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "race.db"
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def open_it() -> None:
        start.wait()
        try:
            Store.open(path).close()
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_a_database_from_the_first_schema_migrates_and_keeps_its_conversations(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    with sqlite3.connect(path) as db:  # as runner wrote it before settings were kept
        MIGRATIONS[0](db)
        db.execute("PRAGMA user_version = 1")
        db.execute(
            "INSERT INTO conversations (model, system, created, updated) VALUES ('smollm2', 'S', 1, 2)"
        )
        db.execute(
            "INSERT INTO messages (conversation_id, role, content, created) VALUES (1, 'user', 'Hi', 1)"
        )
    store = Store.open(path)
    try:
        old = store.load(1)
        assert old is not None and old.settings == {} and [m.content for m in old.messages] == ["Hi"]
        store.set_settings(1, {"temperature": 0.2, "think": False})
        new = store.new_conversation("smollm2", None, {"format": "json"})
        assert store.load(1).settings == {"temperature": 0.2, "think": False}  # type: ignore[union-attr]
        assert store.load(new).settings == {"format": "json"}  # type: ignore[union-attr]
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


def test_the_json_format_carries_iso_times_and_the_settings() -> None:
    conversation = StoredConversation(3, "smollm2", None, 0.0, 86400.5, [], {"top_k": 5})
    data = to_json(conversation)
    assert (data["created"], data["updated"]) == ("1970-01-01T00:00:00Z", "1970-01-02T00:00:00Z")
    assert from_json(data, "x").settings == {"top_k": 5}
    with pytest.raises(UsageError, match='"settings" must be an object'):
        from_json({"messages": [], "settings": [1]}, "x")


def test_each_answer_keeps_its_model_and_older_answers_get_the_conversations(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    with sqlite3.connect(path) as db:  # as runner wrote it before each answer kept its model
        for m in MIGRATIONS[:3]:
            m(db)
        db.execute("PRAGMA user_version = 3")
        db.execute("INSERT INTO conversations (model, created, updated) VALUES ('smollm2', 1, 2)")
        for role in ("user", "assistant"):
            db.execute(
                "INSERT INTO messages (conversation_id, role, content, created) VALUES (1, ?, 'x', 1)",
                (role,),
            )
    store = Store.open(path)
    try:
        assert [m.model for m in store.load(1).messages] == [None, "smollm2"]  # type: ignore[union-attr]
        store.add_message(1, StoredMessage("user", "And you?"))
        store.add_message(1, StoredMessage("assistant", "Fine.", model="qwen3:0.6b"))
        store.set_model(1, "qwen3:0.6b")
        again = store.load(1)
        assert again is not None and again.model == "qwen3:0.6b"
        models = [None, "smollm2", None, "qwen3:0.6b"]
        assert [m.model for m in again.messages] == models
        assert [m.model for m in from_json(to_json(again), "x").messages] == models  # /save, --load
    finally:
        store.close()


def test_served_responses_list_once_per_chain_and_rm_keeps_other_branches(tmp_path: Path) -> None:
    """a <- b <- c and a <- d: c and d are listed (the ends of two conversations); removing c removes b
    too, not a, which d goes on from; removing d then removes a."""
    from runner.store import ORIGIN_SERVE, StoredResponse

    def said(n: int, *texts: str) -> list[dict[str, Any]]:
        roles = ["user", "assistant"] * n
        return [{"type": "message", "role": r, "content": t} for r, t in zip(roles, texts, strict=False)]

    store = Store.open(tmp_path / "c.db")
    try:
        for n, (rid, prev, texts) in enumerate(
            [
                ("resp_a", None, ("Hi", "Hello")),
                ("resp_b", "resp_a", ("Hi", "Hello", "More", "Yes")),
                ("resp_c", "resp_b", ("Hi", "Hello", "More", "Yes", "And", "Done")),
                ("resp_d", "resp_a", ("Hi", "Hello", "Other", "Sure")),
            ]
        ):
            items = said(3, *texts)
            store.save_response(
                StoredResponse(rid, "smollm2", 100.0 + n, prev, {"id": rid}, items[-2:-1], items)
            )
        listed = store.response_summaries()
        assert [(s.id, s.turns, s.first_words, s.origin) for s in listed] == [
            ("resp_d", 2, "Hi", ORIGIN_SERVE),
            ("resp_c", 3, "Hi", ORIGIN_SERVE),
        ]
        assert store.remove_response_chain("resp_c") == ["resp_c", "resp_b"]
        assert store.load_response("resp_a") is not None
        assert store.remove_response_chain("resp_d") == ["resp_d", "resp_a"]
        assert store.response_summaries() == [] and store.remove_response_chain("resp_a") == []
    finally:
        store.close()


def test_tool_steps_round_trip_and_a_version_5_database_takes_them(tmp_path: Path) -> None:
    """An assistant's calls and each tool result are messages of their own (chat/run --mcp): kept by
    the store, written and read by the JSON format, and a database from before them (version 5, whose
    messages allowed only user and assistant) migrates with its conversations kept."""
    path = tmp_path / "c.db"
    with sqlite3.connect(path) as db:
        for m in MIGRATIONS[:5]:
            m(db)
        db.execute("PRAGMA user_version = 5")
        db.execute(
            "INSERT INTO conversations (model, system, created, updated) VALUES ('smollm2', NULL, 1, 2)"
        )
        db.execute(
            "INSERT INTO messages (conversation_id, role, content, created) VALUES (1, 'user', 'Hi', 1)"
        )
    call = {"id": "call_1", "name": "add", "arguments": {"a": 2, "b": 3}}
    steps = [
        StoredMessage("user", "What is 2 + 3?"),
        StoredMessage("assistant", "", tool_calls=(call,)),
        StoredMessage("tool", "5", call_id="call_1", tool="add"),
        StoredMessage("assistant", "It is 5."),
    ]
    store = Store.open(path)
    try:
        assert [m.content for m in store.load(1).messages] == ["Hi"]  # type: ignore[union-attr]
        cid = store.new_conversation("smollm2", None)
        for message in steps:
            store.add_message(cid, message)
        loaded = store.load(cid)
        assert loaded is not None
        assert [m.to_json() for m in loaded.messages] == [m.to_json() for m in steps]
        assert loaded.messages[1].tool_calls == (call,) and loaded.messages[2].tool == "add"
        again = from_json(to_json(loaded), "test")
        assert [m.to_json() for m in again.messages] == [m.to_json() for m in steps]
        assert [s.turns for s in store.summaries() if s.id == cid] == [1]  # a tool step is no turn
    finally:
        store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        with pytest.raises(sqlite3.IntegrityError):  # the roles are still checked
            db.execute(
                "INSERT INTO messages (conversation_id, role, content, created) VALUES (1, 'x', '', 1)"
            )
