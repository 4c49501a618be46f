"""`runner serve` from the outside: real processes, the real model, real clients over 127.0.0.1.

One server (SmolLM2, 4 sequences of 1024 tokens) answers most tests, through the `openai` and
`ollama` client libraries and through raw HTTP for what a client library would refuse to send. Small
servers of their own check what needs other flags: --queue 0, --api-key, --cors, SIGTERM with answers
in flight, and the refusals before anything loads (--host without a key, a port in use). Nothing is
mocked; every server is stopped with SIGTERM and must exit 0 without a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import ollama
import openai
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from tests.conftest import TEST_HOME
from tests.serving import Server, free_port
from tests.test_batch import QUESTIONS as BATCH_QUESTIONS

MODEL = "smollm2"
# One fixed thread: answers do not depend on the machine's load (an adapted count may round a near
# tie the other way), and no thread spins at a barrier waiting for another that a busy machine has
# preempted (two fixed threads on a busy 2-core machine: 2.7 s a token, measured; one: 7 ms).
THREADS = ("--threads", "1")
COUNTING = "1, 2, 3, 4, 5,"  # a raw prompt SmolLM2 goes on counting from, for hundreds of tokens
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
QUESTIONS = [
    *BATCH_QUESTIONS,  # the batch tests' eight, and eight more: 16 clients, 4 sequences
    "What colour is the sky?",
    "Who wrote Hamlet?",
    "What is the boiling point of water?",
    "Name a musical instrument.",
    "What animal says moo?",
    "How many days are in a week?",
    "What is the opposite of hot?",
    "Name a language spoken in Spain.",
]


def serve_env(tmp: Path) -> dict[str, str]:
    """The test session's environment (conftest's offline runner home), a data dir of the server's
    own, and no API key from the outside."""
    env = {**os.environ, "RUNNER_DATA_DIR": str(tmp / "data")}
    env.pop("RUNNER_API_KEY", None)
    return env


def start_server(tmp: Path, *args: str) -> Server:
    """`runner serve smollm2 ARGS` on a free port, once GET /health answers 200."""
    port = free_port()
    log = tmp / f"serve-{port}.stderr"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runner", "serve", MODEL, "--port", str(port), *THREADS, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=serve_env(tmp),
        )
    server = Server(proc, port, log)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"runner serve exited {proc.returncode} before it served:\n{server.stderr()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"runner serve did not answer /health within 120 s:\n{server.stderr()}")
        time.sleep(0.2)


def stop_server(server: Server, within: float = 30) -> float:
    """SIGTERM; the process must exit 0 within `within` seconds, with no traceback. Returns how long."""
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
        pytest.fail(f"runner serve did not exit within {within} s of SIGTERM:\n{server.stderr()}")
    took = time.monotonic() - start
    err = server.stderr()
    assert code == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    return took


@contextlib.contextmanager
def serving(tmp: Path, *args: str) -> Iterator[Server]:
    server = start_server(tmp, *args)
    try:
        yield server
    except BaseException:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
        raise
    stop_server(server)


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shared server: 4 sequences of 1024 tokens, no key, no CORS."""
    with serving(tmp_path_factory.mktemp("serve"), "--parallel", "4", "--ctx", "1024") as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    # no retries: a 429 or a 500 must show, not be retried away
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def olla(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as raw:
        yield raw


def ask(client: openai.OpenAI, question: str, **fields: Any) -> Any:
    fields.setdefault("temperature", 0)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], **fields
    )


def sse(lines: Iterator[str]) -> list[Any]:
    """The data of a Server-Sent Events stream, [DONE] as the string "[DONE]"."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


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


# -- the Ollama API through its client ------------------------------------------------------------


@pytest.mark.timeout(300)
def test_ollama_chat_whole_and_streamed_and_generate(olla: ollama.Client) -> None:
    """Ollama's client: a greedy chat whole and streamed are the same text (the stream's last part
    done, with the counts); generate answers; num_predict 5 ends with done_reason "length" after 5."""
    messages = [{"role": "user", "content": "Name a planet."}]
    options = {"temperature": 0, "num_predict": 24}
    olla.chat(model=MODEL, messages=messages, options=options)  # the prompt into a slot, as above
    whole = olla.chat(model=MODEL, messages=messages, options=options)
    parts = list(olla.chat(model=MODEL, messages=messages, options=options, stream=True))
    assert whole.done and whole.message.role == "assistant" and whole.message.content
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert parts[-1].eval_count == whole.eval_count and parts[-1].done_reason == whole.done_reason
    assert whole.prompt_eval_count and whole.prompt_eval_count > 10  # the template around the question

    generated = olla.generate(
        model=MODEL, prompt="Name a colour.", options={"temperature": 0, "num_predict": 8}
    )
    assert generated.done and generated.response and generated.eval_count <= 8

    cut = olla.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell a long story."}],
        options={"num_predict": 5, "temperature": 0},
    )
    assert cut.done_reason == "length" and cut.eval_count == 5


@pytest.mark.timeout(300)
def test_ollama_list_show_ps_and_format(olla: ollama.Client, http: httpx.Client) -> None:
    """list() and ps() show the served model, show() describes it (family, quantization, metadata),
    and a `format` JSON schema's answer validates against it."""
    assert [m.model for m in olla.list().models] == [MODEL]
    [running] = olla.ps().models
    assert running.model == MODEL
    shown = olla.show(MODEL)
    assert shown.details.family == "llama" and shown.details.quantization_level == "Q4_1"
    assert shown.modelinfo and shown.modelinfo["general.architecture"] == "llama"
    assert shown.template and "im_start" in shown.template
    assert olla.show(f"{MODEL}:latest").details.family == "llama"  # Ollama's default tag
    assert http.get("/api/version").json()["version"]

    answer = olla.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Give me a person's name as JSON."}],
        format=PERSON,
        options={"temperature": 0, "num_predict": 64},
    )
    assert answer.done_reason == "stop"
    jsonschema.validate(json.loads(answer.message.content), PERSON)


# -- many clients at once, and one conversation over many turns ---------------------------------------


@pytest.mark.timeout(400)
def test_concurrent_answers_do_not_cross(client: openai.OpenAI, engine: Any, smollm2_path: Path) -> None:
    """16 greedy chats at once (4 sequences decoding, 12 waiting) each get the answer their question
    gets alone: no answer carries another's tokens."""
    from runner.engine.prompt import render_prompt
    from runner.engine.template import Message
    from runner.gguf import read_header
    from tests.test_batch import same_unless_near_tie

    def one(question: str) -> str:
        return ask(client, question, max_tokens=24).choices[0].message.content

    alone = [one(q) for q in QUESTIONS]
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        together = list(pool.map(one, QUESTIONS))
    assert len(set(alone)) == len(QUESTIONS)  # 16 different answers: a swap could not go unseen
    # The same but for near ties: a sequence decoded beside 0 to 3 others is a different batch shape,
    # and llama.cpp's CPU kernels round differently by batch size, so a near tie of the top two
    # tokens may go either way (same_unless_near_tie fails a difference anywhere else).
    header = read_header(smollm2_path)
    same = 0
    for question, a, b in zip(QUESTIONS, alone, together, strict=True):
        tokens = render_prompt(engine, header, [Message("user", question)], quiet=True).tokens
        same += same_unless_near_tie(engine, tokens, a, b)
    assert same >= len(QUESTIONS) - 2, list(zip(alone, together, strict=True))


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


# -- a client that leaves --------------------------------------------------------------------------


STREAMS = {  # a long answer streamed, through each API: (path, body, its text in one part)
    "/v1/completions": (
        {"model": MODEL, "prompt": COUNTING, "max_tokens": 800, "temperature": 0, "stream": True},
        lambda line: json.loads(line.removeprefix("data: "))["choices"][0]["text"],
    ),
    "/api/generate": (
        {"model": MODEL, "prompt": COUNTING, "raw": True, "options": {"num_predict": 800, "temperature": 0}},
        lambda line: json.loads(line)["response"],
    ),
}


def open_stream_then_leave(server: Server, pieces: int, path: str = "/v1/completions") -> tuple[int, str]:
    """Stream the counting prompt's answer (800 tokens asked for), read `pieces` parts of its text,
    then close the connection. Returns the log mark from before the request, and the text read."""
    since = server.mark()
    body, text_of = STREAMS[path]
    text = ""
    with (
        httpx.Client(base_url=server.url, timeout=60) as raw,
        raw.stream("POST", path, json=body) as r,
    ):
        assert r.status_code == 200
        got = 0
        for line in r.iter_lines():
            if line.startswith(("data: {", "{")):
                text += text_of(line)
                got += 1
                if got == pieces:
                    break
    return since, text


@pytest.mark.timeout(300)
def test_a_client_leaving_mid_stream_ends_its_answer(
    server: Server, client: openai.OpenAI, http: httpx.Client
) -> None:
    """A client that closes its stream mid-answer: the server notices within seconds (the access line
    says the answer was cancelled, far short of its 800 tokens) and answers the next request. (That
    the sequence is free at once, test_a_full_queue_is_429_and_a_left_stream_frees_its_sequence.)"""
    since = server.mark()
    long = http.post(
        "/v1/completions", json={"model": MODEL, "prompt": COUNTING, "max_tokens": 200, "temperature": 0}
    ).json()
    assert long["choices"][0]["finish_reason"] == "length"  # the prompt runs long: it is cut, not ended
    server.wait_for_access(since, "/v1/completions")  # its line (written just after the answer) is out

    since, text = open_stream_then_leave(server, 5)
    assert text.startswith(" 6,")
    line = server.wait_for_access(since, "/v1/completions", timeout=15)
    assert line["status"] == "200" and line["finish"] in ("cancelled", "interrupted"), line[0]
    assert int(line["completion"]) < 800, line[0]
    assert ask(client, "Name a planet.", max_tokens=5).choices[0].finish_reason == "length"


@pytest.mark.timeout(300)
def test_an_empty_prompt_is_answered_and_frees_its_sequence(smollm2_path: Path, tmp_path: Path) -> None:
    """A /v1/completions prompt of no tokens ("" or [""]) is answered (a 400, or an answer), not left
    waiting forever, and leaves the server whole: both its sequences answer after three such
    requests, and SIGTERM still exits 0 (a heap overrun, as free() saw it, would abort the exit)."""
    with (
        serving(tmp_path, "--parallel", "2", "--ctx", "512") as small,
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


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", list(STREAMS))
def test_access_line_of_a_cancelled_stream_counts_what_was_sent(server: Server, path: str) -> None:
    """The access line of a stream its client left says the tokens that were decoded for it (at least
    the 5 pieces the client read) and when the first came, not completion=0 ttft=0.000s."""
    since, text = open_stream_then_leave(server, 5, path)
    assert text.startswith(" 6,")
    line = server.wait_for_access(since, path, timeout=15)
    assert line["finish"] in ("cancelled", "interrupted"), line[0]
    assert 5 <= int(line["completion"]) < 800, line[0]
    assert float(line["ttft"]) > 0, line[0]


# -- bad requests -----------------------------------------------------------------------------------

HI = [{"role": "user", "content": "Hi"}]
LONG_TEXT = " ".join(["word"] * 3000)  # ~3000 tokens: past a sequence's 1024
BIG = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * (4 << 20)}]})
MINIMUM = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 3}}}


def chat(**fields: Any) -> str:
    return json.dumps({"model": MODEL, "messages": HI, "max_tokens": 2, **fields})


def body(**fields: Any) -> str:
    return json.dumps(fields)


# (path, body, status, param (OpenAI) or None, what the message says)
BAD = {
    "unknown model": ("/v1/chat/completions", chat(model="nope"), 404, "model", "served: smollm2"),
    "not JSON": ("/v1/chat/completions", '{"model": ', 400, None, "not valid JSON"),
    "not an object": ("/v1/chat/completions", "[1, 2]", 400, None, "must be a JSON object"),
    "a string body": ("/v1/chat/completions", '"hi"', 400, None, "must be a JSON object"),
    "no messages": ("/v1/chat/completions", body(model=MODEL), 400, "messages", "required"),
    "empty messages": ("/v1/chat/completions", chat(messages=[]), 400, "messages", "at least 1"),
    "messages a string": ("/v1/chat/completions", chat(messages="Hi"), 400, "messages", "list"),
    "no role": (
        "/v1/chat/completions",
        chat(messages=[{"content": "Hi"}]),
        400,
        "messages[0].role",
        "required",
    ),
    "unknown role": (
        "/v1/chat/completions",
        chat(messages=[*HI, {"role": "wizard", "content": "Hi"}]),
        400,
        "messages[1].role",
        "'user'",
    ),
    "max_tokens -1": ("/v1/chat/completions", chat(max_tokens=-1), 400, "max_tokens", "greater than"),
    "max_tokens abc": ("/v1/chat/completions", chat(max_tokens="abc"), 400, "max_tokens", "integer"),
    "temperature 5": ("/v1/chat/completions", chat(temperature=5.0), 400, "temperature", "less than"),
    "response_format type": (
        "/v1/chat/completions",
        chat(response_format={"type": "xml"}),
        400,
        "response_format.type",
        "json_schema",
    ),
    "json_schema without schema": (
        "/v1/chat/completions",
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
        400,
        "response_format",
        "schema",
    ),
    "schema with minimum": (
        "/v1/chat/completions",
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": MINIMUM}}),
        400,
        "response_format",
        "minimum",
    ),
    "tool_choice naming no tool": (
        "/v1/chat/completions",
        chat(tools=WEATHER, tool_choice={"type": "function", "function": {"name": "nope"}}),
        400,
        "tool_choice",
        "tool_choice",
    ),
    "chat too long": (
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": LONG_TEXT}]),
        400,
        "messages",
        "tokens; a sequence's context is 1,024",
    ),
    "prompt too long": (
        "/v1/completions",
        body(model=MODEL, prompt=LONG_TEXT, max_tokens=2),
        400,
        "prompt",
        "tokens; a sequence's context is 1,024",
    ),
    "completion unknown model": ("/v1/completions", body(model="nope", prompt="a"), 404, "model", "served"),
    "completion prompt a number": ("/v1/completions", body(model=MODEL, prompt=3), 400, "prompt", "string"),
    "chat body over 4 MiB": ("/v1/chat/completions", BIG, 413, None, "over 4194304 bytes"),
    "completion body over 4 MiB": ("/v1/completions", BIG, 413, None, "over 4194304 bytes"),
    "ollama unknown model": ("/api/chat", chat(model="nope"), 404, None, "served: smollm2"),
    "ollama not JSON": ("/api/chat", "{", 400, None, "not valid JSON"),
    "ollama not an object": ("/api/generate", "[]", 400, None, "must be a JSON object"),
    "ollama messages a string": ("/api/chat", chat(messages="Hi"), 400, None, "messages"),
    "ollama unknown role": (
        "/api/chat",
        chat(messages=[{"role": "wizard", "content": "Hi"}]),
        400,
        None,
        "messages[0].role",
    ),
    "ollama num_predict abc": ("/api/chat", chat(options={"num_predict": "abc"}), 400, None, "num_predict"),
    "ollama num_predict 0": (
        "/api/generate",
        body(prompt="a", options={"num_predict": 0}),
        400,
        None,
        "num_predict",
    ),
    "ollama format xml": ("/api/chat", chat(format="xml"), 400, None, "format"),
    "ollama schema with minimum": ("/api/chat", chat(format=MINIMUM), 400, None, "minimum"),
    "ollama num_ctx over": ("/api/chat", chat(options={"num_ctx": 5000}), 400, None, "num_ctx"),
    "ollama chat too long": (
        "/api/chat",
        body(model=MODEL, messages=[{"role": "user", "content": LONG_TEXT}], stream=False),
        400,
        None,
        "tokens; a sequence's context is 1,024",
    ),
    "ollama generate too long": (
        "/api/generate",
        body(model=MODEL, prompt=LONG_TEXT),
        400,
        None,
        "tokens; a sequence's context is 1,024",
    ),
    "ollama body over 4 MiB": ("/api/chat", BIG, 413, None, "over 4194304 bytes"),
    "ollama show unknown": ("/api/show", body(model="nope"), 404, None, "served: smollm2"),
    "ollama show no model": ("/api/show", body(), 400, None, "model"),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_requests_are_4xx_in_the_api_shape(http: httpx.Client, case: str) -> None:
    """Each bad request: its 4xx, the error in the shape of the API it came through (OpenAI's object
    naming the field, Ollama's string), and the server answering after it."""
    path, content, status, param, says = BAD[case]
    got = http.post(path, content=content, headers={"Content-Type": "application/json"})
    assert got.status_code == status, got.text
    error = got.json()["error"]
    if path.startswith("/api/"):
        assert isinstance(error, str) and says in error, error
    else:
        assert set(error) == {"message", "type", "param", "code"}, error
        assert error["param"] == param and says in error["message"], error
        assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    if "too long" in case:
        counted = re.search(
            r"the prompt is ([\d,]+) tokens", error if isinstance(error, str) else error["message"]
        )
        assert counted and int(counted[1].replace(",", "")) > 2500, error
    assert http.get("/health").status_code == 200


@pytest.mark.timeout(300)
def test_a_model_name_never_reads_or_fetches_anything(http: httpx.Client) -> None:
    """A model field that is a path or a Hub repo is only compared with the served names: 404 naming
    them, on every endpoint, and nothing is written under the runner home or the Hugging Face cache."""

    def files() -> set[str]:
        return {str(Path(d, f)) for d, _, fs in os.walk(TEST_HOME) for f in fs}

    before = files()
    for name in ("/etc/passwd", "../../etc/passwd", "user/repo:Q4_K_M", "hf.co/user/repo", "smollm2.gguf"):
        for path, content in (
            ("/v1/chat/completions", chat(model=name)),
            ("/v1/completions", body(model=name, prompt="a", max_tokens=1)),
            ("/api/chat", chat(model=name)),
            ("/api/generate", body(model=name, prompt="a")),
            ("/api/show", body(model=name)),
        ):
            got = http.post(path, content=content)
            assert got.status_code == 404, (path, name, got.text)
            error = got.json()["error"]
            assert "served: smollm2" in (error if isinstance(error, str) else error["message"])
        if ".." not in name:  # (the client resolves a "..": that is another path, no model id)
            got = http.get(f"/v1/models/{name}")
            assert got.status_code == 404 and got.json()["error"]["code"] == "model_not_found", got.text
    assert files() == before


# -- fuzz -------------------------------------------------------------------------------------------

LEAF = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
ANY = st.recursive(
    LEAF,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)


def _bounded(*unlimited: int | None) -> st.SearchStrategy[Any]:
    """A length field's values: anything, but never one that lets an answer run long (2 instead)."""

    def bound(v: Any) -> Any:
        if v is None and None in unlimited:
            return 2
        if isinstance(v, int) and not isinstance(v, bool) and (3 <= v < 2**31 or v in unlimited):
            return 2
        return v

    return (ANY | st.integers(min_value=-3, max_value=3)).map(bound)


MAX_TOKENS = _bounded(None)  # absent or null: until the context ends
NUM_PREDICT = _bounded(None, -1, -2)  # Ollama's "no limit"
SCHEMA_LEAF = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["string", "integer", "number", "boolean", "null", "object", "array"]) | ANY,
        "enum": st.lists(LEAF, max_size=3),
        "const": LEAF,
        "minLength": st.integers(-1, 4),
        "maxLength": st.integers(-1, 4),
        "pattern": st.sampled_from(["^[a-z]+$", "a|b", "[0-9]{2}", "(", "\\d+"]) | st.text(max_size=6),
        "format": st.sampled_from(["date", "time", "date-time", "uuid", "email"]) | ANY,
        "minimum": st.integers(-3, 3),
    },
)
SCHEMA = st.recursive(
    SCHEMA_LEAF,
    lambda inner: (
        st.fixed_dictionaries(
            {"type": st.just("object")},
            optional={
                "properties": st.dictionaries(st.text(max_size=8), inner, max_size=3),
                "required": st.lists(st.text(max_size=8), max_size=3) | ANY,
                "additionalProperties": st.booleans() | inner,
            },
        )
        | st.fixed_dictionaries(
            {"type": st.just("array")},
            optional={"items": inner, "minItems": st.integers(-1, 3), "maxItems": st.integers(-1, 3)},
        )
        | st.fixed_dictionaries(
            {}, optional={"anyOf": st.lists(inner, max_size=3), "oneOf": st.lists(inner, max_size=3)}
        )
        | st.fixed_dictionaries({"$ref": st.sampled_from(["#", "#/definitions/x", "http://example.org/s"])})
    ),
    max_leaves=6,
)
ROLE = st.sampled_from(["system", "developer", "user", "assistant", "tool"]) | ANY
PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url"]) | ANY}, optional={"text": st.text(max_size=20) | ANY}
)
CALL = st.fixed_dictionaries(
    {"function": st.fixed_dictionaries({"name": st.text(max_size=10) | ANY}, optional={"arguments": ANY})},
    optional={"id": ANY, "type": ANY},
)
MESSAGE = (
    st.fixed_dictionaries(
        {"role": ROLE},
        optional={
            "content": st.text(max_size=30) | st.lists(PART, max_size=3) | ANY,
            "name": ANY,
            "tool_calls": st.lists(CALL, max_size=2) | ANY,
            "tool_call_id": ANY,
            "reasoning_content": ANY,
            "thinking": ANY,
            "tool_name": ANY,
            "images": ANY,
        },
    )
    | ANY
)
MESSAGES = st.lists(MESSAGE, max_size=4) | ANY
TOOL = (
    st.fixed_dictionaries(
        {
            "type": st.just("function") | ANY,
            "function": st.fixed_dictionaries(
                {"name": st.sampled_from(["get_weather", "f"]) | ANY},
                optional={"description": ANY, "parameters": SCHEMA | ANY},
            )
            | ANY,
        },
    )
    | ANY
)
TOOLS = st.lists(TOOL, max_size=2) | ANY
TOOL_CHOICE = (
    st.sampled_from(["auto", "none", "required"])
    | st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": st.sampled_from(["get_weather", "f"]) | ANY}),
        }
    )
    | ANY
)
RESPONSE_FORMAT = (
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema"]) | ANY},
        optional={
            "json_schema": st.fixed_dictionaries(
                {}, optional={"name": ANY, "schema": SCHEMA | ANY, "strict": ANY}
            )
            | ANY,
            "schema": SCHEMA | ANY,
        },
    )
    | ANY
)
SAMPLING = {
    "temperature": st.floats(-1, 3) | ANY,
    "top_p": st.floats(-0.5, 1.5) | ANY,
    "top_k": st.integers(-5, 100) | ANY,
    "min_p": st.floats(-0.5, 1.5) | ANY,
    "repeat_penalty": st.floats(-1, 11) | ANY,
    "presence_penalty": st.floats(-3, 3) | ANY,
    "frequency_penalty": st.floats(-3, 3) | ANY,
    "seed": st.integers(min_value=-(2**65), max_value=2**65) | ANY,
}
STOP = st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=6) | ANY
OPENAI_COMMON = {
    "model": st.just(MODEL) | st.just(f"{MODEL}:latest") | ANY,
    "stream": st.booleans() | ANY,
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans() | ANY}) | ANY,
    **SAMPLING,
    "max_tokens": MAX_TOKENS,
    "max_completion_tokens": MAX_TOKENS,
    "stop": STOP,
    "n": st.integers(0, 3) | ANY,
    "logit_bias": st.dictionaries(st.text(max_size=4), ANY, max_size=2) | ANY,
    "response_format": RESPONSE_FORMAT,
}
OLLAMA_OPTIONS = st.fixed_dictionaries(
    {"num_predict": NUM_PREDICT},
    optional={**SAMPLING, "stop": STOP, "num_ctx": st.integers(-1, 5000) | ANY, "mirostat": ANY},
) | (ANY.filter(lambda v: v is not None and not isinstance(v, dict)))
OLLAMA_COMMON = {
    "model": st.just(MODEL) | st.just(f"{MODEL}:latest") | ANY,
    "stream": st.booleans() | ANY,
    "options": OLLAMA_OPTIONS,
    "format": st.sampled_from(["", "json"]) | SCHEMA | ANY,
    "think": st.sampled_from([True, False, "low", "high"]) | ANY,
    "keep_alive": ANY,
    "images": st.lists(st.text(max_size=4), max_size=1) | ANY,
}
FUZZ = {
    "/v1/chat/completions": (
        {"model": MODEL, "messages": HI, "max_tokens": 2},
        {
            **OPENAI_COMMON,
            "messages": MESSAGES,
            "tools": TOOLS,
            "tool_choice": TOOL_CHOICE,
            "logprobs": ANY,
            "chat_template_kwargs": st.fixed_dictionaries({}, optional={"enable_thinking": ANY}) | ANY,
        },
    ),
    "/v1/completions": (
        {"model": MODEL, "prompt": "Hi", "max_tokens": 2},
        {
            **OPENAI_COMMON,
            "prompt": st.text(max_size=40) | st.lists(st.text(max_size=10), max_size=2) | ANY,
            "echo": ANY,
            "suffix": ANY,
            "best_of": ANY,
            "logprobs": ANY,
        },
    ),
    "/api/chat": (
        {"model": MODEL, "messages": HI, "options": {"num_predict": 2}},
        {**OLLAMA_COMMON, "messages": MESSAGES, "tools": TOOLS},
    ),
    "/api/generate": (
        {"model": MODEL, "prompt": "Hi", "options": {"num_predict": 2}},
        {
            **OLLAMA_COMMON,
            "prompt": st.text(max_size=40) | ANY,
            "system": st.text(max_size=20) | ANY,
            "raw": st.booleans() | ANY,
            "suffix": ANY,
            "template": ANY,
            "context": ANY,
        },
    ),
}


EDGES = {  # sent by every fuzz run, before the random ones: the edges a random draw may miss
    "/v1/chat/completions": [
        {"model": MODEL, "messages": [{"role": "assistant", "content": "Hi"}], "max_tokens": 2},
        {"model": MODEL, "messages": [{"role": "user", "content": ""}], "max_tokens": 2},
        {"model": MODEL, "messages": [{"role": "tool", "content": "1"}], "max_tokens": 2},
    ],
    "/v1/completions": [
        {"model": MODEL, "prompt": "", "max_tokens": 2},
        {"model": MODEL, "prompt": " ", "max_tokens": 2},
    ],
    "/api/chat": [
        {"model": MODEL, "messages": [{"role": "user", "content": ""}], "options": {"num_predict": 2}},
        {"model": MODEL, "messages": [{"role": "system"}], "options": {"num_predict": 2}},
    ],
    "/api/generate": [
        {"model": MODEL, "prompt": " ", "raw": True, "options": {"num_predict": 2}},
        {"model": MODEL, "prompt": "", "raw": True, "options": {"num_predict": 2}},
    ],
}


def fuzzed(path: str) -> st.SearchStrategy[dict[str, Any]]:
    """A valid request with one of its fields perhaps dropped, up to 4 set to random values (a length
    never to one that lets the answer run long), and random extra fields."""
    base, fields = FUZZ[path]

    def request(drop: set[str], change: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        out = {**{k: v for k, v in base.items() if k not in drop}, **extra, **change}
        if path.startswith("/api/"):
            out.setdefault("options", {"num_predict": 2})
        elif "max_tokens" not in out and "max_completion_tokens" not in out:
            out["max_tokens"] = 2
        return out

    return st.builds(
        request,
        st.sets(st.sampled_from(sorted(base)), max_size=1),
        st.lists(st.sampled_from(sorted(fields)), max_size=4, unique=True).flatmap(
            lambda keys: st.fixed_dictionaries({k: fields[k] for k in keys})
        ),
        st.dictionaries(st.text(max_size=12).filter(lambda k: k not in fields), ANY, max_size=2),
    )


def check_answer(path: str, got: httpx.Response, sent: dict[str, Any]) -> None:
    """Never a 5xx; a 4xx in the API's shape; a 200 that is an answer, never an error inside it."""
    assert got.status_code < 500, (sent, got.status_code, got.text)
    ollama_api = path.startswith("/api/")
    if got.status_code >= 400:
        error = got.json()["error"]
        if ollama_api:
            assert isinstance(error, str) and error, (sent, got.text)
        else:
            assert set(error) == {"message", "type", "param", "code"} and error["message"], (sent, got.text)
        return
    assert got.status_code == 200, (sent, got.status_code, got.text)
    kind = got.headers.get("content-type", "")
    if "event-stream" in kind:
        chunks = sse(iter(got.text.splitlines()))
        assert chunks and chunks[-1] == "[DONE]", (sent, got.text)
        assert not any("error" in c for c in chunks[:-1]), (sent, got.text)
        ends = [
            (c["index"], c["finish_reason"]) for k in chunks[:-1] for c in k["choices"] if c["finish_reason"]
        ]
        indexes = [index for index, _ in ends]  # each answer (n of them) ends once
        assert ends and sorted(indexes) == list(range(len(ends))), (sent, got.text)
        assert all(reason != "error" for _, reason in ends), (sent, got.text)
    elif "ndjson" in kind:
        parts = [json.loads(line) for line in got.text.splitlines() if line.strip()]
        assert parts and not any("error" in p for p in parts), (sent, got.text)
        assert parts[-1]["done"] and parts[-1]["done_reason"] != "error", (sent, got.text)
    else:
        answer = got.json()
        if ollama_api:
            assert answer["done"] and answer["done_reason"] != "error", (sent, got.text)
        else:
            assert answer["choices"], (sent, got.text)
            assert all(c["finish_reason"] != "error" for c in answer["choices"]), (sent, got.text)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", list(FUZZ))
def test_fuzzed_requests_never_fail_the_server(server: Server, path: str) -> None:
    """Random JSON in every field of a request (and random extra fields), ~100 requests: never a 5xx,
    errors in the API's shape, answers whole and streamed without an error inside, and no traceback
    or warning in the server's log."""
    since = server.mark()
    statuses: list[int] = []
    # 30 s: a 2-token answer takes well under a second even on a loaded machine; one that never comes
    # fails. No shrinking: a request that hangs would be sent again and again; the body is printed.
    with httpx.Client(base_url=server.url, timeout=30) as raw:

        @settings(max_examples=100, deadline=None, database=None, phases=[Phase.explicit, Phase.generate])
        @given(request=fuzzed(path))
        def check(request: dict[str, Any]) -> None:
            got = raw.post(path, content=json.dumps(request))
            statuses.append(got.status_code)
            check_answer(path, got, request)

        for edge in EDGES[path]:
            check = example(request=edge)(check)
        check()
        assert raw.get("/health").status_code == 200
    # the fuzz reached the model, not only the checks of the fields (measured: about 30 in 100)
    assert statuses.count(200) >= 10, statuses
    log = server.stderr()[since:]
    assert "Traceback" not in log and "warning:" not in log, log
    assert not [m[0] for m in server.access_lines(since) if m["status"].startswith("5")], log


# -- servers of their own ----------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_full_queue_is_429_and_a_left_stream_frees_its_sequence(smollm2_path: Path, tmp_path: Path) -> None:
    """--parallel 1 --queue 0: while one answer streams, another request is a 429 with Retry-After, in
    each API's shape; once its client leaves, the sequence is free within seconds (the answer it was
    decoding, 4000 tokens, would have held it for much longer)."""
    with serving(tmp_path, "--parallel", "1", "--queue", "0", "--ctx", "4096") as small:
        since = small.mark()
        body = {"model": MODEL, "prompt": COUNTING, "max_tokens": 4000, "temperature": 0, "stream": True}
        with httpx.Client(base_url=small.url, timeout=60) as raw:
            with raw.stream("POST", "/v1/completions", json=body) as streaming:
                assert streaming.status_code == 200
                lines = streaming.iter_lines()
                assert next(line for line in lines if line.startswith("data: {"))  # it is decoding
                full = raw.post(
                    "/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 2}
                )
                assert full.status_code == 429, full.text
                assert int(full.headers["Retry-After"]) >= 1
                error = full.json()["error"]
                assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
                full = raw.post("/api/chat", json={"model": MODEL, "messages": HI, "stream": False})
                assert full.status_code == 429 and isinstance(full.json()["error"], str)
                assert int(full.headers["Retry-After"]) >= 1
            left = time.monotonic()  # the stream's connection is closed here
            while True:
                got = raw.post("/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 2})
                if got.status_code == 200:
                    break
                assert got.status_code == 429, got.text
                assert time.monotonic() - left < 10, "the sequence was not freed within 10 s"
                time.sleep(0.1)
        line = small.wait_for_access(since, "/v1/completions")
        assert line["finish"] in ("cancelled", "interrupted") and int(line["completion"]) < 4000, line[0]


@pytest.mark.timeout(300)
def test_api_key(smollm2_path: Path, tmp_path: Path) -> None:
    """--api-key: without it or with a wrong one, 401 in the API's shape (OpenAI's on /v1, Ollama's on
    /api); the key as a Bearer token or x-api-key, 200; /health needs none."""
    with serving(tmp_path, "--api-key", "s3cret", "--parallel", "1", "--ctx", "512") as keyed:
        with httpx.Client(base_url=keyed.url, timeout=60) as raw:
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": "s3cret"},
                {"x-api-key": "x"},
            ):
                got = raw.get("/v1/models", headers=headers)
                assert got.status_code == 401, (headers, got.text)
                assert got.json()["error"]["type"] == "authentication_error"
                assert got.json()["error"]["code"] == "invalid_api_key"
                got = raw.get("/api/tags", headers=headers)
                assert got.status_code == 401 and isinstance(got.json()["error"], str), (headers, got.text)
                posted = raw.post(
                    "/v1/chat/completions", headers=headers, json={"messages": HI, "max_tokens": 1}
                )
                assert posted.status_code == 401
            assert raw.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
            assert raw.get("/api/tags", headers={"x-api-key": "s3cret"}).status_code == 200
            assert raw.get("/health").status_code == 200
        keyed_client = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="s3cret", max_retries=0)
        assert [m.id for m in keyed_client.models.list()] == [MODEL]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="nope", max_retries=0).models.list()


def refused(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runner", "serve", MODEL, *THREADS, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=serve_env(tmp_path),
        timeout=60,
    )


@pytest.mark.timeout(300)
def test_another_host_without_a_key_is_refused_before_loading(tmp_path: Path) -> None:
    """--host 0.0.0.0 without --api-key (nor RUNNER_API_KEY): exit 2, one line saying to give a key,
    and nothing loaded (no load line)."""
    done = refused(tmp_path, "--host", "0.0.0.0", "--port", str(free_port()))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--api-key" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.timeout(300)
def test_a_port_in_use_is_refused_before_loading(tmp_path: Path) -> None:
    """A port something already listens on: exit 2, one line naming the port, before any load."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = refused(tmp_path, "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"port {port}" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.timeout(300)
def test_sigterm_ends_the_answers_in_flight_and_exits_0(smollm2_path: Path, tmp_path: Path) -> None:
    """SIGTERM while two long answers stream (one OpenAI, one Ollama, through their clients): each
    stream ends cleanly with its finish reason "interrupted", and the server exits 0 within 10 s."""
    small = start_server(tmp_path, "--parallel", "2", "--ctx", "2048")
    begun = [threading.Event(), threading.Event()]
    ends: dict[str, Any] = {}

    def openai_stream() -> None:
        client = openai.OpenAI(base_url=f"{small.url}/v1", api_key="unused", max_retries=0, timeout=60)
        chunks = []
        for chunk in client.completions.create(
            model=MODEL, prompt=COUNTING, max_tokens=2000, temperature=0, stream=True
        ):
            chunks.append(chunk)
            if len(chunks) == 3:
                begun[0].set()
        ends["openai"] = chunks

    def ollama_stream() -> None:
        parts = []
        for part in ollama.Client(host=small.url, timeout=60).generate(
            model=MODEL,
            prompt=COUNTING,
            raw=True,
            stream=True,
            options={"temperature": 0, "num_predict": 2000},
        ):
            parts.append(part)
            if len(parts) == 3:
                begun[1].set()
        ends["ollama"] = parts

    threads = [threading.Thread(target=openai_stream), threading.Thread(target=ollama_stream)]
    try:
        for thread in threads:
            thread.start()
        assert all(event.wait(120) for event in begun), small.stderr()
        took = stop_server(small, within=30)
    finally:
        if small.proc.poll() is None:
            small.proc.kill()
            small.proc.wait()
        for thread in threads:
            thread.join(timeout=30)
    assert took < 10, took
    assert set(ends) == {"openai", "ollama"}, small.stderr()  # both streams ended without an error
    last = ends["openai"][-1].choices[0]
    assert last.finish_reason == "interrupted", ends["openai"][-3:]
    assert sum(1 for c in ends["openai"] if c.choices and c.choices[0].finish_reason) == 1
    assert ends["ollama"][-1].done and ends["ollama"][-1].done_reason == "interrupted", ends["ollama"][-3:]
    assert ends["ollama"][-1].eval_count < 2000
    assert "stopping" in small.stderr()


@pytest.mark.timeout(300)
def test_cors_only_when_asked_for(smollm2_path: Path, tmp_path: Path, http: httpx.Client) -> None:
    """--cors ORIGIN: a preflight from that origin is allowed (access-control-allow-origin), answers
    carry the header, another origin is not allowed; without --cors no CORS header at all."""
    preflight = {"Origin": "https://example.org", "Access-Control-Request-Method": "POST"}
    asked = {**preflight, "Access-Control-Request-Headers": "authorization, content-type"}
    cors = ("--cors", "https://example.org", "--parallel", "1", "--ctx", "512")
    with serving(tmp_path, *cors) as open_, httpx.Client(base_url=open_.url, timeout=60) as raw:
        got = raw.options("/v1/chat/completions", headers=asked)
        assert got.status_code == 200, got.text
        assert got.headers["access-control-allow-origin"] == "https://example.org"
        assert "POST" in got.headers["access-control-allow-methods"]
        assert "authorization" in got.headers["access-control-allow-headers"].lower()
        got = raw.get("/v1/models", headers={"Origin": "https://example.org"})
        assert got.status_code == 200
        assert got.headers["access-control-allow-origin"] == "https://example.org"
        other = raw.options("/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"})
        assert other.headers.get("access-control-allow-origin") != "https://evil.example"
        got = raw.get("/api/tags", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in got.headers
    # the shared server has no --cors
    got = http.options("/v1/chat/completions", headers=preflight)
    assert "access-control-allow-origin" not in got.headers and got.status_code == 405
    got = http.get("/v1/models", headers={"Origin": "https://example.org"})
    assert got.status_code == 200 and "access-control-allow-origin" not in got.headers
