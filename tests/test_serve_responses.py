"""runner serve's OpenAI Responses API, called with the real `openai` client against a real server of
the test model: whole and streamed answers, incomplete ones, function calls and their outputs, JSON
schemas, responses kept in SQLite and continued (across a restart too), and errors in OpenAI's shape."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from runner.serve.responses.input import chat_messages, input_items
from runner.serve.responses.output import Output, whole_output
from runner.serve.responses.store import ResponseStore
from runner.store import StoredResponse
from tests.serving import Server, outcome_of, serving

MODEL = "smollm2"
ARGS = [MODEL, "--ctx", "1024", "--threads", "2"]
ASK = "Name three colours."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.mark.fast
def test_items_become_the_messages_the_templates_read() -> None:
    items = input_items(
        [
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "A tool."}]},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {
                "type": "function_call",
                "call_id": "c2",
                "name": "get_weather",
                "arguments": '{"city": "Rome"}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "Rain"}],
            },
            {
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Sunny, and rain.", "annotations": []}],
            },
            {"role": "system", "content": "Now be brief."},
        ]
    )
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
        {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
    ]
    assert chat_messages("Be kind.", items) == [
        {"role": "system", "content": "Be kind.\n\nUse tools."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": calls, "reasoning_content": "A tool."},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "c2", "name": "get_weather", "content": "Rain"},
        {"role": "assistant", "content": "Sunny, and rain."},
        {"role": "system", "content": "Now be brief."},
    ]
    assert chat_messages(None, input_items("Hi")) == [{"role": "user", "content": "Hi"}]


@pytest.mark.fast
def test_parts_become_items_and_their_events() -> None:
    output = Output()
    kinds = [e["type"] for e in output.part("reasoning", "Hm") + output.part("answer", "Hel")]
    kinds += [e["type"] for e in output.part("answer", "lo")]
    outcome = outcome_of("Hello", reasoning="Hm", tool_calls=({"name": "f", "arguments": {"a": 1}},))
    kinds += [e["type"] for e in output.end(outcome)]
    assert kinds == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    reasoning, message, call = output.items
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Hm"}]
    assert message["content"] == [{"type": "output_text", "text": "Hello", "annotations": []}]
    assert (call["name"], call["arguments"], call["status"]) == ("f", '{"a": 1}', "completed")
    assert [item["type"] for item in whole_output(outcome)] == ["reasoning", "message", "function_call"]
    assert [item["type"] for item in whole_output(outcome_of("", "length"))] == ["message"]


@pytest.mark.fast
def test_a_kept_response_round_trips_through_the_store_thread(tmp_path: Path) -> None:
    row = StoredResponse("resp_1", MODEL, 1.5, None, {"id": "resp_1", "output": []}, [{"a": 1}], [{"b": "é"}])

    async def use(store: ResponseStore) -> tuple[Any, ...]:
        await store.save(row)
        found = await store.load("resp_1")
        return found, await store.remove("resp_1"), await store.remove("resp_1"), await store.load("resp_1")

    store = ResponseStore(tmp_path / "c.db")
    try:
        assert asyncio.run(use(store)) == (row, True, False, None)
    finally:
        store.close()


# -- a real server ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def server(smollm2_path: Path, data: Path) -> Iterator[Server]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RUNNER_DATA_DIR", str(data))  # where it keeps responses (the process reads it once)
        with serving([*ARGS, "--parallel", "2"], data / "stderr") as running:
            yield running


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def ask(client: openai.OpenAI, **fields: Any) -> Any:
    return client.responses.create(**{"model": MODEL, "input": ASK, "max_output_tokens": 24, **fields})


def kept(data: Path) -> int:
    with sqlite3.connect(data / "conversations.db") as db:
        return int(db.execute("SELECT COUNT(*) FROM responses").fetchone()[0])


def test_a_text_answer(client: openai.OpenAI) -> None:
    reply = ask(client, temperature=0, metadata={"run": "1"}, reasoning={"effort": "low"}, user="u")
    assert reply.id.startswith("resp_") and reply.object == "response" and reply.model == MODEL
    assert reply.status == "completed" or reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output_text and reply.output[0].type == "message" and reply.output[0].id.startswith("msg_")
    assert reply.metadata == {"run": "1"} and reply.store is True and reply.temperature == 0
    usage = reply.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 24
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert reply.model_extra["timings"]["completion_tokens"] == usage.output_tokens


def test_a_streamed_answer_is_the_whole_answer(client: openai.OpenAI) -> None:
    whole = ask(client, temperature=0, max_output_tokens=80)  # room to end: the client's stream() wants it
    assert whole.status == "completed"
    with client.responses.stream(model=MODEL, input=ASK, max_output_tokens=80, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    done = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-4:] == [*done, "response.completed"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == whole.output_text == events[-4].text == final.output_text
    assert events[0].response.status == "in_progress" and events[0].response.id == final.id
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_max_output_tokens_leaves_it_incomplete(client: openai.OpenAI) -> None:
    reply = ask(client, max_output_tokens=5, temperature=0)  # greedy: the answer runs past 5
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 5 and reply.output[0].status == "incomplete"
    last = list(ask(client, max_output_tokens=5, stream=True, temperature=0))[-1]
    assert (
        last.type == "response.incomplete" and last.response.incomplete_details.reason == "max_output_tokens"
    )


@pytest.mark.parametrize(
    ("choice", "streamed"), [({"type": "function", "name": "get_weather"}, False), ("required", True)]
)
def test_a_forced_call_and_its_output_go_round(client: openai.OpenAI, choice: Any, streamed: bool) -> None:
    question = "What is the weather in Paris?"
    fields = {"model": MODEL, "input": question, "tools": [WEATHER], "tool_choice": choice}
    if streamed:
        with client.responses.stream(max_output_tokens=60, **fields) as stream:
            first = stream.get_final_response()
    else:
        first = client.responses.create(max_output_tokens=60, **fields)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert isinstance(json.loads(call.arguments)["city"], str)
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}
    continued = client.responses.create(
        model=MODEL, previous_response_id=first.id, input=[answer], tools=[WEATHER], max_output_tokens=16
    )
    said = {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}
    whole = [{"role": "user", "content": question}, said, answer]
    explicit = client.responses.create(
        model=MODEL, input=whole, tools=[WEATHER], max_output_tokens=16, store=False
    )
    for reply in (continued, explicit):
        assert reply.status in ("completed", "incomplete") and reply.output
    assert continued.usage.input_tokens == explicit.usage.input_tokens > first.usage.input_tokens


def test_a_json_schema_is_followed(client: openai.OpenAI) -> None:
    colour = {"enum": ["red", "green", "blue"]}
    schema = {"type": "object", "properties": {"colour": colour}, "required": ["colour"]}
    text = {"format": {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}}
    reply = ask(client, max_output_tokens=40, text=text)
    assert reply.status == "completed" and reply.text.format.type == "json_schema"
    jsonschema.validate(json.loads(reply.output_text), schema)


def test_a_continued_response_carries_the_earlier_turns(client: openai.OpenAI) -> None:
    first = ask(client, input="My name is Zed. Say hello to me.", temperature=0, max_output_tokens=16)
    then = "What is my name?"
    second = ask(client, previous_response_id=first.id, input=then, temperature=0, max_output_tokens=16)
    earlier = [{"role": "user", "content": "My name is Zed. Say hello to me."}]
    earlier.append({"role": "assistant", "content": first.output_text})
    explicit = ask(
        client, input=[*earlier, {"role": "user", "content": then}], store=False, max_output_tokens=4
    )
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens == explicit.usage.input_tokens
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 2
    assert second.usage.input_tokens_details.cached_tokens > 0  # the slot's KV cache held the earlier turn


def test_get_and_delete(client: openai.OpenAI) -> None:
    reply = ask(client, max_output_tokens=8)
    again = client.responses.retrieve(reply.id)
    assert (again.id, again.output_text, again.usage.output_tokens) == (
        reply.id,
        reply.output_text,
        reply.usage.output_tokens,
    )
    deleted = client.delete(f"/responses/{reply.id}", cast_to=object)
    assert deleted == {"id": reply.id, "object": "response", "deleted": True}
    for call in (client.responses.retrieve, client.responses.delete):
        with pytest.raises(openai.NotFoundError):
            call(reply.id)


def test_store_false_keeps_nothing(client: openai.OpenAI, data: Path) -> None:
    before = kept(data)
    reply = ask(client, max_output_tokens=4, store=False)
    assert reply.store is False and kept(data) == before
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)


def test_a_client_that_leaves_mid_stream_frees_its_sequence(
    client: openai.OpenAI, server: Server, data: Path
) -> None:
    before, cancelled = kept(data), server.stderr().count("finish=cancelled")
    with ask(client, input="Tell a long story.", max_output_tokens=400, stream=True) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                break
    end = time.monotonic() + 20
    while server.stderr().count("finish=cancelled") == cancelled and time.monotonic() < end:
        time.sleep(0.1)
    assert server.stderr().count("finish=cancelled") == cancelled + 1
    assert kept(data) == before


def _refused(client: openai.OpenAI, status: int, **fields: Any) -> dict[str, Any]:
    """The error body for a request with these fields, once checked for OpenAI's shape."""
    body = {"model": MODEL, "input": ASK, "max_output_tokens": 8, **fields}
    with pytest.raises(openai.APIStatusError) as caught:
        client.post("/responses", body=body, cast_to=object)
    said = caught.value.body
    assert caught.value.status_code == status
    assert isinstance(said, dict) and set(said) == {"message", "type", "param", "code"}, said
    return said


def test_a_prompt_past_the_context_is_refused_and_keeps_nothing(client: openai.OpenAI, data: Path) -> None:
    """Refused by the model (its tokens past the context); the refusals the fields alone decide are in
    test_serve_protocol.py, in process."""
    before = kept(data)
    said = _refused(client, 400, input="word " * 1500)
    assert said["code"] == "context_length_exceeded"
    assert kept(data) == before


# -- a restart ------------------------------------------------------------------------------


def test_a_response_is_continued_after_a_restart(smollm2_path: Path, _own_data_dir: Path) -> None:
    """Two servers, one after the other, over the same data directory (RUNNER_DATA_DIR, inherited)."""
    start = "My name is Zed and I like green. Say hello."
    with serving([*ARGS, "--parallel", "1"], _own_data_dir / "first.log") as first_server:
        client = openai.OpenAI(base_url=f"{first_server.url}/v1", api_key="unused", max_retries=0)
        first = ask(client, input=start, temperature=0, max_output_tokens=16)
    with serving([*ARGS, "--parallel", "1"], _own_data_dir / "second.log") as second_server:
        client = openai.OpenAI(base_url=f"{second_server.url}/v1", api_key="unused", max_retries=0)
        assert client.responses.retrieve(first.id).output_text == first.output_text
        then = "What colour do I like?"
        second = ask(client, previous_response_id=first.id, input=then, max_output_tokens=16)
        turns = [{"role": "user", "content": start}, {"role": "assistant", "content": first.output_text}]
        explicit = ask(
            client, input=[*turns, {"role": "user", "content": then}], store=False, max_output_tokens=4
        )
    assert second.status in ("completed", "incomplete") and second.output_text
    assert second.usage.input_tokens == explicit.usage.input_tokens > first.usage.input_tokens
    # one store, one history: the chain is listed once, by its last response, beside chat's conversations
    from runner.store import Store, StoredMessage
    from tests.conftest import run_cli

    store = Store.open()
    try:
        chat = store.new_conversation("smollm2", None, {})
        store.add_message(chat, StoredMessage("user", "A chat of mine"))
    finally:
        store.close()
    listed = [line.split("\t") for line in run_cli("history").stdout.decode().splitlines()]
    assert [row[:4] for row in listed] == [[str(chat), "chat", MODEL, "1"], [second.id, "serve", MODEL, "2"]]
    assert listed[1][5] == start
    shown = run_cli("history", "show", second.id).stdout.decode()
    for line in (f"user: {start}", f"assistant: {first.output_text}", f"user: {then}"):
        assert line + "\n" in shown, shown
    assert shown.rstrip().endswith(f"assistant: {second.output_text.strip()}") or second.output_text in shown
    whole = json.loads(run_cli("history", "show", second.id, "--json").stdout)
    assert whole["origin"] == "serve" and whole["previous_response_id"] == first.id
    assert whole["response"]["output"][0]["content"][0]["text"] == second.output_text
    exported = json.loads(run_cli("history", "export", "--json").stdout)
    assert [(e["format"], e["id"]) for e in exported] == [
        ("runner-conversation", chat),
        ("runner-response", second.id),
    ]
    removed = run_cli("history", "rm", second.id)
    assert removed.returncode == 0 and removed.stderr.decode() == (
        f"runner: removed response {second.id} and 1 earlier response of its chain\n"
    )
    assert [line.split("\t")[1] for line in run_cli("history").stdout.decode().splitlines()] == ["chat"]
    gone = run_cli("history", "show", first.id)
    assert (
        gone.returncode == 2
        and gone.stderr.decode() == f"runner: error: no response {first.id} (runner history lists them)\n"
    )
    bad = run_cli("history", "rm", "twelve")
    assert bad.returncode == 2 and b"neither a conversation number nor a response id" in bad.stderr
