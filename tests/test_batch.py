"""Many prompts decoded together with the real model: same answers, input order, bad lines in place."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from runner.engine.answer import Result
from runner.engine.batch import run_batch, shared_prefix
from runner.engine.engine import Engine
from runner.engine.llamacpp import llama
from runner.engine.loop import Loop
from runner.engine.prefix import PrefixStore, StateCache
from runner.engine.prompt import render_prompt
from runner.engine.request import bare
from runner.engine.sequence import Job
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.template import Message
from runner.gguf import read_header
from runner.settings import LoadSettings
from tests.conftest import run_cli
from tests.serving import QUESTIONS, same_unless_near_tie

GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def batch_engine(smollm2_path: Path):
    with Engine(smollm2_path, n_ctx=4 * 1024, n_threads=2, n_seq=4) as engine:
        yield engine


def prompts(
    engine: Engine, path: Path, system: str | None = "You are a helpful assistant."
) -> list[list[int]]:
    header = read_header(path)
    head = [Message("system", system)] if system else []
    return [render_prompt(engine, header, [*head, Message("user", q)]).tokens for q in QUESTIONS]


@pytest.mark.model
def test_greedy_answers_are_the_same_alone_and_batched(
    batch_engine: Engine, engine: Engine, smollm2_path: Path
):
    tokens = prompts(batch_engine, smollm2_path)
    done: dict[int, object] = {}
    stats = run_batch(
        batch_engine,
        [bare(t, GREEDY, max_tokens=32) for t in tokens],
        lambda d: done.__setitem__(d.index, d),
    )
    assert stats.completion_tokens > 0 and sorted(done) == list(range(len(QUESTIONS)))
    same = 0
    for i, t in enumerate(tokens):
        engine.context.reset()
        alone = engine.generate(t, GREEDY, max_tokens=32).text
        same += same_unless_near_tie(engine, t, alone, done[i].text)  # type: ignore[attr-defined]
    assert same >= len(QUESTIONS) - 2  # measured here: all 8 the same


@pytest.mark.model
def test_the_shared_head_is_evaluated_once(batch_engine: Engine, engine: Engine, smollm2_path: Path) -> None:
    system = "You answer in one short sentence. " * 20  # a long system prompt every prompt shares
    tokens = prompts(batch_engine, smollm2_path, system)
    shared = shared_prefix(tokens)
    assert shared > 100
    jobs = [bare(t, GREEDY, max_tokens=8) for t in tokens]
    texts: dict[bool, dict[int, str]] = {True: {}, False: {}}
    evaluated: dict[int, int] = {}

    def copied(d: Result) -> None:
        texts[True][d.index] = d.text
        evaluated[d.index] = d.timings.prefill_tokens

    with_copy = run_batch(batch_engine, jobs, copied)
    without = run_batch(
        batch_engine, jobs, lambda d: texts[False].__setitem__(d.index, d.text), share_prefix=False
    )
    assert without.prefill_tokens == sum(len(t) for t in tokens) and without.cached_tokens == 0
    # the head once, then each prompt at most its own tail (less where an earlier prompt, done by
    # then, shared more than the head: its sequence copied instead)
    assert all(evaluated[i] <= len(t) - shared for i, t in enumerate(tokens))
    assert with_copy.prefill_tokens == sum(evaluated.values()) + shared
    assert with_copy.prefill_tokens + with_copy.cached_tokens == sum(len(t) for t in tokens) + shared
    # the same answers, but for near ties: a head evaluated alone is a different batch shape, and
    # llama.cpp's CPU kernels round differently by batch size (measured: 2 of 8 flip, one token in)
    for i, t in enumerate(tokens):
        same_unless_near_tie(engine, t, texts[False][i], texts[True][i])


def counting(engine: Engine, first: int, n: int = 6) -> list[int]:
    """A raw prompt SmolLM2 goes on counting from: an answer as long as max_tokens, every time."""
    return engine.model.tokenize(", ".join(str(first + k) for k in range(n)) + ",", add_special=True)


def answer_all(loop: Loop, jobs: list[Job]) -> None:
    for job in jobs:
        loop.add(job)
        while loop.busy():
            loop.step()


@pytest.mark.model
def test_kept_states_stay_within_their_limit_least_recently_used_out_first(batch_engine: Engine) -> None:
    """One sequence, eight prompts one after another: each takes the sequence from the one before,
    whose state goes to the StateCache, which never holds more than its limit."""
    tokens = [counting(batch_engine, 100 * k + 101) for k in range(8)]  # each as many tokens
    batch_engine.context.reset()
    loop = Loop(batch_engine, lambda d: None, parallel=1)
    answer_all(loop, [Job(0, tokens[0], GREEDY, max_tokens=16)])
    one = int(
        llama().llama_state_seq_get_size(batch_engine.context.ctx, 0)
    )  # a prompt and its answer's state
    loop.close()
    batch_engine.context.reset()
    states = StateCache(int(2.5 * one))
    loop = Loop(batch_engine, lambda d: None, parallel=1, store=PrefixStore(ram=states))
    held = []
    for i, t in enumerate(tokens):
        answer_all(loop, [Job(i, t, GREEDY, max_tokens=16)])
        held.append(states.held)
    loop.close()
    batch_engine.context.reset()
    assert states.saved == len(tokens) - 1  # each but the last, when the next took its sequence
    assert max(held) <= states.limit and len(states) == 2
    for i, t in enumerate(tokens[:-1]):
        found = states.best(t, len(t))[1]
        assert found == len(t) if i >= len(tokens) - 3 else found < 4, (i, found)  # the two most recent


@pytest.mark.model
def test_a_prompt_back_after_its_sequence_was_taken_is_restored_and_its_longer_state_kept(
    batch_engine: Engine,
) -> None:
    """A prompt whose sequence another took is restored from the StateCache (only its new tokens
    evaluated) and answers as it would have in its own sequence; its next, longer state replaces
    the shorter one it extends."""
    first, other = counting(batch_engine, 1), counting(batch_engine, 500)
    batch_engine.context.reset()
    done: dict[int, Result] = {}
    loop = Loop(batch_engine, lambda d: done.__setitem__(d.index, d), parallel=1)
    answer_all(loop, [Job(0, first, GREEDY, max_tokens=16)])
    turn = first + batch_engine.model.tokenize(done[0].text + " 40, 41,", add_special=False)
    answer_all(loop, [Job(1, turn, GREEDY, max_tokens=16)])  # in its own sequence: the reference
    loop.close()
    batch_engine.context.reset()
    states = StateCache(1 << 30)
    store = PrefixStore(ram=states)
    loop = Loop(batch_engine, lambda d: done.__setitem__(d.index, d), parallel=1, store=store)
    answer_all(loop, [Job(2, first, GREEDY, max_tokens=16), Job(3, other, GREEDY, max_tokens=16)])
    assert (states.saved, states.restored) == (1, 0)
    answer_all(loop, [Job(4, turn, GREEDY, max_tokens=16)])
    assert states.restored == 1
    # as in its own sequence: the new tokens
    assert done[4].timings.prefill_tokens == done[1].timings.prefill_tokens
    assert done[4].text == done[1].text
    answer_all(loop, [Job(5, other, GREEDY, max_tokens=16)])
    loop.close()
    batch_engine.context.reset()
    # kept: `other` (when `turn` took the sequence), `turn` (when `other` came back); `first` was
    # dropped then, as `turn` holds all of it
    assert states.saved == 3 and len(states) == 2
    assert states.best(turn, len(turn))[1] == len(turn)


def test_each_line_keeps_input_order_and_answers_around_a_bad_line(smollm2_path: Path) -> None:
    lines = "What is the capital of France?\n\nName a planet.\nWhat do bees make?\n"
    done = run_cli(
        "run",
        str(smollm2_path),
        "--each-line",
        "--jsonl",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        input=lines.encode(),
    )
    assert done.returncode == 2, done.stderr  # one line was bad input
    records = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [r["id"] for r in records] == [1, 2, 3, 4]
    assert records[1] == {"id": 2, "error": "line 2 is empty"}
    assert all(r["text"] for r in records if "error" not in r)
    alone = run_cli("run", str(smollm2_path), "Name a planet.", "--temperature", "0", "--max-tokens", "12")
    assert records[2]["text"] == alone.stdout.decode().strip()
    plain = run_cli(
        "run",
        str(smollm2_path),
        "--each-line",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        input=lines.encode(),
    )
    out = plain.stdout.decode().split("\n")
    assert len(out) == 5 and out[1] == "" and out[4] == ""  # one line per input line, the bad one empty
    assert out[2] == " ".join(records[2]["text"].split("\n")).strip()


def test_a_template_puts_each_line_in_place(smollm2_path: Path) -> None:
    done = run_cli(
        "run",
        str(smollm2_path),
        "Translate to French: {}",
        "--each-line",
        "--jsonl",
        "--max-tokens",
        "4",
        input=b"cat\ndog\n",
    )
    assert done.returncode == 0, done.stderr
    plain = run_cli(
        "run", str(smollm2_path), "--each-line", "--jsonl", "--max-tokens", "4", input=b"cat\ndog\n"
    )
    with_template = [json.loads(line)["usage"]["prompt_tokens"] for line in done.stdout.decode().splitlines()]
    without = [json.loads(line)["usage"]["prompt_tokens"] for line in plain.stdout.decode().splitlines()]
    assert all(a > b for a, b in zip(with_template, without, strict=True))


def test_jsonl_input_fields_and_bad_lines(smollm2_path: Path, tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    }
    lines = [
        json.dumps({"id": "a", "prompt": "Hi", "max_tokens": 5, "temperature": 0}),
        json.dumps({"prompt": "Name a city.", "schema": schema, "max_tokens": 60}),
        "{not json",
        json.dumps({"prompt": "x", "colour": "red"}),
        json.dumps({"prompt": "y", "schema": "/no/such/schema.json"}),
    ]
    path = tmp_path / "in.jsonl"
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe bad bytes\n")
    done = run_cli("run", str(smollm2_path), "--input", str(path), "--jsonl", "--parallel", "2")
    assert done.returncode == 2, done.stderr
    records = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [r["id"] for r in records] == ["a", 2, 3, 4, 5, 6]
    assert records[0]["usage"]["completion_tokens"] <= 5
    assert "city" in json.loads(records[1]["text"])
    assert "is not JSON" in records[2]["error"]
    assert "unknown field colour" in records[3]["error"]
    assert "cannot read /no/such/schema.json" in records[4]["error"]
    assert "not UTF-8" in records[5]["error"]


def test_json_and_logprobs_give_each_rows_object_or_are_refused(smollm2_path: Path, tmp_path: Path) -> None:
    # --json in a batch is each row's object (as --jsonl); --logprobs scores each row's answer tokens
    # as run --json --logprobs does, and without an object to carry them it is refused, as in one-shot
    args = ("run", str(smollm2_path), "--temperature", "0", "--max-tokens", "4", "--logprobs", "2")
    done = run_cli(*args, "--each-line", "--json", input=b"Hi\nName a planet.\n")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [r["id"] for r in rows] == [1, 2]
    for row in rows:
        assert "".join(t["token"] for t in row["logprobs"]) == row["text"]
        assert len(row["logprobs"]) == row["usage"]["completion_tokens"]
        assert all(len(t["top_logprobs"]) == 2 and t["logprob"] <= 0 for t in row["logprobs"])
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "Hi"}\n')
    from_file = run_cli(*args, "--input", str(path), "--jsonl")
    assert from_file.returncode == 0 and json.loads(from_file.stdout)["logprobs"], from_file.stderr
    jsonl = run_cli(*args, "--jsonl", "--each-line", input=b"Hi\n")
    assert json.loads(jsonl.stdout)["logprobs"] == rows[0]["logprobs"]  # --json and --jsonl alike
    plain = run_cli("run", str(smollm2_path), "--max-tokens", "4", "--each-line", "--jsonl", input=b"Hi\n")
    assert "logprobs" not in json.loads(plain.stdout)  # only when asked
    for bad in (
        [*args, "--each-line"],
        [*args, "--input", str(path)],
        ["run", str(smollm2_path), "--each-line", "--jsonl", "--logprobs", "21"],
    ):
        refused = run_cli(*bad, input=b"Hi\n")
        assert refused.returncode == 2 and refused.stdout == b"", refused.stderr
        said = refused.stderr.decode()
        assert "goes with --jsonl or --json" in said or "between 0 and 20" in said, said


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--each-line", "--parallel", "0"], "--parallel must be between 1 and 256"),
        (["Translate", "--each-line"], "put {} where each line goes"),
        (["--each-line", "--input", "x.jsonl"], "choose one"),
        (["--input", "/no/such.jsonl"], "cannot read /no/such.jsonl"),
        # a missing file is named first, whatever PROMPT says: the user never typed --each-line
        (["hi", "--input", "/no/such.jsonl"], "--input: cannot read /no/such.jsonl: No such file"),
        (["Say {}", "--input", "/no/such.jsonl"], "--input: cannot read /no/such.jsonl: No such file"),
    ],
)
def test_bad_batch_usage_is_one_line_and_exit_2(smollm2_path: Path, args: list[str], words: str) -> None:
    done = run_cli("run", str(smollm2_path), *args, input=b"hi\n")
    assert done.returncode == 2
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines


def test_a_prompt_beside_input_is_a_template_for_each_prompt(smollm2_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"prompt": "cat"}\n{"prompt": "dog"}\n')
    bare = run_cli("run", str(smollm2_path), "hi", "--input", str(path))
    assert bare.returncode == 2 and bare.stdout == b""
    err = bare.stderr.decode().strip()
    assert "--each-line" not in err and len(err.splitlines()) == 1
    assert err == (
        'runner: error: --input takes a JSONL file, one {"prompt": …} object per line; PROMPT beside it '
        "is a template: put {} where each prompt goes, or leave PROMPT out"
    )

    def prompt_tokens(*template: str) -> list[int]:
        done = run_cli(
            "run", str(smollm2_path), *template, "--input", str(path), "--jsonl", "--max-tokens", "1"
        )
        assert done.returncode == 0, done.stderr
        return [json.loads(line)["usage"]["prompt_tokens"] for line in done.stdout.decode().splitlines()]

    plain, templated = prompt_tokens(), prompt_tokens("Translate to French: {}")
    assert all(t > p for t, p in zip(templated, plain, strict=True))  # not silently ignored


def test_a_prompt_too_long_for_its_sequence_gets_a_per_sequence_ctx_that_runs(smollm2_path: Path) -> None:
    # --ctx is each sequence's, as in every command: the advice is one, and following it works
    # without tripping the trained-context warning
    lines = ("word " * 400).strip() + "\n" + ("word " * 9000).strip() + "\n"
    args = ["run", str(smollm2_path), "Repeat: {}", "--each-line", "--jsonl", "--max-tokens", "8"]
    done = run_cli(*args, "--ctx", "256", "--parallel", "2", input=lines.encode())
    assert done.returncode == 2, done.stderr
    first, second = (json.loads(line)["error"] for line in done.stdout.decode().splitlines())
    found = re.fullmatch(
        r"line 1: the prompt is ([\d,]+) tokens, more than a sequence's context of 256; "
        r"use --ctx (\d+) or more",
        first,
    )
    assert found, first
    n, ctx = int(found[1].replace(",", "")), int(found[2])
    assert ctx == -(-(n + 8) // 256) * 256 <= 8192  # room for the answer, within the trained context
    assert re.fullmatch(
        r"line 2: the prompt is [\d,]+ tokens, more than this model's trained context of 8,192 allows "
        r"with room for an answer; shorten it",
        second,
    ), second
    again = run_cli(*args, "--ctx", str(ctx), "--parallel", "2", input=lines.encode())
    records = [json.loads(line) for line in again.stdout.decode().splitlines()]
    assert "text" in records[0] and "error" in records[1], records
    assert "warning" not in again.stderr.decode(), again.stderr


@pytest.mark.model
def test_the_plan_lowers_parallel_to_what_fits(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.loader import plan_for
    from runner.memory import devices
    from runner.memory.devices import Machine
    from runner.memory.estimate import Load, estimate

    header = read_header(smollm2_path)
    # a batch's --ctx is each sequence's: KV for n x 8192 tokens
    from runner.engine.llamacpp import repack_types

    two = estimate(header, Load(n_ctx=2 * 8192, n_seq=2), repack_types=repack_types()).host_rss_bytes
    four = estimate(header, Load(n_ctx=4 * 8192, n_seq=4), repack_types=repack_types()).host_rss_bytes
    assert four > two
    ram = int((two + four) / 2 / 0.9)  # room for two sequences, not four
    monkeypatch.setattr(devices, "probe", lambda **_: Machine(ram, ram))
    plan = plan_for(header, "smollm2", LoadSettings(ctx=8192, kv_type="f16", parallel=8, most_parallel=True))
    assert plan.fits and (plan.n_seq, plan.n_ctx) == (2, 2 * 8192)


def test_runner_bench_reports_every_figure(smollm2_path: Path) -> None:
    done = run_cli("bench", str(smollm2_path), "--repetitions", "1", "--json", timeout=300)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["pp_tokens_per_s"] > figures["tg_tokens_per_s"] > 0  # a batch of 512 beats one at a time
    assert 0 < figures["ttft_s"] < 10
    assert figures["end_to_end"]["wall_s"] > 0 and figures["end_to_end"]["tokens_per_s"] > 0
    assert set(figures["parallel"]) == {"1", "4", "16"} and all(v > 0 for v in figures["parallel"].values())


def test_ctrl_c_keeps_the_answers_already_written(smollm2_path: Path) -> None:
    import signal
    import subprocess
    import sys

    lines = "".join(f"Write a long story about a {w}.\n" for w in ["cat", "dog", "owl", "fox", "cow", "pig"])
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runner",
            "run",
            str(smollm2_path),
            "--each-line",
            "--parallel",
            "2",
            "--max-tokens",
            "60",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    child.stdin.write(lines.encode())
    child.stdin.close()
    first = child.stdout.readline()  # the first answer is out: the others are still being written
    child.send_signal(signal.SIGINT)
    rest = child.stdout.read()
    assert child.wait(timeout=60) == 130
    assert first.strip() and b"Traceback" not in child.stderr.read()
    assert (first + rest).count(b"\n") < 6  # stopped before the end, every line written whole
