"""The one generation loop: its step function on hand-made tokens, and with the real model the same
loop under a one-shot answer, a batch and the server's sequences (speculation in a shared batch, the
stop string reported, a head stored by one loop restored by another)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.engine.answer import (
    FINISH_INTERRUPTED,
    FINISH_LENGTH,
    FINISH_REPEAT,
    FINISH_STOP,
    LOOP_SPAN,
    Result,
    looping,
)
from runner.engine.batch import run_batch
from runner.engine.engine import Engine
from runner.engine.loop import Loop
from runner.engine.prefix import PrefixStore
from runner.engine.prompt import render_prompt
from runner.engine.promptcache import MIN_HEAD, PromptCache
from runner.engine.request import Request, bare, to_job
from runner.engine.sequence import Job, Slot
from runner.engine.text.reasoning import ANSWER, REASONING
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.template import Message
from runner.gguf import read_header

GREEDY = SamplingConfig(temperature=0)
PARAGRAPH = (
    "The old lighthouse stood on the northern cliff for two hundred years. Every night its keeper "
    "climbed the spiral stairs, trimmed the wick and polished the great lens until it shone. Ships "
    "passing in the dark trusted its beam to guide them past the rocks."
)


# -- the step function, on hand-made tokens ----------------------------------------------------------


class Vocab:
    """Token ids -> text, some of them control tokens that render only when asked (as llama.cpp's)."""

    def __init__(self, words: dict[int, str], control: set[int], end: int = 0) -> None:
        self.words, self.control, self.end = words, control, end
        self.asked: list[bool] = []

    def is_end(self, token: int) -> bool:
        return token == self.end

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        self.asked.append(special)
        if token in self.control and not special:
            return b""
        return self.words[token].encode()


HARMONY = {
    1: "<|channel|>",
    2: "analysis",
    3: "<|message|>",
    4: "Two and two",
    5: " make four.",
    6: "<|end|>",
    7: "<|start|>",
    8: "assistant",
    9: "final",
    10: "It is 4.",
    11: "STOP",
}
HARMONY_TOKENS = [1, 2, 3, 4, 5, 6, 7, 8, 1, 9, 3, 10]


def take_all(job: Job, vocab: Vocab, tokens: list[int], room: int = 1000) -> tuple[Slot, str | None]:
    slot = Slot(0, job, sampler=None, speculator=None, start=0.0)
    reason = None
    for token in tokens:
        reason = slot.take(token, vocab, room)
        if reason is not None:
            break
        slot.pos += 1
    return slot, reason


@pytest.mark.fast
def test_channels_are_split_because_the_step_renders_their_control_tokens() -> None:
    """gpt-oss's markers are control tokens: a job of the "channels" style renders them as text, so
    reasoning and answer come apart in every command (the loop's one step function); without the
    style they are not rendered and nothing is split."""
    pieces: list[tuple[str, str]] = []
    vocab = Vocab(HARMONY, control={1, 3, 6, 7})
    job = Job(0, [5], GREEDY, reasoning="channels", on_piece=lambda kind, text: pieces.append((kind, text)))
    slot, reason = take_all(job, vocab, [*HARMONY_TOKENS, 0])
    result = slot.result(reason or FINISH_STOP, flush=True, extra={})
    assert all(vocab.asked) and reason == FINISH_STOP
    assert (result.reasoning, result.text) == ("Two and two make four.", "It is 4.")
    assert "".join(t for k, t in pieces if k == REASONING) == result.reasoning
    assert "".join(t for k, t in pieces if k == ANSWER) == result.text
    plain, _ = take_all(Job(0, [5], GREEDY), Vocab(HARMONY, control={1, 3, 6, 7}), HARMONY_TOKENS)
    plain_result = plain.result(FINISH_LENGTH, flush=True, extra={})
    assert plain_result.reasoning == "" and "<|channel|>" not in plain_result.text


@pytest.mark.fast
def test_the_step_reports_why_an_answer_ended() -> None:
    words = {1: "one ", 2: "two ", 3: "ST", 4: "OP here", 5: "five"}
    slot, reason = take_all(Job(0, [5], GREEDY, stop=("STOP", "TWO")), Vocab(words, set()), [1, 2, 3, 4, 5])
    result = slot.result(reason or "", flush=True, extra={})
    assert (reason, result.stop, result.text, slot.n_out) == (FINISH_STOP, "STOP", "one two ", 4)
    slot, reason = take_all(Job(0, [5], GREEDY), Vocab(words, set()), [1, 2, 0])  # the end token
    assert reason == FINISH_STOP and slot.result(reason, flush=True, extra={}).stop is None
    slot, reason = take_all(Job(0, [5], GREEDY, max_tokens=2), Vocab(words, set()), [1, 2, 5])
    assert (reason, slot.context_full) == (FINISH_LENGTH, False)
    slot, reason = take_all(Job(0, [5], GREEDY), Vocab(words, set()), [1, 2, 5], room=3)
    assert (reason, slot.context_full, slot.n_out) == (FINISH_LENGTH, True, 3)


@pytest.mark.fast
def test_an_answer_going_round_in_a_loop_ends_when_no_limit_was_given() -> None:
    """stop_loops: the same few tokens over and over end the answer as soon as 256 of them repeat
    (finish "repetition"); without it, or for an answer that does not repeat, it runs on."""
    words = {i: f"w{i} " for i in range(1, 1200)}
    loop = [7, 8, 9, 10, 11] * 400
    slot, reason = take_all(Job(0, [5], GREEDY, stop_loops=True), Vocab(words, set()), loop, room=5000)
    assert reason == FINISH_REPEAT and LOOP_SPAN <= slot.n_out <= LOOP_SPAN + 16, slot.n_out
    slot, reason = take_all(Job(0, [5], GREEDY), Vocab(words, set()), loop, room=5000)
    assert reason is None and slot.n_out == len(loop)
    counting = list(range(1, 1200))  # no token comes twice: never a loop
    slot, reason = take_all(Job(0, [5], GREEDY, stop_loops=True), Vocab(words, set()), counting, 5000)
    assert reason is None and slot.n_out == len(counting)
    assert looping([3] * 255) == 0 and looping([3] * 256) == 1
    assert looping([1, 2] * 100 + list(range(100, 300)) * 3) == 200  # three turns of a long paragraph
    assert looping(list(range(100, 700)) * 3) == 0  # longer than LOOP_PERIOD_MAX: not looked for


def test_runner_run_stops_a_looping_answer_and_says_so(tmp_path: Path, smollm2_path: Path) -> None:
    """A model that writes the same three tokens for ever, run with no --max-tokens: the answer ends
    at the loop (finish "repetition", a line on stderr), not when the context is full."""
    from tests.conftest import run_cli
    from tests.synth import write_scripted

    with Engine(smollm2_path, n_ctx=256, n_threads=1) as vocab:
        a, b, c = (vocab.model.tokenize(word, add_special=False)[0] for word in (" apple", " pear", " plum"))
    says = "{% for m in messages %} {{ m['content'] }}{% endfor %}"  # a chat's "apple" is " apple"
    model = write_scripted(tmp_path / "loops.gguf", smollm2_path, [a, b, c, a], template=says)
    done = run_cli("run", str(model), "--raw", "--json", "--temperature", "0", "--ctx", "4096", " apple")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["finish_reason"] == "repetition", answer["finish_reason"]
    assert answer["usage"]["completion_tokens"] < 300 and answer["text"].startswith(" pear plum apple")
    assert b"went round in a loop" in done.stderr, done.stderr
    # chat (and run -c) and --each-line stop there too, and say so
    chat = run_cli("chat", str(model), "--temperature", "0", "--ctx", "4096", input=b"apple\n")
    assert chat.returncode == 0 and b"went round in a loop" in chat.stderr, chat.stderr
    lines = run_cli("run", str(model), "--each-line", "--temperature", "0", "--ctx", "4096", input=b"apple\n")
    assert lines.returncode == 0 and b"line 1: the answer went round in a loop" in lines.stderr, lines.stderr


# -- the loop, with the real model ------------------------------------------------------------------


@pytest.fixture(scope="module")
def four(smollm2_path: Path):
    """Four sequences, as `runner serve --parallel 4` loads them."""
    with Engine(smollm2_path, n_ctx=4 * 1024, n_threads=2, n_seq=4) as engine:
        yield engine


def chat_tokens(engine: Engine, path: Path, text: str, system: str | None = None) -> list[int]:
    head = [Message("system", system)] if system else []
    return render_prompt(engine, read_header(path), [*head, Message("user", text)]).tokens


@pytest.mark.model
def test_a_stop_string_is_reported_by_the_engine_alone_and_in_a_batch(
    engine: Engine, four: Engine, smollm2_path: Path
) -> None:
    tokens = chat_tokens(engine, smollm2_path, "Count from 1 to 20, separated by commas.")
    engine.context.reset()
    free = engine.generate(tokens, GREEDY, max_tokens=40).text
    stop = next(s for s in ("7", "5", "3", ",") if s in free)
    alone = engine.generate(tokens, GREEDY, max_tokens=40, stop=[stop, "never there"])
    assert (alone.finish_reason, alone.stop) == (FINISH_STOP, stop) and stop not in alone.text
    done: dict[int, Result] = {}
    run_batch(
        four,
        [bare(tokens, GREEDY, max_tokens=40, stop=("never there", stop)) for _ in range(2)],
        lambda r: done.__setitem__(r.index, r),
    )
    assert all((r.finish_reason, r.stop, r.text) == (FINISH_STOP, stop, alone.text) for r in done.values())


def greedy_tokens(engine: Engine, request: Request, argmax: bool) -> tuple[list[int], set[bool]]:
    """The tokens one loop samples for `request` from an empty context, and whether its slot took
    the logits' argmax itself, at each step."""
    engine.context.reset()
    sampled: list[int] = []
    took: set[bool] = set()
    loop = Loop(engine, lambda result: None, parallel=1, argmax=argmax)
    try:
        loop.add(to_job(request, 0, on_token=sampled.append))
        while loop.busy():
            loop.step()
            took |= {slot.argmax for slot in loop.active}
    finally:
        loop.close()
    return sampled, took


@pytest.mark.model
def test_the_servers_argmax_picks_what_llama_cpps_greedy_sampler_picks(
    engine: Engine, smollm2_path: Path
) -> None:
    """The server's loop takes a greedy token as the logits' argmax (no copy of the vocabulary into
    llama.cpp's candidates): token for token what llama.cpp's greedy sampler picks. A chain that
    does more than greedy (penalties) still samples through llama.cpp."""
    tokens = chat_tokens(engine, smollm2_path, "Write two sentences about the sea.")
    request = bare(tokens, GREEDY, max_tokens=48, ignore_end=True)
    by_llama, took = greedy_tokens(engine, request, argmax=False)
    assert took == {False}
    by_argmax, took = greedy_tokens(engine, request, argmax=True)
    assert took == {True}
    assert len(by_llama) == 48 and by_argmax == by_llama
    penalised = bare(tokens, SamplingConfig(temperature=0, repeat_penalty=1.3), max_tokens=8)
    assert greedy_tokens(engine, penalised, argmax=True)[1] == {False}


@pytest.mark.model
def test_speculation_in_a_shared_batch_keeps_every_greedy_answer(four: Engine, smollm2_path: Path) -> None:
    """Four sequences, each drafting (a fixed 4 tokens a step, so every step verifies drafts of
    several sequences in one llama_decode): the answers are those without speculation."""
    texts = [PARAGRAPH, PARAGRAPH.replace("keeper", "guardian"), PARAGRAPH.upper(), PARAGRAPH[::-1][:150]]
    prompts = [chat_tokens(four, smollm2_path, f"Repeat this text exactly:\n\n{t}") for t in texts]

    def answers() -> dict[int, Result]:
        done: dict[int, Result] = {}
        run_batch(
            four,
            [bare(p, GREEDY, max_tokens=48) for p in prompts],
            lambda r: done.__setitem__(r.index, r),
            share_prefix=False,
        )
        return done

    plain = answers()
    assert four.speculate("ngram", fixed=4)
    try:
        drafted = answers()
    finally:
        four.speculate("none")
    assert sum(r.timings.speculation.drafted for r in drafted.values()) > 0
    assert sum(r.timings.speculation.accepted for r in drafted.values()) > 0
    same = sum(drafted[i].text == plain[i].text for i in plain)
    assert same >= 3, [(plain[i].text, drafted[i].text) for i in plain]  # a near tie may flip one


@pytest.mark.model
def test_a_head_stored_by_a_one_shot_answer_is_restored_in_another_loops_sequence(
    engine: Engine, four: Engine, smollm2_path: Path, tmp_path: Path
) -> None:
    """The prefix store's disk tier: `runner run` stores a prompt's stable head; the server's loop
    (four sequences, a job in whichever is free) restores it and evaluates only the rest."""
    system = "You are a careful assistant. " * 12
    cache = PromptCache(tmp_path / "prompts", 1 << 30, lambda _m: None)
    first = chat_tokens(engine, smollm2_path, "Name a colour.", system)
    head = len(chat_tokens(engine, smollm2_path, "", system)) - 8
    assert head >= MIN_HEAD
    engine.context.reset()
    stored = engine.generate(first, GREEDY, max_tokens=8, prompt_cache=cache, head=head)
    assert stored.timings.prompt_cache.stored_tokens == head
    second = chat_tokens(four, smollm2_path, "Name a fruit.", system)
    done: list[Result] = []
    four.context.reset()
    loop = Loop(four, done.append, store=PrefixStore(disk=cache))
    loop.add(Job(0, second, GREEDY, max_tokens=8))
    while loop.busy():
        loop.step()
    loop.close()
    four.context.reset()
    (result,) = done
    assert result.timings.prompt_cache.loaded_tokens == head
    assert result.timings.prefill_tokens == len(second) - head
    engine.context.reset()
    assert result.text == engine.generate(second, GREEDY, max_tokens=8).text


@pytest.mark.model
def test_a_cancelled_job_and_an_interrupted_loop_end_with_what_they_made(
    four: Engine, smollm2_path: Path
) -> None:
    tokens = chat_tokens(four, smollm2_path, "Write a long story about a cat.")
    done: dict[int, Result] = {}
    four.context.reset()
    loop = Loop(four, lambda r: done.__setitem__(r.index, r))
    jobs = [Job(i, tokens, GREEDY, max_tokens=64) for i in range(3)]
    for job in jobs:
        loop.add(job)
    for _ in range(4):
        loop.step()
    jobs[1].cancelled = True
    loop.step()
    assert done[1].finish_reason == FINISH_INTERRUPTED and 0 < done[1].timings.completion_tokens < 64
    loop.interrupt()
    loop.close()
    four.context.reset()
    assert {done[i].finish_reason for i in (0, 2)} == {FINISH_INTERRUPTED}
    assert done[0].text and done[0].text == done[2].text
