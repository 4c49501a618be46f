"""runner serve's Anthropic Messages API, called with the real `anthropic` client against a real server
of the test model: whole and streamed answers, their stop reasons and usage, tools, count_tokens, and
errors in Anthropic's own shape."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from runner.serve.anthropic.protocol import CountRequest
from runner.serve.anthropic.serving import ask_of
from tests.serving import Server, serving

MODEL = "smollm2"
ASK = [{"role": "user", "content": "Name three colours."}]
GREEDY = {"temperature": 0}  # the client (2.x) has no sampling arguments: they go in extra_body
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.mark.fast
def test_blocks_become_the_messages_the_templates_read() -> None:
    request = CountRequest.model_validate(
        {
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "system", "content": "Use tools."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Weather?"}, {"type": "text", "text": "Paris"}],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "A tool.", "signature": "s"},
                        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t9", "content": "gone", "is_error": True}
                    ],
                },
            ],
            "tools": [WEATHER],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "thinking": {"type": "disabled"},
        }
    )
    ask = ask_of(request, MODEL)
    call = {
        "id": "t1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
    assert ask.messages == [
        {"role": "system", "content": "Be brief.\n\nUse tools."},
        {"role": "user", "content": "Weather?\nParis"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "t1", "name": "get_weather", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "t9", "content": "Error: gone"},
    ]
    function = {
        "name": "get_weather",
        "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"],
    }
    assert ask.tools == [{"type": "function", "function": function}]
    assert ask.tool_choice == {"type": "function", "function": {"name": "get_weather"}} and ask.think is False


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve") / "stderr"
    with serving([MODEL, "--parallel", "2", "--ctx", "1024", "--threads", "2"], log) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def ask(client: anthropic.Anthropic, **fields: Any) -> anthropic.types.Message:
    return client.messages.create(**{"model": MODEL, "messages": ASK, "max_tokens": 24, **fields})


def test_a_whole_answer(client: anthropic.Anthropic) -> None:
    reply = ask(client, extra_body=GREEDY)
    assert reply.id.startswith("msg_") and reply.model == MODEL and reply.role == "assistant"
    assert reply.content[0].type == "text" and reply.content[0].text
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.stop_sequence is None
    assert reply.usage.input_tokens > 0 and 0 < reply.usage.output_tokens <= 24


def test_a_streamed_answer_is_the_whole_answer(client: anthropic.Anthropic) -> None:
    whole = ask(client, extra_body=GREEDY)
    with client.messages.stream(model=MODEL, messages=ASK, max_tokens=24, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    prompt = final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
    assert prompt == whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)


def test_the_events_come_in_anthropics_order(client: anthropic.Anthropic) -> None:
    events = list(ask(client, max_tokens=8, stream=True, extra_body=GREEDY))  # greedy: it runs past 8
    kinds = [event.type for event in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[0].message.usage.input_tokens > 0 and events[1].content_block.type == "text"
    assert events[-2].delta.stop_reason == "max_tokens" and events[-2].usage.output_tokens == 8


def test_max_tokens_ends_the_answer(client: anthropic.Anthropic) -> None:
    reply = ask(client, max_tokens=5, extra_body=GREEDY)  # greedy: the answer runs past 5
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 5


def test_a_stop_sequence_ends_the_answer_and_is_named(client: anthropic.Anthropic) -> None:
    counting = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    whole = ask(client, messages=counting, max_tokens=60, extra_body=GREEDY).content[0].text
    stop = whole[len(whole) // 2 : len(whole) // 2 + 2]
    assert whole.index(stop) > 0, whole
    reply = ask(client, messages=counting, max_tokens=60, extra_body=GREEDY, stop_sequences=["@@", stop])
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == stop
    assert reply.content[0].text == whole[: whole.index(stop)]
    with client.messages.stream(
        model=MODEL, messages=counting, max_tokens=60, extra_body=GREEDY, stop_sequences=[stop]
    ) as stream:
        assert "".join(stream.text_stream) == whole[: whole.index(stop)]
        assert stream.get_final_message().stop_sequence == stop


def test_a_system_prompt_inside_the_messages_is_the_system_prompt(client: anthropic.Anthropic) -> None:
    system = "You answer in French."
    inside = [{"role": "system", "content": system}, *ASK]
    reply = ask(client, messages=inside, max_tokens=8)
    assert reply.content[0].text
    top = client.messages.count_tokens(model=MODEL, system=[{"type": "text", "text": system}], messages=ASK)
    assert client.messages.count_tokens(model=MODEL, messages=inside).input_tokens == top.input_tokens


@pytest.mark.parametrize(
    ("choice", "streamed"), [({"type": "tool", "name": "get_weather"}, False), ({"type": "any"}, True)]
)
def test_a_forced_tool_call_is_a_tool_use_block(
    client: anthropic.Anthropic, choice: dict[str, Any], streamed: bool
) -> None:
    fields = {"model": MODEL, "max_tokens": 60, "tools": [WEATHER], "tool_choice": choice}
    weather = [{"role": "user", "content": "What is the weather in Paris?"}]
    if streamed:
        with client.messages.stream(messages=weather, **fields) as stream:
            reply = stream.get_final_message()
    else:
        reply = client.messages.create(messages=weather, **fields)
    (use,) = [block for block in reply.content if block.type == "tool_use"]
    assert reply.stop_reason == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    assert isinstance(use.input, dict) and isinstance(use.input["city"], str)


def test_an_output_format_is_followed(client: anthropic.Anthropic) -> None:
    colour = {"enum": ["red", "green", "blue"]}
    schema = {"type": "object", "properties": {"colour": colour}, "required": ["colour"]}
    reply = ask(client, max_tokens=40, output_config={"format": {"type": "json_schema", "schema": schema}})
    assert reply.stop_reason == "end_turn" and json.loads(reply.content[0].text)["colour"] in colour["enum"]


def test_a_tool_result_goes_back_to_the_model(client: anthropic.Anthropic) -> None:
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should call the tool.", "signature": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "Sunny"}],
                }
            ],
        },
    ]
    reply = ask(client, messages=messages, tools=[WEATHER], max_tokens=16)
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use") and reply.content
    counted = client.messages.count_tokens(model=MODEL, messages=messages, tools=[WEATHER]).input_tokens
    assert counted == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)


def test_count_tokens_is_the_prompt_the_answer_evaluates(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model=MODEL, messages=ASK).input_tokens
    for _ in range(2):  # the second time, part of the prompt comes from the KV cache: the sum holds
        usage = ask(client, max_tokens=4).usage
        assert counted == usage.input_tokens + (usage.cache_read_input_tokens or 0) > 0


def _refused(client: anthropic.Anthropic, error: type[anthropic.APIStatusError], **fields: Any) -> str:
    """The client's error for a request with these fields (None: the field left out), said as
    "type: message" once its body is checked for Anthropic's shape."""
    body = {"model": MODEL, "messages": ASK, "max_tokens": 24, **fields}
    with pytest.raises(error) as caught:
        client.post("/v1/messages", body={k: v for k, v in body.items() if v is not None}, cast_to=object)
    said = caught.value.body
    assert isinstance(said, dict) and said["type"] == "error" and set(said["error"]) == {"type", "message"}
    return f"{said['error']['type']}: {said['error']['message']}"


def test_a_prompt_past_the_context_is_refused_in_anthropics_shape(client: anthropic.Anthropic) -> None:
    """Refused by the model (its tokens past the context); the refusals the fields alone decide are in
    test_serve_protocol.py, in process."""
    long = [{"role": "user", "content": "word " * 2000}]
    assert "context" in _refused(client, anthropic.BadRequestError, messages=long)


def test_a_client_that_leaves_cancels_its_answer(client: anthropic.Anthropic, server: Server) -> None:
    with client.messages.stream(model=MODEL, messages=ASK, max_tokens=400) as stream:
        next(iter(stream.text_stream))
    end = time.monotonic() + 30
    while not any(
        "POST /v1/messages 499" in ln and "finish=cancelled" in ln for ln in server.stderr().splitlines()
    ):
        assert time.monotonic() < end, server.stderr()
        time.sleep(0.1)


def test_the_api_key_is_asked_as_anthropic_asks_it(smollm2_path: Path, tmp_path: Path) -> None:
    args = [MODEL, "--parallel", "1", "--ctx", "512", "--threads", "2", "--api-key", "sesame"]
    with serving(args, tmp_path / "stderr") as keyed:
        right = anthropic.Anthropic(base_url=keyed.url, api_key="sesame", max_retries=0)
        assert right.messages.count_tokens(model=MODEL, messages=ASK).input_tokens > 0
        assert ask(right, max_tokens=2).usage.output_tokens == 2
        wrong = anthropic.Anthropic(base_url=keyed.url, api_key="open", max_retries=0)
        assert _refused(wrong, anthropic.AuthenticationError).startswith("authentication_error:")
        with pytest.raises(anthropic.AuthenticationError):
            wrong.messages.count_tokens(model=MODEL, messages=ASK)
