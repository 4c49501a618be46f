"""runner chat as people use it: the real REPL over a pseudo-terminal (pexpect), scripted chats through
pipes, and the conversation store behind both, with the real test model."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest

from runner.store import Store
from tests.conftest import run_cli
from tests.helpers import GREEDY, conversations, ready, spawn

QUIT_HINT = "Ctrl-D, /bye or /exit to quit"
ISO_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def chat_pipe(
    lines: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return run_cli("chat", "smollm2", *GREEDY, *args, input=lines.encode(), env=env)


def test_a_scripted_conversation_through_a_pipe() -> None:
    done = chat_pipe('Hi\n\n"""\nName two\ncolours.\n"""\n', "--max-tokens", "12")
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr and b"Aborted" not in done.stderr
    [conversation] = conversations()
    assert [m.role for m in conversation.messages] == ["user", "assistant", "user", "assistant"]
    assert conversation.messages[2].content == "Name two\ncolours."
    answers = [m.content for m in conversation.messages if m.role == "assistant"]
    # stdout: the answers, nothing else, a blank line between them (answers of paragraphs stay apart)
    assert done.stdout.decode() == "\n".join(a + "\n" for a in answers)


def test_only_what_is_new_is_evaluated_each_turn() -> None:
    done = chat_pipe("Hi\nWhat is 2+2?\nAnd 3+3?\n/stats\n", "--max-tokens", "16")
    assert done.returncode == 0, done.stderr
    stats = re.search(rb"prompt (\d+) tokens: (\d+) evaluated, (\d+) from the KV cache", done.stderr)
    assert stats, done.stderr
    prompt, evaluated, reused = int(stats[1]), int(stats[2]), int(stats[3])
    assert prompt > 60 and evaluated <= 20, (prompt, evaluated)  # "And 3+3?" and the template's wrapper
    assert reused == prompt - evaluated


@pytest.mark.fast
def test_stats_say_the_kv_cache_only_when_it_gave_tokens() -> None:
    from runner.commands.slash import prompt_tokens
    from runner.engine.answer import Timings

    assert prompt_tokens(Timings(prompt_tokens=34, prefill_tokens=34)) == "34 tokens, all evaluated"
    assert prompt_tokens(Timings(prompt_tokens=1, prefill_tokens=1)) == "1 token, all evaluated"
    said = prompt_tokens(Timings(prompt_tokens=40, prefill_tokens=6))
    assert said == "40 tokens: 6 evaluated, 34 from the KV cache"


def test_the_repl_keys_history_and_ctrl_c() -> None:
    child = spawn("chat", "smollm2", "--max-tokens", "400", *GREEDY)
    child.sendline("Tell me a long story about a cat who sails the sea.")
    child.expect_exact("sails the sea.")
    child.expect_exact("Once upon a time")  # the greedy answer has begun: past the prefill, however slow
    time.sleep(0.5)  # and well into it (400 tokens take ~4 s here)
    child.sendintr()
    child.expect_exact("interrupted: the partial answer stays in the conversation")
    ready(child)
    child.sendline("/stats")
    child.expect_exact("finish interrupted")
    ready(child)
    child.sendcontrol("c")  # on an empty line: how to quit, and the chat goes on
    child.expect_exact(QUIT_HINT)
    ready(child)
    child.send("\x1b[A")  # up: the last line again (/stats), from the input history
    child.sendline("")
    child.expect_exact("finish interrupted")
    ready(child)
    child.sendline("/nope")
    child.expect_exact("unknown command /nope; valid: /help")
    ready(child)
    child.sendline("/set temperature 9")
    child.expect_exact("must be between 0 and 2 (got 9)")
    ready(child)
    child.sendline("Say hello.")
    ready(child)
    child.sendline("/stats")
    child.expect(r"finish (stop|length)")
    ready(child)
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    [conversation] = conversations()
    roles = [(m.role, m.interrupted) for m in conversation.messages]
    assert roles == [("user", False), ("assistant", True), ("user", False), ("assistant", False)]
    assert conversation.messages[1].content  # the partial answer was kept


def test_a_pasted_block_and_a_quoted_block_are_one_message_each() -> None:
    child = spawn("chat", "smollm2", "--max-tokens", "4", *GREEDY)
    ready(child)
    child.send("\x1b[200~first pasted line\nsecond pasted line\x1b[201~")  # bracketed paste
    child.sendline("")
    ready(child)
    child.sendline('"""')
    child.expect_exact("...")
    child.sendline("a block")
    child.expect_exact("...")
    child.sendline('of two lines"""')
    ready(child)
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    [conversation] = conversations()
    users = [m.content for m in conversation.messages if m.role == "user"]
    assert users == ["first pasted line\nsecond pasted line", "a block\nof two lines"]


def test_save_then_load_then_retry_and_undo(tmp_path: Path) -> None:
    saved = tmp_path / "talk.json"
    first = chat_pipe(f"Hi\n/save {saved}\n", "--max-tokens", "6")
    assert first.returncode == 0, first.stderr
    data = json.loads(saved.read_text())
    assert data["format"] == "runner-conversation" and [m["role"] for m in data["messages"]] == [
        "user",
        "assistant",
    ]
    again = chat_pipe("Again?\n/retry\n/undo\nBye\n", "--max-tokens", "6", "--load", str(saved))
    assert again.returncode == 0, again.stderr
    latest = conversations()[-1]
    assert [(m.role, m.content) for m in latest.messages][:1] == [("user", "Hi")]
    assert [m.content for m in latest.messages if m.role == "user"] == ["Hi", "Bye"]  # "Again?" undone
    assert [m.role for m in latest.messages] == ["user", "assistant", "user", "assistant"]


def test_resume_after_the_chat_was_killed_mid_answer(smollm2_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "chat", "smollm2", "--max-tokens", "2000", *GREEDY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"Tell me a very long story about the sea.\n")
    proc.stdin.flush()
    assert len(os.read(proc.stdout.fileno(), 64)) > 0  # mid-answer
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    store = Store.open()
    try:
        assert store.integrity() == "ok"
    finally:
        store.close()
    [killed] = conversations()
    assert [m.role for m in killed.messages] == ["user"]  # the message was committed before the answer
    done = run_cli("chat", "--resume", "--max-tokens", "6", *GREEDY, input=b"Shorter, please.\n")
    assert done.returncode == 0, done.stderr
    [resumed] = conversations()
    assert [m.role for m in resumed.messages] == ["user", "user", "assistant"]
    assert resumed.id == killed.id


def test_continue_the_last_chat_from_a_shell() -> None:
    missing = run_cli("run", "-c", "Hello?")
    assert missing.returncode == 2 and b"no conversation to resume" in missing.stderr
    assert chat_pipe("Hi\n", "--max-tokens", "6").returncode == 0
    done = run_cli("run", "-c", "And then?", "--max-tokens", "6", *GREEDY)
    assert done.returncode == 0, done.stderr
    [conversation] = conversations()
    assert [m.content for m in conversation.messages if m.role == "user"] == ["Hi", "And then?"]
    assert done.stdout.decode() == conversation.messages[-1].content + "\n"
    assert run_cli("run", "smollm2", "hello", "--max-tokens", "2").returncode == 0  # one-shot: kept nowhere
    assert len(conversations()) == 1


def test_run_c_prints_json_that_parses_or_nothing_and_exit_1() -> None:
    # JSON that always parses, on this path too: --format json given to -c, or carried by the
    # conversation (as /set format json leaves it), holds the answer until it is checked
    assert chat_pipe("Describe a cat as JSON with a name and an age.\n", "--max-tokens", "40").returncode == 0
    whole = run_cli(
        "run",
        "-c",
        "Another cat as JSON, with a name and an age",
        "--format",
        "json",
        "--max-tokens",
        "200",
        *GREEDY,
    )
    assert whole.returncode == 0, whole.stderr
    assert isinstance(json.loads(whole.stdout), dict) and whole.stdout.endswith(b"}\n")
    [conversation] = conversations()
    assert conversation.settings["format"] == "json"  # kept with the conversation, as /set keeps it
    as_json = run_cli("run", "-c", "Now a dog, the same way", "--max-tokens", "200", "--json", *GREEDY)
    assert as_json.returncode == 0, as_json.stderr
    assert isinstance(json.loads(json.loads(as_json.stdout)["text"]), dict)  # the conversation's format
    for args in ((), ("--json",), ("--format", "json")):
        cut = run_cli("run", "-c", "Another cat please, in detail", "--max-tokens", "5", *args, *GREEDY)
        assert (cut.returncode, cut.stdout) == (1, b""), cut.stderr
        said = cut.stderr.decode()
        assert said.count("before its JSON closed") == 1 and "runner: error:" in said  # no warning beside
    [conversation] = conversations()
    assert len(conversation.messages) == 12  # each cut answer kept in the conversation, as chat keeps it
    for flag, value in (("--logprobs", "2"), ("--grammar", "g.gbnf")):
        refused = run_cli("run", "-c", "x", flag, value, "--json")
        assert refused.returncode == 2 and refused.stdout == b"", refused.stderr
        assert f"takes no {flag}".encode() in refused.stderr
    assert len(conversations()[0].messages) == 12  # the refused turns were never sent


def test_slash_command_errors_are_one_line_and_the_chat_goes_on(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": "nope"}')
    lines = f"/nope\n/set top-k many\n/load {tmp_path / 'missing.json'}\n/load {bad}\nHi\n"
    done = chat_pipe(lines, "--max-tokens", "4")
    assert done.returncode == 2  # some lines were refused
    err = done.stderr.decode()
    assert "unknown command /nope" in err
    assert "/set top-k needs an integer (got 'many')" in err
    assert "no such file:" in err and 'is not a runner conversation: no "messages" list' in err
    assert "Traceback" not in err and done.stdout.strip()  # Hi was still answered


def test_a_long_conversation_in_a_small_context_drops_the_oldest_turns() -> None:
    lines = "".join(f"Tell me fact number {i} about the moon, in one sentence.\n" for i in range(12))
    args = ("--max-tokens", "24", "--ctx", "256", "-s", "You are a moon expert.", "--compact", "off")
    done = chat_pipe(lines + "/show\n", *args)
    assert done.returncode == 0, done.stderr
    err = done.stderr.decode()
    assert "the context is full" in err and "oldest exchange" in err
    assert "no longer sent" in err and "'You are a moon expert.'" in err
    [conversation] = conversations()
    assert sum(1 for m in conversation.messages if m.role == "user") == 12  # the store keeps them all


@pytest.mark.model
def test_what_is_sent_after_dropping_keeps_the_system_message(engine) -> None:
    from runner.engine.conversation import fit
    from runner.engine.text.template import Message
    from runner.gguf import read_header

    header = read_header(engine.path)
    turns = []
    for i in range(40):
        turns += [Message("user", f"question {i} " * 10), Message("assistant", f"answer {i} " * 10)]
    fitted = fit(engine, header, "SYSTEM-KEPT", [*turns, Message("user", "last one")], max_tokens=64)
    text = fitted.prompt.text
    assert fitted.dropped_exchanges > 0 and "SYSTEM-KEPT" in text and "last one" in text
    assert "question 0 " not in text and len(fitted.prompt.tokens) + 64 <= engine.context.n_ctx


def test_a_message_longer_than_the_context_is_refused() -> None:
    done = chat_pipe("word " * 600 + "\nHi\n", "--ctx", "256", "--max-tokens", "4")
    assert done.returncode == 2
    assert re.search(rb"this message makes a [\d,]+-token prompt, .*--ctx \d+", done.stderr), done.stderr
    assert done.stdout.strip()  # and the next line was answered


def test_a_broken_database_never_stops_the_chat(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "conversations.db").write_bytes(b"garbage" * 1000)
    done = chat_pipe("Hi\n", "--max-tokens", "4", env={"RUNNER_DATA_DIR": str(corrupt)})
    assert done.returncode == 0 and done.stdout.strip()
    assert b"conversations are not saved" in done.stderr and b"Traceback" not in done.stderr
    assert (corrupt / "conversations.db").read_bytes() == b"garbage" * 1000  # never rewritten
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    done = chat_pipe("Hi\n", "--max-tokens", "4", env={"RUNNER_DATA_DIR": str(not_a_dir)})
    assert done.returncode == 0 and b"conversations are not saved" in done.stderr


def test_resume_without_a_conversation_is_exit_2() -> None:
    for args in (["--resume"], ["--resume", "42"], ["--resume", "x"]):
        done = run_cli("chat", *args, input=b"Hi\n")
        assert done.returncode == 2 and done.stderr.count(b"\n") == 1, done.stderr


def test_no_save_keeps_nothing(tmp_path: Path) -> None:
    assert chat_pipe("Hi\n", "--max-tokens", "2", "--no-save").returncode == 0
    assert chat_pipe("Hi\n", "--max-tokens", "2", env={"RUNNER_NO_SAVE": "1"}).returncode == 0
    assert not (Path(os.environ["RUNNER_DATA_DIR"]) / "conversations.db").exists()


def test_history_lists_shows_and_removes() -> None:
    assert chat_pipe("Hi there\n", "--max-tokens", "3").returncode == 0
    listed = run_cli("history")
    assert listed.returncode == 0 and listed.stdout.decode().split("\t")[1] == "chat"
    assert listed.stdout.decode().split("\t")[5].startswith("Hi there")
    cid = listed.stdout.split(b"\t")[0].decode()
    shown = json.loads(run_cli("history", "show", cid, "--json").stdout)
    assert shown["messages"][0] == {"role": "user", "content": "Hi there"}
    exported = json.loads(run_cli("history", "export", "--json").stdout)
    assert [c["id"] for c in exported] == [int(cid)]
    assert run_cli("history", "rm", cid).returncode == 0
    assert run_cli("history", "show", cid).returncode == 2


def test_run_without_a_prompt_on_a_terminal_opens_a_chat() -> None:
    child = spawn("run", "smollm2", "--max-tokens", "3")
    ready(child)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_the_store_is_consistent_under_many_writers(tmp_path: Path) -> None:
    """Two chats at once write the same database (WAL): both conversations are whole."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "runner", "chat", "smollm2", "--max-tokens", "3", *GREEDY],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    for p in procs:
        _, err = p.communicate(b"One\nTwo\nThree\n", timeout=120)
        assert p.returncode == 0, err
    found = conversations()
    assert len(found) == 2 and all(len(c.messages) == 6 for c in found)
    with sqlite3.connect(Path(os.environ["RUNNER_DATA_DIR"]) / "conversations.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.parametrize("name", ["/help"])
def test_help_lists_every_command(name: str) -> None:
    done = chat_pipe(f"{name}\n")
    assert done.returncode == 0
    for command in (
        "/set",
        "/show",
        "/clear",
        "/retry",
        "/undo",
        "/save",
        "/load",
        "/stats",
        "/history",
        "/edit",
    ):
        assert command.encode() in done.stderr


def test_edit_sends_what_the_editor_wrote_and_the_input_history_outlives_the_chat(tmp_path: Path) -> None:
    editor = tmp_path / "editor.sh"
    editor.write_text("#!/bin/sh\nprintf 'from the editor\\nline two\\n' > \"$1\"\n")
    editor.chmod(0o755)
    os.environ["EDITOR"] = str(editor)
    try:
        child = spawn("chat", "smollm2", "--max-tokens", "3", *GREEDY)
        ready(child)
        child.sendline("/edit")
        ready(child)
        child.sendline("/bye")
        child.expect(pexpect.EOF)
        child = spawn("chat", "smollm2", "--max-tokens", "3", *GREEDY, "--markdown")
        ready(child)
        child.send("\x1b[A\x1b[A")  # two lines up, from the last chat: /edit
        child.sendline("")
        ready(child)
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        del os.environ["EDITOR"]
    users = [m.content for c in conversations() for m in c.messages if m.role == "user"]
    assert users == ["from the editor\nline two", "from the editor\nline two"]


def test_chat_on_the_cpu_loads_without_flash_attention_unless_asked() -> None:
    from runner.loader import machine

    # loader.CPU_CHAT_FLASH_ATTN: llama.cpp's CPU kernel slows as a conversation fills the cache
    default = "auto" if machine().usable_gpus else "off"
    done = chat_pipe("/show\n")
    assert done.returncode == 0, done.stderr
    assert f"KV f16 · flash attention {default} ·" in done.stderr.decode()
    asked = chat_pipe("/show\n", "--flash-attn", "on")
    assert "KV f16 · flash attention on ·" in asked.stderr.decode()
    bad = chat_pipe("Hi\n", "--flash-attn", "yes")
    assert (bad.returncode, bad.stdout) == (2, b"")
    assert bad.stderr.decode().strip() == "runner: error: --flash-attn must be auto, on or off (got 'yes')"


def test_set_confirms_and_the_settings_come_back_on_resume() -> None:
    lines = "/set temperature 0.2\n/set top-k 5\n/set max-tokens 6\n/set think off\n/set seed 7\nHi\n"
    done = chat_pipe(lines, "--max-tokens", "30")  # GREEDY: --temperature 0, then /set 0.2
    assert done.returncode == 0, done.stderr
    assert done.stderr.decode().splitlines() == [
        "runner: temperature 0.2 (/set)",
        "runner: top-k 5 (/set)",
        "runner: max-tokens 6",
        "runner: think off",
        "runner: seed 7 (/set)",
    ]
    [conversation] = conversations()
    assert conversation.settings == {
        "temperature": 0.2,
        "top_k": 5,
        "seed": 7,
        "max_tokens": 6,
        "think": False,
    }
    resumed = run_cli("chat", "--resume", "--top-k", "9", input=b"/show\n")  # a flag wins over the stored
    assert resumed.returncode == 0, resumed.stderr
    shown = resumed.stderr.decode()
    assert "temperature=0.2 (conversation), top_k=9 (flag)" in shown and "seed=7 (conversation)" in shown
    assert re.search(r"max-tokens +6\n", shown) and re.search(r"think +off\n", shown)


def test_show_after_clear_and_the_model_file_once(smollm2_path: Path) -> None:
    done = run_cli(
        "chat", str(smollm2_path), *GREEDY, "--max-tokens", "8", input=b"Hi\n/show\n/clear\n/show\n"
    )
    assert done.returncode == 0, done.stderr
    before, after = done.stderr.decode().split("a new conversation")
    used = re.search(r"context +([\d,]+) of", before)
    assert used and int(used[1].replace(",", "")) > 10
    assert re.search(r"context +0 of [\d,]+ tokens used", after), after
    assert after.count(str(smollm2_path)) == 1  # "model PATH", not "PATH (PATH)", nor again under load


def test_save_writes_the_times_history_shows(tmp_path: Path) -> None:
    saved, unsaved = tmp_path / "talk.json", tmp_path / "unsaved.json"
    assert chat_pipe(f"Hi\n/save {saved}\n", "--max-tokens", "4").returncode == 0
    [conversation] = conversations()
    shown = json.loads(run_cli("history", "show", str(conversation.id), "--json").stdout)
    data = json.loads(saved.read_text())
    assert (data["created"], data["updated"]) == (shown["created"], shown["updated"])
    assert re.fullmatch(ISO_TIME, data["created"])
    assert chat_pipe(f"Hi\n/save {unsaved}\n", "--max-tokens", "4", "--no-save").returncode == 0
    kept_nowhere = json.loads(unsaved.read_text())  # times too, from its first and last messages
    assert all(re.fullmatch(ISO_TIME, kept_nowhere[k]) for k in ("created", "updated"))


def test_resume_shows_the_last_turns_and_history_the_rest() -> None:
    questions = [f"Question number {i}: what is {i} plus {i}?" for i in range(5)]
    assert chat_pipe("".join(q + "\n" for q in questions), "--max-tokens", "6").returncode == 0
    [conversation] = conversations()
    last_answer = conversation.messages[-1].content.splitlines()[0]
    child = spawn("chat", "--resume", "--max-tokens", "6", *GREEDY)
    child.expect_exact("5 turns so far")
    child.expect_exact("\x1b[?2004h")  # the prompt: what came before it is the recap
    recap = child.before
    assert "2 earlier turns: /history shows the whole conversation" in recap
    assert all(f"\x1b[2m>>> {q}" in recap for q in questions[2:])  # the last three, dimmed
    assert last_answer in recap and not any(q in recap for q in questions[:2])
    child.sendline("/history")
    for q in questions:
        child.expect_exact(">>> " + q)
    ready(child)
    child.sendline("/bye")
    child.expect(pexpect.EOF)


def test_run_c_with_another_model_says_so_and_each_answer_keeps_its_model(smollm2_path: Path) -> None:
    assert chat_pipe("Hi\n", "--max-tokens", "4").returncode == 0
    same = run_cli("run", "smollm2", "-c", "Again?", "--max-tokens", "4", *GREEDY)
    assert same.returncode == 0 and same.stderr == b"", same.stderr  # the conversation's own: no word
    other = str(smollm2_path)  # another name, so another model as far as the conversation knows
    switched = run_cli("run", other, "-c", "And then?", "--max-tokens", "4", *GREEDY)
    assert switched.returncode == 0, switched.stderr
    [cid] = [c.id for c in conversations()]
    assert switched.stderr.decode().splitlines() == [
        f"runner: conversation {cid} was held with smollm2; {other} answers it from here on "
        f"(runner history show {cid} names each answer's model)"
    ]
    after = run_cli("run", "-c", "And now?", "--max-tokens", "4", *GREEDY)  # goes on with the one named
    assert after.returncode == 0 and after.stderr == b"", after.stderr
    [conversation] = conversations()
    assert conversation.model == other
    assert [m.model for m in conversation.messages] == [
        None,
        "smollm2",
        None,
        "smollm2",
        None,
        other,
        None,
        other,
    ]
    shown = run_cli("history", "show", str(cid)).stdout.decode()
    assert f"assistant (smollm2): {conversation.messages[1].content}" in shown
    assert f"assistant ({other}): {conversation.messages[-1].content}" in shown
    listed = run_cli("history").stdout.decode()
    assert listed.split("\t")[2] == other
    exported = json.loads(run_cli("history", "show", str(cid), "--json").stdout)
    assert [m.get("model") for m in exported["messages"]] == [m.model for m in conversation.messages]


def test_continuations_at_once_take_turns_and_questions_keep_their_answers() -> None:
    """Six `runner run -c` at once on one conversation (the shell's `&`): each waits for the turn under
    way, then answers the conversation as it stands, so the store alternates and every question is
    followed by its own answer, the one its process printed."""
    assert chat_pipe("Hi\n", "--max-tokens", "4").returncode == 0
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "runner", "run", "-c", f"Turn {n}", "--max-tokens", "4", *GREEDY],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for n in range(1, 7)
    ]
    printed = {}
    for n, p in enumerate(procs, start=1):
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        assert set(err.decode().splitlines()) <= {
            "runner: conversation 1 is answering in another runner; this turn waits for it"
        }
        printed[f"Turn {n}"] = out.decode().rstrip("\n")
    [conversation] = conversations()
    roles = [m.role for m in conversation.messages]
    assert roles == ["user", "assistant"] * 7
    pairs = list(zip(conversation.messages[::2], conversation.messages[1::2], strict=True))
    assert sorted(q.content for q, _ in pairs[1:]) == sorted(printed)
    assert all(a.content == printed[q.content] for q, a in pairs[1:])
    # each answered the conversation as it stood: every prompt holds the exchanges before it
    prompts = [a.stats["prompt_tokens"] for _, a in pairs if a.stats]
    assert len(prompts) == 7 and prompts == sorted(prompts) and len(set(prompts)) == 7


def test_a_continuation_waits_for_the_turn_under_way_and_ctrl_c_stops_the_wait() -> None:
    from runner.store.turns import holding

    assert chat_pipe("Hi\n", "--max-tokens", "4").returncode == 0
    [cid] = [c.id for c in conversations()]
    store = Store.open()
    try:
        with holding(store, cid):  # a turn under way in another runner
            waiting = subprocess.Popen(
                [sys.executable, "-m", "runner", "run", "-c", "Still there?", "--max-tokens", "4", *GREEDY],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert waiting.stderr is not None
            line = waiting.stderr.readline().decode()
            assert (
                line == f"runner: conversation {cid} is answering in another runner; this turn waits for it\n"
            )
            waiting.send_signal(signal.SIGINT)
            out, err = waiting.communicate(timeout=30)
            assert waiting.returncode == 130 and out == b"" and b"Traceback" not in err, err
            assert [m.role for m in conversations()[0].messages] == ["user", "assistant"]  # nothing added
            queued = subprocess.Popen(
                [sys.executable, "-m", "runner", "run", "-c", "Now?", "--max-tokens", "4", *GREEDY],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert queued.stderr is not None and b"waits for it" in queued.stderr.readline()
        out, err = queued.communicate(timeout=60)  # the turn under way ended: this one goes on
        assert queued.returncode == 0 and out.strip(), err
    finally:
        store.close()
    assert [m.content for m in conversations()[0].messages if m.role == "user"] == ["Hi", "Now?"]
