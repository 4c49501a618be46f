"""Chats that outgrow their context (runner.commands.compact): the older turns summarised by the model
itself, the store keeping every original turn and the summary as its own record, `--resume` and
`run -c` going on from the summary, and a SIGTERM during a compaction changing nothing.

The chats are SmolLM2's at a small --ctx (a few turns fill it); the SIGTERM test uses `endless` (as
test_signals does), a scripted model whose every summary runs to its length limit, over a conversation
long enough that summarising it takes many prompts: the signal lands while it is being written.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from runner.commands.compact import SUMMARY_HEAD, CompactSettings, split_at, system_with
from runner.errors import UsageError
from runner.store import MIGRATIONS, Compaction, Store, StoredMessage, latest_compaction, save_compaction
from tests.conftest import run_cli

GREEDY = ["--temperature", "0"]
SMALL = [*GREEDY, "--ctx", "512", "--max-tokens", "40"]
LINES = [
    f"Tell me three facts about the number {n} and a city whose name has {n} letters." for n in range(12)
]


@pytest.fixture(scope="module")
def endless(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scripted model on SmolLM2's tokenizer (tests/synth.py) that answers a text ending in "." with
    " apple pear plum" over and over, until its length limit."""
    from runner.engine.engine import Engine
    from tests.synth import set_context_length, write_scripted

    with Engine(smollm2_path, n_ctx=256, n_threads=1) as vocab:
        dot, a, b, c = (
            vocab.model.tokenize(text, add_special=False)[-1] for text in ("sea.", " apple", " pear", " plum")
        )
    says = "{% for m in messages %} {{ m['content'] }}{% endfor %}"  # a prompt ends with its last message
    path = tmp_path_factory.mktemp("endless") / "endless.gguf"
    write_scripted(path, smollm2_path, [dot, a, b, c, a], template=says)
    return set_context_length(path, 32768)


def _default_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # as a terminal's shell leaves them
        signal.signal(signum, signal.SIG_DFL)


# -- the store: the summary as its own record -------------------------------------------------------


@pytest.mark.fast
def test_a_summary_is_stored_beside_the_turns_it_stands_for(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "c.db")
    try:
        c = store.new_conversation("m", None)
        ids = [
            store.add_message(c, StoredMessage(role, f"{role} {i}"))
            for i in range(3)
            for role in ("user", "assistant")
        ]
        assert latest_compaction(store, c) is None
        save_compaction(store, c, Compaction("they talked", 4, "m", stats={"parts": 1}, through=ids[3]))
        found = latest_compaction(store, c)
        assert found is not None and (found.summary, found.turns, found.through) == ("they talked", 4, ids[3])
        assert found.stats == {"parts": 1}
        loaded = store.load(c)
        assert loaded is not None and len(loaded.messages) == 6  # every turn stays
        store.delete_messages(c, ids[4:])  # /undo of the last exchange: the summary stands
        assert latest_compaction(store, c) is not None
        store.delete_messages(c, ids[2:4])  # /undo into the turns it stands for: it goes with them
        assert latest_compaction(store, c) is None
        store.remove(c)
    finally:
        store.close()
    db = sqlite3.connect(tmp_path / "c.db")
    assert db.execute("SELECT COUNT(*) FROM compactions").fetchone()[0] == 0  # gone with the conversation
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)


@pytest.mark.fast
def test_the_settings_are_checked_and_the_summary_goes_in_the_system_message() -> None:
    for bad in (dict(mode="always"), dict(keep=-1), dict(prompt="  ")):
        with pytest.raises(UsageError):
            CompactSettings(**bad)  # type: ignore[arg-type]
    summary = Compaction("They met.", 2)
    assert system_with(None, None) is None
    assert system_with("Be brief.", summary) == f"Be brief.\n\n{SUMMARY_HEAD}\nThey met."
    assert system_with(None, summary) == f"{SUMMARY_HEAD}\nThey met."


@pytest.mark.model
def test_a_compaction_keeps_the_last_exchange_whole_and_with_it_a_tool_loops_task(engine) -> None:
    """Split points are where a user's message begins: the recent turns that fit `keep`, and the last
    exchange at least, however large (a tool loop's task, with each step made for it so far)."""
    step = {"id": "1", "name": "search", "arguments": {"q": "x"}}
    turns = [StoredMessage("user", "Hello there. " * 20), StoredMessage("assistant", "Hi. " * 20)] * 3
    turns += [
        StoredMessage("user", "Find the file and tell me its size."),
        StoredMessage("assistant", "", tool_calls=(step,)),
        StoredMessage("tool", "result " * 400, call_id="1", tool="search"),
        StoredMessage("assistant", "", tool_calls=(step,)),
    ]
    assert split_at(engine, turns, 0, keep=10_000) == 0  # all of it fits: nothing to compact
    assert split_at(engine, turns, 0, keep=0) == 6  # the task's exchange stays whole
    assert split_at(engine, turns, 0, keep=600) == 4  # and the exchange before it fits too
    assert split_at(engine, turns, 6, keep=0) == 6  # summarised up to the task already: nothing more
    # a loop whose exchange alone outgrows the context: its steps are split points too, the last at most
    assert split_at(engine, turns, 0, keep=0, inside=True) == 9
    assert split_at(engine, turns, 0, keep=100, inside=True) == 9
    assert split_at(engine, turns, 0, keep=500, inside=True) == 6
    assert split_at(engine, turns, 9, keep=0, inside=True) == 9  # nothing more to summarise


# -- chats driven past their context -------------------------------------------------------------


def _store_state() -> tuple[list[StoredMessage], Compaction | None]:
    store = Store.open()
    try:
        [summary] = store.summaries()
        conversation = store.load(int(summary.id))
        assert conversation is not None
        return conversation.messages, latest_compaction(store, conversation.id)
    finally:
        store.close()


@pytest.mark.timeout(600)
def test_a_piped_chat_past_its_context_compacts_and_resume_goes_on_from_the_summary(
    smollm2_path: Path,
) -> None:
    feed = "".join(line + "\n" for line in LINES).encode()
    done = run_cli("chat", str(smollm2_path), *SMALL, input=feed, timeout=400)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "compacting the" in err and "compacted:" in err, err
    assert "no longer reach the model" not in err  # compacted, not dropped
    messages, compaction = _store_state()
    assert [m.content for m in messages if m.role == "user"] == LINES  # every original turn kept
    assert all(m.content for m in messages if m.role == "assistant") and len(messages) == 2 * len(LINES)
    assert compaction is not None and compaction.summary.strip() and compaction.model
    assert 0 < compaction.turns < len(messages) and messages[compaction.turns].role == "user"
    assert compaction.through == messages[compaction.turns - 1].id

    data = json.loads(run_cli("history", "show", "--json", "1").stdout)  # every turn, those summarised marked
    assert [m.get("compacted", False) for m in data["messages"]] == [
        n < compaction.turns for n in range(len(messages))
    ]
    assert data["summary"]["text"] == compaction.summary and data["summary"]["messages"] == compaction.turns
    shown = run_cli("history", "show", "1").stdout.decode()
    assert shown.count("(compacted)") == compaction.turns and "summary of the" in shown

    # run -c: one more turn, from the summary and the turns after it (the whole conversation would not fit)
    more = run_cli("run", "-c", "And the next number?", *SMALL, "--json", timeout=200)
    assert more.returncode == 0, more.stderr.decode()
    answer = json.loads(more.stdout)
    after, again = _store_state()
    assert len(after) == len(messages) + 2 and after[-1].content == answer["text"]
    sent = answer["usage"]["prompt_tokens"]
    assert sent + 40 <= 512, answer  # it fitted with the summary, no turn dropped
    assert again is not None and again.turns >= compaction.turns


@pytest.mark.model
def test_compact_on_demand_summarises_all_but_the_recent_turns_and_stores_it(smollm2_path: Path) -> None:
    """/compact: the turns before the last exchange (--compact-keep 30 keeps no more) summarised,
    the summary stored; a second /compact finds nothing older to summarise."""
    from runner.commands.session import ChatRequest, Session
    from runner.loader import open_model
    from runner.settings import DEFAULTS

    store = Store.open()
    try:
        c = store.new_conversation(str(smollm2_path), None)
        for city in ("Paris", "Rome", "Oslo", "Lima"):
            store.add_message(c, StoredMessage("user", f"My next trip is to {city}. Remember it, please."))
            store.add_message(c, StoredMessage("assistant", f"Noted: your next trip is to {city}."))
        stored = store.load(c)
        assert stored is not None
        settings = replace(DEFAULTS, ctx=512)
        request = ChatRequest(settings=settings, prompt_cache=False, compact=CompactSettings(keep=30))
        loaded = open_model(str(smollm2_path), settings)
        try:
            session = Session(loaded, request, store, out=io.StringIO(), interactive=True)
            session.adopt(stored, stored_here=True)
            session.compact()
            assert session.compaction is not None and session.compaction.turns == 6
            with pytest.raises(UsageError, match="nothing to compact"):
                session.compact()
        finally:
            loaded.close()
        kept = latest_compaction(store, c)
        assert kept is not None and kept.turns == 6 and kept.summary == session.compaction.summary
        assert kept.stats is not None and kept.stats["completion_tokens"] > 0
    finally:
        store.close()


@pytest.mark.model
def test_a_resumed_session_sends_the_summary_and_the_turns_after_it(smollm2_path: Path) -> None:
    """What the model is sent after a compaction: the summary in the system message, then the turns it
    does not stand for; none of those it does."""
    from runner.commands.session import ChatRequest, Session
    from runner.loader import open_model
    from runner.settings import DEFAULTS

    store = Store.open()
    try:
        c = store.new_conversation(str(smollm2_path), "Be brief.")
        ids = [
            store.add_message(c, StoredMessage(role, f"{role} says {word}"))
            for word in ("apple", "pear", "plum")
            for role in ("user", "assistant")
        ]
        save_compaction(store, c, Compaction("They named two fruits.", 4, "m", through=ids[3]))
        stored = store.load(c)
        assert stored is not None
        request = ChatRequest(settings=replace(DEFAULTS, ctx=512), prompt_cache=False)
        loaded = open_model(str(smollm2_path), request.settings)
        try:
            session = Session(loaded, request, store, out=io.StringIO(), interactive=False)
            session.adopt(stored, stored_here=True)
            text = session._fitted([*session.turns, StoredMessage("user", "and now?")]).prompt.text
        finally:
            loaded.close()
    finally:
        store.close()
    assert "Be brief." in text and "They named two fruits." in text and "plum" in text and "and now?" in text
    assert "apple" not in text and "pear" not in text


@pytest.mark.model
def test_a_summary_inside_a_tool_loop_is_followed_by_the_loops_task(smollm2_path: Path) -> None:
    """A compaction of a tool loop's first steps: the model is sent the summary, the task (the user's
    message, again) and the steps after it; not the steps the summary stands for."""
    from runner.commands.session import ChatRequest, Session
    from runner.loader import open_model
    from runner.settings import DEFAULTS

    call = {"id": "1", "name": "search", "arguments": {"q": "size"}}
    store = Store.open()
    try:
        c = store.new_conversation(str(smollm2_path), None)
        ids = [
            store.add_message(c, message)
            for message in (
                StoredMessage("user", "Find the file notes.txt and tell me its size."),
                StoredMessage("assistant", "", tool_calls=(call,)),
                StoredMessage("tool", "result-one " * 50, call_id="1", tool="search"),
                StoredMessage("assistant", "", tool_calls=(call,)),
                StoredMessage("tool", "result-two: 4 KB", call_id="1", tool="search"),
            )
        ]
        save_compaction(store, c, Compaction("The first search found nothing useful.", 3, through=ids[2]))
        stored = store.load(c)
        assert stored is not None
        request = ChatRequest(settings=replace(DEFAULTS, ctx=512), prompt_cache=False)
        loaded = open_model(str(smollm2_path), request.settings)
        try:
            session = Session(loaded, request, store, out=io.StringIO(), interactive=False)
            session.adopt(stored, stored_here=True)
            sent = session._fitted(session.turns, [])
        finally:
            loaded.close()
    finally:
        store.close()
    text = sent.prompt.text
    assert "Find the file notes.txt" in text and "found nothing useful" in text and "result-two" in text
    assert "result-one" not in text and sent.first == 3


@pytest.mark.timeout(300)
def test_sigterm_during_a_compaction_changes_nothing(endless: Path) -> None:
    """run -c on a long stored conversation: it compacts before it answers, in many prompts (the
    scripted model writes each summary to its limit); SIGTERM then exits 143, with every turn as it
    was and no summary stored (one is written whole, after its last part, or not at all)."""
    store = Store.open()
    try:
        c = store.new_conversation(str(endless), None)
        for n in range(150):
            store.add_message(c, StoredMessage("user", f"Question {n}: " + ("tell me more. " * 12).strip()))
            store.add_message(c, StoredMessage("assistant", ("apple pear plum. " * 20).strip()))
        before = store.load(c)
    finally:
        store.close()
    assert before is not None
    args = ["run", "-c", "Go on.", *GREEDY, "--ctx", "2048", "--max-tokens", "30"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_default_signals,
    )
    assert proc.stderr is not None
    err = b""
    deadline = time.monotonic() + 120
    while b"compacting the" not in err:
        assert time.monotonic() < deadline and proc.poll() is None, err
        err += os.read(proc.stderr.fileno(), 256)
    proc.send_signal(signal.SIGTERM)
    try:
        err += proc.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("runner did not exit within 30 s of SIGTERM")
    assert proc.returncode == 128 + signal.SIGTERM and b"Traceback" not in err, err
    assert b"compacted:" not in err, err  # it was stopped during the compaction
    store = Store.open()
    try:
        assert store.integrity() == "ok" and latest_compaction(store, c) is None
        after = store.load(c)
    finally:
        store.close()
    assert after is not None
    assert [(m.id, m.role, m.content) for m in after.messages] == [
        (m.id, m.role, m.content) for m in before.messages
    ]


# -- runner serve: the Responses API's truncation "auto" ----------------------------------------------


@pytest.mark.fast
def test_truncation_drops_whole_turns_from_the_beginning_and_keeps_the_instructions() -> None:
    from runner.serve.responses.input import input_items
    from runner.serve.responses.truncation import without_oldest_turn

    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "42"}
    items = input_items(
        [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "one"},
            call,
            output,
            {"role": "assistant", "content": "it is 42"},
            {"role": "user", "content": "two"},
            {"role": "assistant", "content": "2"},
            {"role": "user", "content": "three"},
        ]
    )

    def shown(kept: list | None) -> list[str]:
        assert kept is not None
        return [getattr(i, "role", None) or i.type for i in kept]

    once = without_oldest_turn(items)
    assert shown(once) == ["developer", "user", "assistant", "user"]  # the call and its output went too
    assert shown(without_oldest_turn(once)) == ["developer", "user"]
    assert without_oldest_turn(without_oldest_turn(once)) is None  # the last user message stays


@pytest.mark.timeout(300)
def test_responses_truncation_auto_drops_the_oldest_turns_of_a_stored_chain(
    smollm2_path: Path, tmp_path: Path
) -> None:
    import openai

    from tests.serving import serving

    long = " ".join(f"word{i}" for i in range(120))  # ~300 tokens: two do not fit a 512-token context
    with serving(["smollm2", "--ctx", "512", "--threads", "2"], tmp_path / "stderr") as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        first = client.responses.create(model="smollm2", input=f"Remember: {long}", max_output_tokens=8)
        asked = dict(model="smollm2", previous_response_id=first.id, max_output_tokens=8)
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(input=f"And: {long}", **asked)  # truncation "disabled", the default
        assert refused.value.code == "context_length_exceeded" and refused.value.param == "input"
        second = client.responses.create(input=f"And: {long}", truncation="auto", **asked)
        assert second.truncation == "auto" and second.output_text  # answered (to its max_output_tokens)
        assert second.usage is not None and second.usage.input_tokens < 512
        third = client.responses.create(
            model="smollm2",
            input="Hi",
            previous_response_id=second.id,
            truncation="auto",
            max_output_tokens=8,
        )
        assert third.output_text and third.usage is not None
        with pytest.raises(openai.BadRequestError):  # the last message alone does not fit: still a 400
            client.responses.create(model="smollm2", input="x " * 600, truncation="auto", max_output_tokens=8)


def test_compact_flags_on_one_answer_are_refused_not_ignored() -> None:
    """One answer keeps no conversation: --compact there would do nothing, so it is said (exit 2)."""
    one = run_cli("run", "smollm2", "Hi", "--compact", "auto")
    assert one.returncode == 2 and b"--compact goes with a chat" in one.stderr
    piped = run_cli("run", "smollm2", "--compact-keep", "100", input=b"Hi\n")
    assert piped.returncode == 2 and b"--compact-keep goes with a chat" in piped.stderr
