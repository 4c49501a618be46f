"""SIGTERM and SIGHUP, sent to real runner processes mid-answer: nothing lost, the store consistent.

`timeout 60 runner run -c …` once ended by SIGTERM's default action: the answer so far was gone and
the conversation was left with its user turn unanswered, so the next `run -c` stored two user turns
in a row. Now they take Ctrl-C's path (runner.interrupt): the partial answer is kept and stored,
marked interrupted, and the exit code is 128 + the signal (143, 129). Where Ctrl-C only stops an
answer (a chat on a terminal), they end the process too.

Each test waits for a state it can see (the answer's first words, a prompt), never for a time, and
what it interrupts cannot end first on any machine: the chats answer with `endless`, a scripted model
whose answer only a signal, --max-tokens or a full context ends, and which is longer than a pipe or a
terminal holds, so that it stalls while the test is not reading. Every process starts with SIGINT,
SIGTERM and SIGHUP at their defaults, as a terminal's shell starts it: a suite run under nohup, or as
a script's background job (SIGINT ignored), would pass its ignored signals on, and runner rightly
keeps a signal its parent ignores.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pexpect
import pytest

from runner.store import Store, StoredConversation
from tests.conftest import run_cli
from tests.fakehub import FakeHub, fake_hub_fixture, hf_env

GREEDY = ["--temperature", "0"]
LONG = "Tell me a very long story about the sea."
# endless's context and answer: 30,000 tokens of ~5 bytes make ~150 KB, where a pipe holds 64 KiB and a
# terminal ~18 KiB; --max-tokens keeps runner from ending a loop it sees (Job.stop_loops), and leaves
# the turns before room in the context.
ENDLESS_CTX = 32768
ENDLESS = [*GREEDY, "--ctx", str(ENDLESS_CTX), "--max-tokens", "30000"]
PROMPT_DONE = "\x1b[?2004l"  # prompt_toolkit turns bracketed paste off as the prompt returns the line
WORDS = r"\w+\W+\w+\W+\w+"  # the answer has begun


def _default_signals() -> None:
    """In the child, before runner starts: SIGINT, SIGTERM and SIGHUP as a terminal's shell leaves
    them, whatever this process inherited (nohup ignores SIGHUP; a script's `&` ignores SIGINT)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


@pytest.fixture(scope="module")
def endless(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scripted model on SmolLM2's tokenizer (tests/synth.py): "Hi" is answered " there", and a
    message ending in "." with " apple pear plum" over and over, which no end of text ever stops."""
    from runner.engine.engine import Engine
    from tests.synth import set_context_length, write_scripted

    with Engine(smollm2_path, n_ctx=256, n_threads=1) as vocab:
        hi, there, dot, a, b, c = (
            vocab.model.tokenize(text, add_special=False)[-1]
            for text in (" Hi", " there", LONG, " apple", " pear", " plum")
        )
        [end] = vocab.model.tokenize(vocab.model.eos_text, add_special=False)
        assert vocab.model.is_end(end) and vocab.model.tokenize(" Hi", add_special=False) == [hi]
    says = "{% for m in messages %} {{ m['content'] }}{% endfor %}"  # a prompt ends with its last message
    path = tmp_path_factory.mktemp("endless") / "endless.gguf"
    write_scripted(path, smollm2_path, [hi, there, end, dot, a, b, c, a], template=says)
    return set_context_length(path, ENDLESS_CTX)


def _start(*args: str, stdin: Any = subprocess.PIPE) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "runner", *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_default_signals,
    )


def _answer_begun(proc: subprocess.Popen[bytes], *, after: int = 0) -> bytes:
    """What stdout had once the answer after the first `after` answers (one line each) has begun,
    past the load and the prefill, however slow the machine. Nothing more is read: an answer longer
    than the pipe holds then waits for the test."""
    assert proc.stdout is not None
    got = b""
    deadline = time.monotonic() + 120
    while len(got.split(b"\n", after)[-1].strip()) < 20 or got.count(b"\n") < after:
        assert time.monotonic() < deadline, f"no answer within 120 s: {got!r}"
        piece = os.read(proc.stdout.fileno(), 64)
        assert piece, f"stdout closed before the answer began: {got!r}"
        got += piece
    return got


def _stop(proc: subprocess.Popen[bytes], signum: int, *, again: float | None = None) -> tuple[bytes, bytes]:
    """Send the signal (and the same once more, `again` seconds later), then collect what is left."""
    proc.send_signal(signum)
    if again is not None:
        time.sleep(again)
        proc.send_signal(signum)
    try:
        rest, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"runner did not exit within 30 s of {signal.Signals(signum).name}")
    assert b"Traceback" not in err and b"Exception ignored" not in err, err
    return rest, err


def _conversations() -> list[StoredConversation]:
    store = Store.open()
    try:
        assert store.integrity() == "ok"
        found = [store.load(s.id) for s in reversed(store.summaries())]
        return [c for c in found if c is not None]
    finally:
        store.close()


def _roles(conversation: StoredConversation) -> list[str]:
    return [m.role for m in conversation.messages]


def _ends_interrupted(conversation: StoredConversation, prompt: str, printed: bytes) -> None:
    """The conversation ends with the prompt and then the partial answer, marked interrupted: the
    text that was printed."""
    user, answer = conversation.messages[-2:]
    assert (user.role, user.content) == ("user", prompt)
    assert answer.role == "assistant" and answer.interrupted, answer
    assert answer.content and printed.decode().strip() == answer.content.strip(), (printed, answer.content)


@pytest.mark.timeout(300)
def test_sigterm_to_run_c_keeps_the_partial_answer_and_exits_143() -> None:
    assert run_cli("chat", "smollm2", "--max-tokens", "6", *GREEDY, input=b"Hi\n").returncode == 0
    proc = _start("run", "-c", LONG, "--max-tokens", "2000", *GREEDY, stdin=subprocess.DEVNULL)
    got = _answer_begun(proc)
    rest, err = _stop(proc, signal.SIGTERM, again=0.01)  # a second one does not cut the saving short
    assert proc.returncode == 143, err
    [conversation] = _conversations()
    assert _roles(conversation) == ["user", "assistant", "user", "assistant"]
    _ends_interrupted(conversation, LONG, got + rest)
    # the next turn follows the partial answer: never two user turns in a row
    after = run_cli("run", "-c", "Shorter, please.", "--max-tokens", "6", *GREEDY)
    assert after.returncode == 0, after.stderr
    [conversation] = _conversations()
    assert _roles(conversation) == ["user", "assistant"] * 3


@pytest.mark.timeout(300)
def test_sighup_to_a_piped_chat_keeps_the_partial_answer_and_exits_129(endless: Path) -> None:
    proc = _start("chat", str(endless), *ENDLESS)
    assert proc.stdin is not None
    proc.stdin.write(f"Hi\n{LONG}\n".encode())
    proc.stdin.flush()  # stdin stays open: the chat would wait for more
    got = _answer_begun(proc, after=1)  # the first answer (a few words), and the long one begun
    rest, err = _stop(proc, signal.SIGHUP)
    assert proc.returncode == 129, err
    [conversation] = _conversations()
    assert _roles(conversation) == ["user", "assistant", "user", "assistant"]
    first = conversation.messages[1].content
    printed = got + rest
    assert printed.startswith(first.encode() + b"\n"), (printed, first)
    _ends_interrupted(conversation, LONG, printed[len(first) + 1 :])


def _terminal_chat_mid_answer(model: Path) -> pexpect.spawn:
    """`runner chat` on a terminal, asked for an endless answer, once its first words have come (pexpect
    reads no more until asked: the answer then waits on the full terminal)."""
    env = {**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm"}
    child = pexpect.spawn(
        sys.executable,
        ["-m", "runner", "chat", str(model), *ENDLESS],
        env=env,
        encoding="utf-8",
        timeout=120,
        dimensions=(40, 160),
        preexec_fn=_default_signals,
    )
    child.expect_exact(">>>")
    child.sendline(LONG)
    child.expect_exact(PROMPT_DONE)
    child.expect(WORDS)
    return child


@pytest.mark.timeout(300)
def test_a_reader_gone_mid_answer_keeps_the_partial_answer_and_exits_141(endless: Path) -> None:
    """`runner chat | head`: head has what it wanted and goes. The write that fails then (EPIPE; on a
    hung-up terminal EIO, which a write can meet before the SIGHUP is handled) stops the answer, and
    what came is kept, as after a Ctrl-C, where the write's OSError once lost it."""
    proc = _start("chat", str(endless), *ENDLESS)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{LONG}\n".encode())
    proc.stdin.flush()  # stdin stays open: only the reader's going ends the chat
    got = _answer_begun(proc)
    proc.stdout.close()  # the pipe's reader goes, its 64 KiB unread
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("runner did not exit within 30 s of its reader going")
    assert b"Traceback" not in err and proc.returncode == 141, err
    [conversation] = _conversations()
    assert _roles(conversation) == ["user", "assistant"]
    answer = conversation.messages[-1]
    assert answer.interrupted, answer
    assert answer.content.strip().startswith(got.decode().strip()), (got, answer.content)


@pytest.mark.timeout(300)
def test_sigterm_to_a_terminal_chat_ends_it_where_ctrl_c_would_not(endless: Path) -> None:
    """On a terminal, Ctrl-C stops the answer and the prompt returns; SIGTERM stops the answer, keeps
    it, and ends the chat."""
    child = _terminal_chat_mid_answer(endless)
    child.kill(signal.SIGTERM)
    child.expect(pexpect.EOF, timeout=30)
    child.close()
    assert child.exitstatus == 143, (child.exitstatus, child.signalstatus, child.before)
    assert "Traceback" not in child.before
    [conversation] = _conversations()
    assert _roles(conversation) == ["user", "assistant"]
    assert conversation.messages[-1].interrupted and conversation.messages[-1].content


@pytest.mark.timeout(300)
def test_a_closed_terminal_ends_the_chat_with_129_and_keeps_the_answer(endless: Path) -> None:
    """The terminal goes (its master side closed): the chat gets SIGHUP, and every write after it
    would fail (EIO); the partial answer is stored all the same."""
    child = _terminal_chat_mid_answer(endless)
    terminal = child.ptyproc
    terminal.fileobj.close()  # the terminal window closes: the kernel hangs its pty up
    deadline = time.monotonic() + 30
    while terminal.isalive():
        assert time.monotonic() < deadline, "runner did not exit within 30 s of the terminal closing"
        time.sleep(0.05)
    assert (terminal.exitstatus, terminal.signalstatus) == (129, None)
    [conversation] = _conversations()
    assert _roles(conversation) == ["user", "assistant"]
    assert conversation.messages[-1].interrupted and conversation.messages[-1].content


@pytest.mark.timeout(300)
def test_sigterm_mid_batch_leaves_only_whole_json_lines_and_exits_143(
    smollm2_path: Path, tmp_path: Path
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(
        "".join(f"Write a long story about a {w}.\n" for w in ["cat", "dog", "owl", "fox", "cow", "pig"])
    )
    args = ["--each-line", "--jsonl", "--parallel", "2", "--max-tokens", "60"]
    with prompts.open("rb") as stdin:
        proc = _start("run", str(smollm2_path), *args, stdin=stdin)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # the first answer is out: the others are still being written
    rest, err = _stop(proc, signal.SIGTERM)
    assert proc.returncode == 143, err
    written = (first + rest).decode()
    assert written.endswith("\n")  # no half line
    records = [json.loads(line) for line in written.splitlines()]
    assert 1 <= len(records) < 6  # stopped before the end
    assert [r["id"] for r in records] == list(range(1, len(records) + 1))
    assert all(r["finish_reason"] == "length" for r in records)  # finished answers only


@pytest.mark.timeout(600)
def test_sigterm_and_sighup_at_random_moments_never_hang_nor_print_a_traceback(smollm2_path: Path) -> None:
    args = ["run", "smollm2", "List the planets, with one fact each.", *GREEDY, "--max-tokens", "24"]
    start = time.perf_counter()
    whole = run_cli(*args)
    took = time.perf_counter() - start
    assert whole.returncode == 0, whole.stderr
    rng = random.Random(5)
    codes: collections.Counter[int] = collections.Counter()
    for _ in range(12):
        signum = rng.choice([signal.SIGTERM, signal.SIGHUP])
        proc = _start(*args, stdin=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 1.05 * took))  # start-up, load, prefill, decode, teardown
        out, err = _stop(proc, signum, again=rng.uniform(0, 0.2) if rng.random() < 0.3 else None)
        codes[proc.returncode] += 1
        # 128 + signal: runner saw it. -signal: it came after main() returned, in Python's own
        # finalization (the defaults back): the process ends by the signal, as a shell reports the
        # same. 0: the answer was complete before the signal.
        assert proc.returncode in (0, 128 + signum, -signum), (proc.returncode, err)
        assert whole.stdout.startswith(out.rstrip(b"\n")), (out, whole.stdout)  # what was printed stays
    assert codes[143] + codes[129] >= 4, codes


fake_hub = fake_hub_fixture()


@pytest.mark.timeout(120)
def test_sigterm_mid_pull_keeps_the_partial_file_for_the_next_pull(fake_hub: FakeHub, tmp_path: Path) -> None:
    from huggingface_hub import constants

    from runner.hub.catalog import load_catalog
    from runner.hub.fetch import pull
    from runner.hub.refs import resolve
    from tests.synth import write_gguf

    data = write_gguf(tmp_path / "big-Q4_K_M.gguf", padding=3_000_000).read_bytes()
    fake_hub.add_repo("user/big-GGUF", {"big-Q4_K_M.gguf": data})
    whole_file = lambda info: "cdn-lfs" in info.path and "Range" not in info.headers  # noqa: E731
    fake_hub.add_fault(whole_file, "stall", seconds=60, after=1_000_000)  # mid-download, for a while
    cache = Path(constants.HF_HUB_CACHE)
    env = hf_env(fake_hub.endpoint, cache)
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", "pull", "user/big-GGUF"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_default_signals,
    )
    deadline = time.monotonic() + 60
    partial: list[Path] = []
    while not partial or partial[0].stat().st_size < 1_000_000:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the download did not reach the stall within 60 s"
        time.sleep(0.05)
        partial = list(cache.glob("models--user--big-GGUF/blobs/*.incomplete"))
    _, err = _stop(proc, signal.SIGTERM)
    assert proc.returncode == 143, err
    have = partial[0].stat().st_size
    assert have >= 1_000_000  # kept, to be resumed
    fake_hub.clear_faults()
    fake_hub.reset_counters()
    assert pull(resolve("user/big-GGUF", load_catalog())).path.read_bytes() == data
    assert fake_hub.sent("cdn-lfs") == len(data) - have  # it went on from where it stopped
