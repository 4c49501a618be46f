"""The prompt cache on disk, with the real model: hits, misses, bad files, concurrent writers."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from runner.engine import promptcache
from runner.engine.engine import Engine
from runner.engine.promptcache import MIN_HEAD, PromptCache
from runner.engine.text.sampling import SamplingConfig
from tests.conftest import run_cli
from tests.serving import same_unless_near_tie

GREEDY = SamplingConfig(temperature=0)
WORDS = [
    "river",
    "mountain",
    "city",
    "lighthouse",
    "keeper",
    "ship",
    "storm",
    "harbour",
    "bread",
    "market",
    "garden",
    "forest",
]


def document(seed: int = 1, words: int = 500) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RUNNER_HOME", str(tmp_path))
    return tmp_path


def greedy_run(model: Path, question: str, max_tokens: int, *extra: str) -> list[str]:
    """`runner run`'s arguments for a greedy answer of at most max_tokens, on a fixed thread count: the
    answers of separate processes are compared, and llama.cpp's kernels may round a near tie the other
    way on another count (the count adapts to the machine's load: docs/speed.md)."""
    return [
        "run", str(model), question, "--temperature", "0", "--max-tokens", str(max_tokens), "--threads", "2",
        *extra,
    ]  # fmt: skip


def ask(model: Path, question: str, doc: str, *extra: str) -> dict:
    proc = run_cli(*greedy_run(model, question, 16, "--json", *extra), input=doc.encode())
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


def entries(home: Path) -> list[Path]:
    return sorted((home / "cache" / "prompts").glob("*.kv"))


def test_a_second_call_with_the_same_head_loads_it(smollm2_path: Path, home: Path) -> None:
    doc = document()
    cold = ask(smollm2_path, "What is this about?", doc)
    assert cold["prompt_cache"]["stored_tokens"] >= MIN_HEAD and len(entries(home)) == 1
    warm = ask(smollm2_path, "What is this about?", doc)
    assert warm["prompt_cache"] == {
        "loaded_tokens": cold["prompt_cache"]["stored_tokens"],
        "stored_tokens": 0,
        "write_s": 0.0,
    }
    assert warm["text"] == cold["text"]  # the same split of the prefill: the same answer
    other = ask(smollm2_path, "Name a word in it.", doc)  # another question, the same head
    assert other["prompt_cache"]["loaded_tokens"] == cold["prompt_cache"]["stored_tokens"]
    off = ask(smollm2_path, "What is this about?", doc, "--no-prompt-cache")
    assert "prompt_cache" not in off and len(entries(home)) == 1  # (answers: the in-process test)
    changed = ask(smollm2_path, "What is this about?", document(seed=2))  # another document: a miss
    assert changed["prompt_cache"]["loaded_tokens"] == 0 and len(entries(home)) == 2


@pytest.mark.model
def test_greedy_answers_are_the_same_with_and_without_the_cache(
    engine: Engine, smollm2_path: Path, tmp_path: Path
) -> None:
    from runner.engine.prompt import render_prompt
    from runner.engine.text.template import Message
    from runner.gguf import read_header

    cache = PromptCache(tmp_path, promptcache.DEFAULT_LIMIT, pytest.fail)
    header = read_header(smollm2_path)
    for seed in (3, 4):
        head_text = document(seed, 300)
        prompt = render_prompt(engine, header, [Message("user", head_text + "\n\nSummarize this.")]).tokens
        probe = render_prompt(engine, header, [Message("user", head_text + "\n\n\x00")]).tokens
        head = next(i for i, (a, b) in enumerate(zip(prompt, probe, strict=False)) if a != b)
        engine.context.reset()
        plain = engine.generate(prompt, GREEDY, max_tokens=40)
        engine.context.reset()
        cold = engine.generate(prompt, GREEDY, max_tokens=40, prompt_cache=cache, head=head)
        engine.context.reset()
        warm = engine.generate(prompt, GREEDY, max_tokens=40, prompt_cache=cache, head=head)
        assert cold.timings.prompt_cache.stored_tokens == head == warm.timings.prompt_cache.loaded_tokens
        assert warm.timings.prefill_tokens == len(prompt) - head
        assert warm.text == cold.text
        same_unless_near_tie(engine, prompt, plain.text, warm.text)


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign", "empty"])
def test_a_bad_file_is_never_loaded_and_is_replaced(smollm2_path: Path, home: Path, damage: str) -> None:
    doc = document()
    first = ask(smollm2_path, "What is this about?", doc)
    [file] = entries(home)
    data = bytearray(file.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 3]
    elif damage == "foreign":  # a valid file of another head, under this one's name
        other = document(seed=9)
        ask(smollm2_path, "What is this about?", other)
        data = bytearray(next(f for f in entries(home) if f != file).read_bytes())
    else:
        data = bytearray()
    file.write_bytes(bytes(data))
    again = ask(smollm2_path, "What is this about?", doc)
    assert again["prompt_cache"]["loaded_tokens"] == 0  # not loaded: stored afresh
    assert again["prompt_cache"]["stored_tokens"] == first["prompt_cache"]["stored_tokens"]
    assert again["text"] == first["text"]
    assert ask(smollm2_path, "What is this about?", doc)["prompt_cache"]["loaded_tokens"] > 0


def test_an_unwritable_cache_warns_once_and_answers(smollm2_path: Path, home: Path) -> None:
    (home / "cache").mkdir()
    (home / "cache" / "prompts").write_text("not a folder")  # unwritable even for root
    proc = run_cli(*greedy_run(smollm2_path, "What is this about?", 8), input=document().encode())
    err = proc.stderr.decode()
    assert proc.returncode == 0 and proc.stdout.strip(), err
    assert err.count("the prompt cache is off for this call") == 1 and len(err.strip().splitlines()) == 1, err


def test_two_processes_writing_one_entry_leave_one_whole_file(smollm2_path: Path, home: Path) -> None:
    doc = document()
    args = [sys.executable, "-m", "runner", *greedy_run(smollm2_path, "What is this about?", 4, "--json")]
    procs = [
        subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outs = [p.communicate(doc.encode(), timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert len(entries(home)) == 1 and not list((home / "cache" / "prompts").glob(".*"))
    assert ask(smollm2_path, "What is this about?", doc)["prompt_cache"]["loaded_tokens"] > 0


@pytest.mark.model
def test_least_recently_used_entries_go_first(engine: Engine, tmp_path: Path) -> None:
    heads = [engine.model.tokenize(document(seed, 300)) for seed in range(3)]
    cache = PromptCache(tmp_path, 1 << 40, pytest.fail)

    def store(head: list[int]) -> Path:
        engine.context.reset()
        engine.context.prefill(head)
        assert cache.store(engine.context, head).stored_tokens == len(head)
        return cache._file(cache.identity(engine.context), head)

    files = [store(heads[0]), store(heads[1])]
    os.utime(files[0], (1, 1))
    os.utime(files[1], (2, 2))  # both old; then a use refreshes the second
    engine.context.reset()
    assert cache.restore(engine.context, heads[1] + [13]).loaded_tokens == len(heads[1])
    cache.limit = int(max(f.stat().st_size for f in files) * 2.5)
    files.append(store(heads[2]))
    assert [f.exists() for f in files] == [False, True, True]  # the least recently used went
    engine.context.reset()
    assert cache.restore(engine.context, heads[0] + [13]).loaded_tokens == 0


def test_another_kv_type_never_matches(smollm2_path: Path, home: Path) -> None:
    doc = document()
    ask(smollm2_path, "What is this about?", doc)
    q8 = ask(smollm2_path, "What is this about?", doc, "--kv-type", "q8_0")
    assert q8["prompt_cache"]["loaded_tokens"] == 0 and len(entries(home)) == 2


def test_runner_cache_shows_and_clears(smollm2_path: Path, home: Path) -> None:
    ask(smollm2_path, "What is this about?", document())
    shown = json.loads(run_cli("cache", "--json").stdout)
    assert shown["entries"] == 1 and shown["bytes"] == entries(home)[0].stat().st_size
    cleared = run_cli("cache", "--clear")
    assert cleared.returncode == 0 and b"removed 1 prompt cache entry" in cleared.stdout
    assert entries(home) == []
    bad = run_cli("run", str(smollm2_path), "Hi", "--prompt-cache-size", "lots")
    assert bad.returncode == 2 and b"--prompt-cache-size" in bad.stderr


def test_a_resumed_conversation_loads_its_state(smollm2_path: Path, home: Path) -> None:
    first = f"Here are my notes: {document(words=400)} What is the first word?\n"
    chat = run_cli(
        "chat", str(smollm2_path), "--temperature", "0", "--max-tokens", "12", input=first.encode()
    )
    assert chat.returncode == 0, chat.stderr.decode()
    assert len(entries(home)) == 1  # kept as the chat ended
    more = run_cli(
        "run",
        "-c",
        "And the last word?",
        "--json",
        "--temperature",
        "0",
        "--max-tokens",
        "8",
        env={"RUNNER_NO_SAVE": ""},
    )
    assert more.returncode == 0, more.stderr.decode()
    data = json.loads(more.stdout)
    assert data["prompt_cache"]["loaded_tokens"] > 400


def test_a_longer_head_is_stored_after_a_shorter_one_was_loaded(smollm2_path: Path, home: Path) -> None:
    """`-s @style.md` alone stores the system head; with a document piped in, that head is loaded and
    the longer one (system and document) is stored too, and loaded by the next call."""
    system = "You are a careful assistant. " + document(seed=5, words=80)
    args = ["--system", system]
    first = ask(smollm2_path, "Say hi.", "", *args)
    short = first["prompt_cache"]["stored_tokens"]
    assert short >= MIN_HEAD
    doc = document(seed=6, words=200)
    second = ask(smollm2_path, "What is this about?", doc, *args)
    assert second["prompt_cache"]["loaded_tokens"] == short
    longer = second["prompt_cache"]["stored_tokens"]
    assert longer > short + 150 and len(entries(home)) == 2
    third = ask(smollm2_path, "Name a word in it.", doc, *args)
    assert third["prompt_cache"] == {"loaded_tokens": longer, "stored_tokens": 0, "write_s": 0.0}


@pytest.mark.model
def test_a_full_disk_turns_the_cache_off_with_one_warning(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    warnings: list[str] = []
    cache = PromptCache(tmp_path, promptcache.DEFAULT_LIMIT, warnings.append)
    head = engine.model.tokenize(document(seed=8, words=100))
    engine.context.reset()
    engine.context.prefill(head)
    real_write = promptcache.os.replace

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(promptcache.os, "replace", full)
    assert cache.store(engine.context, head).stored_tokens == 0
    assert cache.store(engine.context, head).stored_tokens == 0  # off: not tried again, not warned again
    assert len(warnings) == 1 and "No space left on device" in warnings[0]
    assert list(tmp_path.iterdir()) == []  # the partial file is gone
    monkeypatch.setattr(promptcache.os, "replace", real_write)
    engine.context.reset()
    assert cache.restore(engine.context, [*head, 13]).loaded_tokens == 0


@pytest.mark.fast
def test_the_size_limit_reads_decimal_units_as_runner_prints_them() -> None:
    from runner.engine.promptcache import parse_size

    assert parse_size("500M") == parse_size("500MB") == 500_000_000
    assert parse_size("2G") == promptcache.DEFAULT_LIMIT == 2_000_000_000
    assert parse_size("1KiB") == 1024 and parse_size("3GiB") == 3 << 30
    assert parse_size("1.5k") == 1500 and parse_size("42") == 42
