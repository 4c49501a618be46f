"""runner serve's OpenAI API with the real model: the `openai` client against a real `runner serve`
(SmolLM2, 4 sequences of 1024 tokens) over 127.0.0.1. Whole and streamed answers, stop strings,
lengths and seeds, JSON schemas, forced tool calls, raw completions, many clients at once, a
conversation's prefix reused, the kept prompt states, and the refusals only the model can make (a
prompt too long in tokens, a schema its constraint engine cannot enforce). The refusals the fields
alone decide are in test_serve_protocol.py, in process. Nothing is mocked; every server is stopped
with SIGTERM and must exit 0 without a traceback.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from runner.engine.llamacpp import default_threads
from tests.serving import (
    CLIENT_QUESTIONS,
    COUNTING,
    MODEL,
    PERSON,
    WEATHER,
    Server,
    ask,
    body,
    chat,
    check_refused,
    model_server,
    openai_client,
    same_unless_near_tie,
    serve_env,
    start_server,
    stop_server,
)

LONG_TEXT = " ".join(["word"] * 3000)  # ~3000 tokens: past a sequence's 1024
UNIQUE = {
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
}


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The file's server: 4 sequences of 1024 tokens, no key, no CORS."""
    with model_server(tmp_path_factory.mktemp("serve"), "--parallel", "4", "--ctx", "1024") as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as raw:
        yield raw


# -- the OpenAI API through its client ------------------------------------------------------------


@pytest.mark.timeout(300)
def test_openai_chat_whole_and_streamed_are_the_same_answer(client: openai.OpenAI) -> None:
    """A greedy chat answer is the same text whole and streamed, with the same finish reason and
    token counts; the whole answer's usage and timings agree with each other."""
    question = "What is the capital of France?"
    ask(client, question, max_tokens=24)  # the prompt into a slot: both below reuse it the same way
    whole = ask(client, question, max_tokens=24)
    chunks = list(ask(client, question, max_tokens=24, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content and text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    [last] = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage is not None and not chunks[-1].choices  # include_usage: a last, empty chunk
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    timings = whole.model_extra["timings"]
    assert timings["prompt_tokens"] == whole.usage.prompt_tokens
    assert timings["completion_tokens"] == whole.usage.completion_tokens
    assert timings["cached_tokens"] == whole.usage.prompt_tokens_details.cached_tokens
    assert timings["prefill_tokens"] == timings["prompt_tokens"] - timings["cached_tokens"] >= 1
    assert timings["cached_tokens"] > 0  # the same prompt again: all but its last token reused
    assert 0 < timings["ttft_s"] <= timings["total_s"]
    assert 1 <= timings["threads"] <= default_threads() and timings["thread_changes"] >= 0  # per answer


@pytest.mark.timeout(300)
def test_a_streams_pieces_are_joined_within_the_stream_interval(tmp_path: Path) -> None:
    """--stream-interval 1000: the first piece comes alone and at once (the time to the first token is
    the same), the next ones joined into fewer chunks than tokens, the text that of the whole answer;
    --stream-interval is a bounded count of milliseconds (-1: exit 2, one line)."""
    question = "Tell me about the sea."
    with model_server(tmp_path, "--parallel", "1", "--ctx", "512", "--stream-interval", "1000") as slow:
        client = openai_client(slow)
        whole = ask(client, question, max_tokens=24, logprobs=True, extra_body={"ignore_eos": True})
        chunks = list(ask(client, question, max_tokens=24, stream=True, extra_body={"ignore_eos": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == whole.choices[0].message.content
    assert pieces[0] == whole.choices[0].logprobs.content[0].token  # the first token's text, alone
    assert 2 <= len(pieces) < whole.usage.completion_tokens, pieces
    done = subprocess.run(
        [sys.executable, "-m", "runner", "serve", MODEL, "--stream-interval", "-1"],
        capture_output=True,
        text=True,
        env=serve_env(tmp_path),
        timeout=60,
    )
    assert done.returncode == 2 and "--stream-interval" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


@pytest.mark.timeout(300)
def test_n_answers_have_one_timings_object(client: openai.OpenAI) -> None:
    """n=2: `timings` stays one object, every choice's tokens added up, and each choice's own inside."""
    both = ask(client, "Name a colour.", max_tokens=6, n=2, seed=3)
    timings = both.model_extra["timings"]
    assert isinstance(timings, dict) and len(timings["choices"]) == 2, timings
    assert timings["completion_tokens"] == both.usage.completion_tokens
    assert timings["completion_tokens"] == sum(t["completion_tokens"] for t in timings["choices"])
    assert timings["ttft_s"] == min(t["ttft_s"] for t in timings["choices"])
    assert timings["total_s"] == max(t["total_s"] for t in timings["choices"])


@pytest.mark.timeout(300)
def test_openai_stop_length_and_seed(client: openai.OpenAI) -> None:
    """stop ends the answer before the stop string (finish "stop"); max_tokens ends it at exactly that
    many tokens (finish "length"); the same seed at temperature 0.8 gives the same answer, and the
    seed is what chooses it (four seeds do not all give one answer)."""
    question = "List three fruits, one per line."
    free = ask(client, question, max_tokens=40).choices[0]
    assert "\n" in free.message.content.strip(), free  # the answer does have a line break to stop at
    stopped = ask(client, question, max_tokens=40, stop=["\n"]).choices[0]
    assert stopped.finish_reason == "stop"
    assert "\n" not in stopped.message.content
    assert stopped.message.content == free.message.content.split("\n")[0]

    short = ask(client, "Tell me a long story about a dragon.", max_tokens=5)
    assert short.choices[0].finish_reason == "length"
    assert short.usage.completion_tokens == 5

    poem = "Write a poem about the sea."
    ask(client, poem, max_tokens=16)  # the prompt into a slot first: both seeded answers reuse it
    first, again = (ask(client, poem, temperature=0.8, seed=7, max_tokens=16) for _ in range(2))
    assert first.choices[0].message.content == again.choices[0].message.content
    seeded = {
        ask(client, poem, temperature=0.8, seed=s, max_tokens=16).choices[0].message.content for s in range(4)
    }
    assert len(seeded) > 1, seeded


@pytest.mark.timeout(300)
def test_openai_json_schema_answer_validates(client: openai.OpenAI) -> None:
    """response_format json_schema: the content is JSON that validates against the schema."""
    answer = ask(
        client,
        "Give me a person's name as JSON.",
        max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content), PERSON)


# A format llguidance does not enforce (left out of the mask) that jsonschema checks: SmolLM2's greedy
# answer to this prompt is a URL, not an address, so the answer is finished and invalid.
CONTACT = {
    "type": "object",
    "properties": {"contact": {"type": "string", "format": "idn-email"}},
    "required": ["contact"],
}


@pytest.mark.timeout(300)
def test_an_answer_that_fails_its_schema_is_an_error_in_the_api_s_shape(client: openai.OpenAI) -> None:
    """Every finished json_schema answer is validated against the schema as given: one that fails is
    a 500 in OpenAI's shape naming where (whole), or the stream's error (streamed); never "stop"."""
    fmt = {"type": "json_schema", "json_schema": {"name": "contact", "schema": CONTACT}}
    kwargs: dict[str, Any] = {"max_tokens": 300, "temperature": 0, "response_format": fmt}
    with pytest.raises(openai.InternalServerError) as raised:
        ask(client, "Give a contact.", **kwargs)
    assert raised.value.status_code == 500
    error = raised.value.body
    assert isinstance(error, dict) and error["type"] == "server_error", error
    assert "does not match the schema at contact" in error["message"] and "idn-email" in error["message"]
    with pytest.raises(openai.APIError) as in_stream:
        for _ in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Give a contact."}], stream=True, **kwargs
        ):
            pass
    assert "does not match the schema at contact" in str(in_stream.value)
    again = ask(client, "Give a contact.", max_tokens=16)  # the server goes on
    assert again.choices[0].finish_reason in ("stop", "length")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_openai_forced_tool_call(client: openai.OpenAI, choice: Any) -> None:
    """tool_choice "required" or naming the function: the answer is a call of get_weather whose
    arguments are a JSON object with a string city; finish_reason "tool_calls", no content."""
    answer = ask(client, "What is the weather in Paris?", max_tokens=64, tools=WEATHER, tool_choice=choice)
    choice_ = answer.choices[0]
    assert choice_.finish_reason == "tool_calls"
    assert not choice_.message.content
    [call] = choice_.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert isinstance(arguments, dict) and isinstance(arguments["city"], str)


@pytest.mark.timeout(300)
def test_openai_models_and_raw_completions(client: openai.OpenAI) -> None:
    """/v1/models lists the served model (and /v1/models/{id} describes it); /v1/completions
    continues a raw prompt, no template around it."""
    assert [m.id for m in client.models.list()] == [MODEL]
    one = client.models.retrieve(MODEL)
    assert one.id == MODEL and one.model_extra["meta"]["context"] == 1024
    assert one.model_extra["meta"]["parallel"] == 4
    done = client.completions.create(model=MODEL, prompt=COUNTING, max_tokens=12, temperature=0)
    assert done.choices[0].text.startswith(" 6, 7, 8"), done.choices[0].text
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 12
    templated = ask(client, COUNTING, max_tokens=1)
    assert done.usage.prompt_tokens + 10 < templated.usage.prompt_tokens  # no chat template around it


@pytest.mark.timeout(400)
def test_concurrent_answers_do_not_cross(client: openai.OpenAI, engine: Any, smollm2_path: Path) -> None:
    """16 greedy chats at once (4 sequences decoding, 12 waiting) each get the answer their question
    gets alone: no answer carries another's tokens."""
    from runner.engine.prompt import render_prompt
    from runner.engine.text.template import Message
    from runner.gguf import read_header

    def one(question: str) -> str:
        return ask(client, question, max_tokens=24).choices[0].message.content

    alone = [one(q) for q in CLIENT_QUESTIONS]
    with ThreadPoolExecutor(len(CLIENT_QUESTIONS)) as pool:
        together = list(pool.map(one, CLIENT_QUESTIONS))
    assert len(set(alone)) == len(CLIENT_QUESTIONS)  # 16 different answers: a swap could not go unseen
    # The same but for near ties: a sequence decoded beside 0 to 3 others is a different batch shape,
    # and llama.cpp's CPU kernels round differently by batch size, so a near tie of the top two
    # tokens may go either way (same_unless_near_tie fails a difference anywhere else).
    header = read_header(smollm2_path)
    same = 0
    for question, a, b in zip(CLIENT_QUESTIONS, alone, together, strict=True):
        tokens = render_prompt(engine, header, [Message("user", question)], quiet=True).tokens
        same += same_unless_near_tie(engine, tokens, a, b)
    assert same >= len(CLIENT_QUESTIONS) - 2, list(zip(alone, together, strict=True))


@pytest.mark.timeout(300)
def test_a_resent_conversation_reuses_its_prefix(client: openai.OpenAI) -> None:
    """A 10-turn chat re-sent whole each turn, as clients do: each turn finds the whole previous
    prompt and the previous answer (but its last token, sampled and never decoded) in the slot, so
    only the new turn is evaluated."""
    messages = [{"role": "system", "content": "You are a terse zoologist who answers about animals."}]
    animals = ["cats", "dogs", "birds", "fish", "horses", "cows", "sheep", "goats", "pigs", "ducks"]
    previous: dict[str, int] | None = None
    for animal in animals:
        messages.append({"role": "user", "content": f"Tell me about {animal}."})
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
        timings = answer.model_extra["timings"]
        assert answer.usage.prompt_tokens_details.cached_tokens == timings["cached_tokens"]
        assert timings["prefill_tokens"] == timings["prompt_tokens"] - timings["cached_tokens"]
        if previous is not None:
            held = previous["prompt_tokens"] + previous["completion_tokens"]
            # the previous prompt at least; never more than the slot held
            assert previous["prompt_tokens"] <= timings["cached_tokens"] <= held - 1, (previous, timings)
            # measured: exactly held - 1 every turn (the answer's tokens are the ones its text gives)
            new = timings["prompt_tokens"] - held  # this turn's own tokens: end of the answer, question
            assert timings["prefill_tokens"] <= new + 1 + 2, (previous, timings)
        messages.append({"role": "assistant", "content": answer.choices[0].message.content})
        previous = timings
    assert previous is not None
    assert previous["prefill_tokens"] * 10 < previous["prompt_tokens"]  # turn 10: far less than all


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cache_ram", ["64M", "0"])
def test_a_prompt_whose_sequence_was_taken_comes_back_from_the_kept_states(
    smollm2_path: Path, tmp_path: Path, cache_ram: str
) -> None:
    """Two sequences, four prompts: the first one's sequence goes to the others, and its state to the
    kept states (--cache-ram). Asked again, it is restored (all but its last token cached) and answers
    as it did when its own sequence still held it; with --cache-ram 0 it is evaluated again."""
    small = start_server(tmp_path, "--parallel", "2", "--ctx", "512", "--cache-ram", cache_ram)
    client = openai.OpenAI(base_url=f"{small.url}/v1", api_key="unused", max_retries=0, timeout=120)

    def ask(topic: str) -> tuple[str, dict[str, int]]:
        messages = [{"role": "user", "content": f"Write two sentences about {topic}."}]
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
        return answer.choices[0].message.content or "", answer.model_extra["timings"]

    try:
        ask("lighthouses")
        again, held = ask("lighthouses")  # its own sequence: all but the last token reused
        assert held["cached_tokens"] == held["prompt_tokens"] - 1, held
        for topic in ("volcanoes", "glaciers", "deserts"):  # both sequences go to other prompts
            ask(topic)
        back, timings = ask("lighthouses")
        meta = httpx.get(f"{small.url}/v1/models/{MODEL}", timeout=10).json()["meta"]
    finally:
        stop_server(small)
    if cache_ram == "0":
        assert timings["cached_tokens"] < timings["prompt_tokens"] - 8, timings  # the template's head only
        assert "prompt_states" not in meta
        return
    assert timings["cached_tokens"] == timings["prompt_tokens"] - 1, timings
    assert back == again  # the same cells, the same one-token step: the same greedy answer
    states = meta["prompt_states"]
    assert states["restored"] >= 1 and states["kept"] >= 2, states
    assert 0 < states["bytes"] <= 64_000_000, states


@pytest.mark.timeout(300)
def test_an_empty_prompt_is_answered_and_frees_its_sequence(smollm2_path: Path, tmp_path: Path) -> None:
    """A /v1/completions prompt of no tokens ("" or [""]) is answered (a 400, or an answer), not left
    waiting forever, and leaves the server whole: both its sequences answer after three such
    requests, and SIGTERM still exits 0 (a heap overrun, as free() saw it, would abort the exit)."""
    with (
        model_server(tmp_path, "--parallel", "2", "--ctx", "512") as small,
        httpx.Client(base_url=small.url, timeout=30) as raw,
    ):
        for prompt in ("", [""], ""):
            try:
                got = raw.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
            except httpx.ReadTimeout:
                pytest.fail(f"no answer to the prompt {prompt!r} within 30 s")
            assert got.status_code in (200, 400), got.text
        with ThreadPoolExecutor(2) as pool:
            asked = {"model": MODEL, "prompt": COUNTING, "max_tokens": 4, "temperature": 0}
            answers = list(pool.map(lambda _: raw.post("/v1/completions", json=asked), range(2)))
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]


# -- what only the model refuses ----------------------------------------------------------------------


def test_a_schema_the_constraint_engine_cannot_enforce_is_a_400(http: httpx.Client) -> None:
    schema = {"name": "x", "schema": UNIQUE}
    content = chat(response_format={"type": "json_schema", "json_schema": schema})
    check_refused(
        http, "/v1/chat/completions", content, 400, "response_format", "uniqueItems (at properties/tags)"
    )


def test_a_big_schema_compiles_while_other_clients_are_answered(client: openai.OpenAI) -> None:
    """10,000 members (1.4 MB, within the body limit) take llguidance seconds to compile: off the event
    loop, so a plain request sent meanwhile is answered first; on the loop, it waited for the compile."""
    members = {f"p{i}": {"type": "string", "description": "d" * 100} for i in range(10_000)}
    big = {"name": "big", "schema": {"type": "object", "properties": members}}
    said = [{"role": "user", "content": "Hi"}]
    done: list[str] = []

    def ask_big() -> None:
        # one token of a 10,000-member object: an error or not, it came after the compile
        with contextlib.suppress(openai.APIStatusError):
            client.chat.completions.create(
                model=MODEL,
                messages=said,
                response_format={"type": "json_schema", "json_schema": big},
                max_tokens=1,
            )
        done.append("big")

    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(ask_big)
        time.sleep(0.5)  # the big request's compile under way
        client.chat.completions.create(model=MODEL, messages=said, max_tokens=2)
        done.append("plain")
        waiting.result()
    assert done == ["plain", "big"]


def check_too_long(http: httpx.Client, case: tuple[str, str, int, str | None, str]) -> None:
    """A prompt past a sequence's context, refused in the API's shape with its count of tokens."""
    message = check_refused(http, *case)
    counted = re.search(r"the prompt is ([\d,]+) tokens", message)
    assert counted and int(counted[1].replace(",", "")) > 2500, message


@pytest.mark.parametrize(
    "case",
    [
        (
            "/v1/chat/completions",
            chat(messages=[{"role": "user", "content": LONG_TEXT}]),
            400,
            "messages",
            "tokens; a sequence's context is 1,024",
        ),
        (
            "/v1/completions",
            body(model=MODEL, prompt=LONG_TEXT, max_tokens=2),
            400,
            "prompt",
            "tokens; a sequence's context is 1,024",
        ),
    ],
    ids=["chat too long", "prompt too long"],
)
def test_a_prompt_too_long_is_a_400_with_its_count(
    http: httpx.Client, case: tuple[str, str, int, str | None, str]
) -> None:
    check_too_long(http, case)
