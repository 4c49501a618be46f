"""runner serve's protocols in process: the real app (runner.serve.app.create_app) over a stand-in
Backend that answers without a model (tests.serving.StandIn), driven through Starlette's TestClient
and the real `openai` and `anthropic` clients on it. Every API's refusals (bad types, ranges, unknown
models, tool_choice, formats, bodies too deep, too large or not Unicode), each in its API's shape, the
errors no route makes (404, 405, 401), and what the answers carry from the engine's Outcome: seconds,
no process, no model. What needs the model (a prompt's length in tokens, a schema's grammar) is tested
against a real server in test_serve_openai.py, test_serve_ollama.py and the other test_serve_*.py.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from starlette.testclient import TestClient

from runner.serve.app import create_app
from runner.serve.responses.store import ResponseStore
from tests.serving import HI, MODEL, WEATHER, StandIn, body, chat, check_refused, outcome_of

BIG = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * (4 << 20)}]})
DEEP = json.dumps({"model": MODEL, "messages": HI, "metadata": json.loads("[" * 70 + "]" * 70)})
TOO_BIG = f"the body is {len(BIG):,} bytes, over the 4,194,304 bytes (4.2 MB) a request may be here"
SURROGATE = '{"model": "smollm2", "messages": [{"role": "user", "content": "a\\ud800b"}]}'


@pytest.fixture
def backend() -> StandIn:
    return StandIn()


@pytest.fixture
def lines() -> list[str]:
    return []


@pytest.fixture
def http(backend: StandIn, lines: list[str]) -> Iterator[TestClient]:
    with TestClient(create_app(backend, log=lines.append)) as client:
        yield client


# -- bad requests, each in its API's shape ---------------------------------------------------------

# (path, body, status, param (OpenAI) or None, what the message says). The ones only the model can
# refuse (a prompt too long in tokens, a schema its constraint engine cannot enforce) are in
# test_serve_openai.py and test_serve_ollama.py.
BAD = {
    "unknown model": ("/v1/chat/completions", chat(model="nope"), 404, "model", "served: smollm2"),
    "not JSON": ("/v1/chat/completions", '{"model": ', 400, None, "not valid JSON"),
    "not an object": ("/v1/chat/completions", "[1, 2]", 400, None, "must be a JSON object"),
    "a string body": ("/v1/chat/completions", '"hi"', 400, None, "must be a JSON object"),
    "NaN": ("/v1/chat/completions", chat()[:-1] + ', "temperature": NaN}', 400, None, "not valid JSON"),
    "nested too deep": ("/v1/chat/completions", DEEP, 400, None, "nested deeper than 64 levels"),
    "a lone surrogate": ("/v1/chat/completions", SURROGATE, 400, None, "lone surrogate"),
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
    "an image part": (
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        400,
        "messages[0].content[0].image_url.url",
        "smollm2 takes no images",
    ),
    "max_tokens -1": ("/v1/chat/completions", chat(max_tokens=-1), 400, "max_tokens", "greater than"),
    "max_tokens abc": ("/v1/chat/completions", chat(max_tokens="abc"), 400, "max_tokens", "integer"),
    "temperature 5": ("/v1/chat/completions", chat(temperature=5.0), 400, "temperature", "less than"),
    "n 5 over --parallel 4": ("/v1/chat/completions", chat(n=5), 400, "n", "answers 4 at once"),
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
    "tool_choice naming no tool": (
        "/v1/chat/completions",
        chat(tools=WEATHER, tool_choice={"type": "function", "function": {"name": "nope"}}),
        400,
        "tool_choice",
        "tool_choice",
    ),
    "tool_choice required without tools": (
        "/v1/chat/completions",
        chat(tool_choice="required"),
        400,
        "tool_choice",
        "naming one of the tools given",
    ),
    "completion unknown model": ("/v1/completions", body(model="nope", prompt="a"), 404, "model", "served"),
    "completion prompt a number": ("/v1/completions", body(model=MODEL, prompt=3), 400, "prompt", "string"),
    "chat body over 4 MiB": ("/v1/chat/completions", BIG, 413, None, TOO_BIG),
    "completion body over 4 MiB": ("/v1/completions", BIG, 413, None, TOO_BIG),
    "ollama unknown model": ("/api/chat", chat(model="nope"), 404, None, "served: smollm2"),
    "ollama not JSON": ("/api/chat", "{", 400, None, "not valid JSON"),
    "ollama not an object": ("/api/generate", "[]", 400, None, "must be a JSON object"),
    "ollama nested too deep": ("/api/chat", DEEP, 400, None, "nested deeper than 64 levels"),
    "ollama a lone surrogate": ("/api/chat", SURROGATE, 400, None, "lone surrogate"),
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
    "ollama num_ctx over": ("/api/chat", chat(options={"num_ctx": 5000}), 400, None, "num_ctx"),
    "ollama keep_alive a list": ("/api/chat", chat(keep_alive=[1]), 400, None, "keep_alive"),
    "ollama embed keep_alive a word": (
        "/api/embed",
        body(model=MODEL, input="a", keep_alive="soon"),
        400,
        None,
        "keep_alive",
    ),
    "ollama embeddings prompt a list": (
        "/api/embeddings",
        body(model=MODEL, prompt=["a"]),
        400,
        None,
        "prompt",
    ),
    "ollama embeddings unknown model": (
        "/api/embeddings",
        body(model="nope", prompt="a"),
        404,
        None,
        "served",
    ),
    "ollama body over 4 MiB": ("/api/chat", BIG, 413, None, TOO_BIG),
    "top_logprobs 21": (
        "/v1/chat/completions",
        chat(logprobs=True, top_logprobs=21),
        400,
        "top_logprobs",
        "20",
    ),
    "top_logprobs -1": (
        "/v1/chat/completions",
        chat(logprobs=True, top_logprobs=-1),
        400,
        "top_logprobs",
        "greater than or equal to 0",
    ),
    "top_logprobs without logprobs": (
        "/v1/chat/completions",
        chat(top_logprobs=2),
        400,
        "top_logprobs",
        "needs logprobs: true",
    ),
    "logprobs a string": ("/v1/chat/completions", chat(logprobs="yes"), 400, "logprobs", "boolean"),
    "logprobs with tools, streamed": (
        "/v1/chat/completions",
        chat(logprobs=True, tools=WEATHER, stream=True),
        400,
        "logprobs",
        "served whole",
    ),
    "completion logprobs 21": (
        "/v1/completions",
        body(model=MODEL, prompt="a", logprobs=21),
        400,
        "logprobs",
        "less than or equal to 20",
    ),
    "completion logprobs true": (
        "/v1/completions",
        body(model=MODEL, prompt="a", logprobs=True),
        400,
        "logprobs",
        "integer",
    ),
    "completion echo streamed": (
        "/v1/completions",
        body(model=MODEL, prompt="a", echo=True, stream=True),
        400,
        "echo",
        "not streamed",
    ),
    "completion echo n 2": (
        "/v1/completions",
        body(model=MODEL, prompt="a", echo=True, n=2),
        400,
        "echo",
        "n=1",
    ),
    "completion max_tokens 0": (
        "/v1/completions",
        body(model=MODEL, prompt="a", max_tokens=0),
        400,
        "max_tokens",
        "0 only with echo",
    ),
    "ollama logprobs with tools, streamed": (
        "/api/chat",
        chat(logprobs=True, tools=WEATHER),
        400,
        None,
        "served whole",
    ),
    "ollama top_logprobs 21": ("/api/chat", chat(logprobs=True, top_logprobs=21), 400, None, "top_logprobs"),
    "ollama logprobs a string": ("/api/generate", body(prompt="a", logprobs="yes"), 400, None, "logprobs"),
    "ollama show unknown": ("/api/show", body(model="nope"), 404, None, "served: smollm2"),
    "ollama show no model": ("/api/show", body(), 400, None, "model"),
}


@pytest.mark.fast
@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_requests_are_4xx_in_the_api_shape(http: TestClient, backend: StandIn, case: str) -> None:
    """Each bad request: its 4xx, the error in the shape of the API it came through (OpenAI's object
    naming the field, Ollama's string), nothing submitted, and the server answering after it."""
    path, content, status, param, says = BAD[case]
    check_refused(http, path, content, status, param, says)
    assert backend.asks == []


@pytest.mark.fast
@pytest.mark.parametrize(
    ("path", "content", "param"),
    [
        ("/v1/chat/completions", chat(messages=[{"role": "user", "content": "x" * 5000}]), "messages"),
        ("/v1/completions", body(model=MODEL, prompt="x" * 5000), "prompt"),
        ("/api/chat", body(model=MODEL, messages=[{"role": "user", "content": "x" * 5000}]), None),
        ("/api/generate", body(model=MODEL, prompt="x" * 5000, raw=True), None),
    ],
)
def test_a_prompt_too_long_is_a_400_before_any_stream(
    http: TestClient, path: str, content: str, param: str | None
) -> None:
    """The backend's TooLong, streamed or not: a 400 naming the field (context_length_exceeded), never
    a stream that begins and fails."""
    streamed = json.dumps({**json.loads(content), "stream": True})
    for sent in (content, streamed):
        message = check_refused(http, path, sent, 400, param, "a sequence's context is 1,024")
        assert "tokens" in message


@pytest.mark.fast
def test_a_full_queue_is_429_in_each_apis_shape(http: TestClient, backend: StandIn) -> None:
    backend.full = True
    got = http.post("/v1/chat/completions", content=chat())
    assert got.status_code == 429 and got.headers["Retry-After"] == "2"
    assert got.json()["error"]["type"] == "rate_limit_error"
    assert got.json()["error"]["code"] == "rate_limit_exceeded"
    got = http.post("/api/chat", json={"model": MODEL, "messages": HI, "stream": False})
    assert got.status_code == 429 and isinstance(got.json()["error"], str)
    got = http.post("/v1/messages", json={"model": MODEL, "messages": HI, "max_tokens": 2})
    assert got.status_code == 429 and got.json()["error"]["type"] == "rate_limit_error"


# -- the errors no route makes: the path says the API ----------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize(
    ("method", "path", "status", "shape"),
    [
        ("GET", "/v1/nothing", 404, "openai"),
        ("GET", "/nothing", 404, "openai"),
        ("GET", "/api", 404, "openai"),
        ("GET", "/api/nothing", 404, "ollama"),
        ("GET", "/api/chat", 405, "ollama"),
        ("DELETE", "/v1/chat/completions", 405, "openai"),
        ("GET", "/v1/messages", 405, "anthropic"),
        ("GET", "/v1/messages/nothing", 404, "anthropic"),
        ("PUT", "/v1/responses", 405, "openai"),
    ],
)
def test_no_route_is_said_in_the_shape_of_the_api_the_path_belongs_to(
    http: TestClient, lines: list[str], method: str, path: str, status: int, shape: str
) -> None:
    got = http.request(method, path)
    assert got.status_code == status, got.text
    error = got.json()["error"] if shape != "anthropic" else got.json()
    if shape == "ollama":
        assert isinstance(error, str) and path in error
    elif shape == "anthropic":
        assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        assert error["error"]["type"] == kind
    else:
        assert set(error) == {"message", "type", "param", "code"} and path in error["message"]
    if status == 405:
        assert got.headers["allow"]
    assert any(line.startswith(f"{method} {path} {status}") for line in lines), lines


@pytest.mark.fast
def test_a_missing_key_is_401_in_each_apis_shape(backend: StandIn) -> None:
    with TestClient(create_app(backend, api_key="s3cret", log=lambda _: None)) as http:
        got = http.get("/v1/models")
        assert got.status_code == 401 and got.headers["WWW-Authenticate"] == "Bearer"
        assert got.json()["error"]["type"] == "authentication_error"
        assert got.json()["error"]["code"] == "invalid_api_key"
        got = http.get("/api/tags", headers={"Authorization": "Bearer wrong"})
        assert got.status_code == 401 and isinstance(got.json()["error"], str)
        got = http.post("/v1/messages/count_tokens", headers={"x-api-key": "x"}, json={})
        assert got.status_code == 401 and got.json()["error"]["type"] == "authentication_error"
        assert http.get("/health").status_code == 200 and http.get("/").status_code == 200
        assert http.get("/v1/models", headers={"x-api-key": "s3cret"}).status_code == 200


@pytest.mark.fast
def test_an_exception_in_a_route_is_a_500_in_its_apis_shape(http: TestClient, backend: StandIn) -> None:
    """A failure nobody foresaw, in a route: its API's 500, the log saying what it was; never a
    traceback to the client."""

    async def broken(ask: Any) -> Any:
        raise KeyError("boom")

    backend.submit = broken
    got = http.post("/v1/chat/completions", content=chat())
    assert got.status_code == 500 and got.json()["error"]["type"] == "server_error"
    assert "server's log" in got.json()["error"]["message"]
    got = http.post("/api/generate", json={"model": MODEL, "prompt": "a", "stream": False})
    assert got.status_code == 500 and isinstance(got.json()["error"], str)
    got = http.post("/v1/messages", json={"model": MODEL, "messages": HI, "max_tokens": 2})
    assert got.status_code == 500 and got.json()["error"]["type"] == "api_error"


# -- what the answers carry, from the engine's Outcome ------------------------------------------------


@pytest.mark.fast
def test_an_error_mid_stream_ends_each_stream_in_its_apis_shape(http: TestClient, backend: StandIn) -> None:
    class Failing(list[tuple[str, str]]):
        def __iter__(self) -> Any:
            yield ("answer", "Hi")
            raise RuntimeError("the engine fell over")

    backend.parts = Failing()
    got = http.post("/v1/chat/completions", content=chat(stream=True))
    assert got.status_code == 200 and '"content":"Hi"' in got.text
    error = json.loads(got.text.strip().splitlines()[-1].removeprefix("data: "))["error"]
    assert error["type"] == "server_error" and "[DONE]" not in got.text
    got = http.post("/api/chat", json={"model": MODEL, "messages": HI})
    assert got.status_code == 200 and "error" in json.loads(got.text.strip().splitlines()[-1])
    got = http.post("/v1/messages", json={"model": MODEL, "messages": HI, "max_tokens": 2, "stream": True})
    assert got.text.strip().splitlines()[-2] == "event: error"
    assert (
        json.loads(got.text.strip().splitlines()[-1].removeprefix("data: "))["error"]["type"] == "api_error"
    )
    got = http.post("/v1/responses", json={"model": MODEL, "input": "Hi", "stream": True})
    last = json.loads(got.text.strip().splitlines()[-1].removeprefix("data: "))
    assert last["type"] == "error" and last["code"] == "server_error" and last["sequence_number"] > 2
    assert all(g.cancelled for g in backend.generations)  # none ran out: each was cancelled


def anthropic_client(http: TestClient) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url="http://testserver", api_key="unused", max_retries=0, http_client=http
    )


@pytest.mark.fast
def test_anthropics_stop_sequence_is_the_one_the_engine_stopped_at(
    http: TestClient, backend: StandIn
) -> None:
    """stop_reason "stop_sequence" and the string named, whole and streamed, when the engine reports
    it (Outcome.stop_sequence); an end token is end_turn with no stop_sequence. The request's
    stop_sequences go to the engine as its stop strings."""
    backend.outcome = outcome_of("Hello there", prompt_tokens=5, completion_tokens=2, stop="END")
    client = anthropic_client(http)
    fields: dict[str, Any] = {
        "model": MODEL,
        "messages": HI,
        "max_tokens": 20,
        "stop_sequences": ["@@", "END"],
    }
    reply = client.messages.create(**fields)
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "END"
    assert reply.content[0].text == "Hello there"
    assert backend.asks[-1].stop == ("@@", "END")
    with client.messages.stream(**fields) as stream:
        assert "".join(stream.text_stream) == "Hello there"
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == "END"
    backend.outcome = outcome_of("Hello there", prompt_tokens=5, completion_tokens=2)
    reply = client.messages.create(**fields)
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None


def test_finish_and_done_reasons_come_from_the_outcome(http: TestClient, backend: StandIn) -> None:
    backend.outcome = outcome_of("Hello there", "length", prompt_tokens=5, completion_tokens=2)
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", max_retries=0, http_client=http)
    answer = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2)
    assert answer.choices[0].finish_reason == "length" and answer.choices[0].message.content == "Hello there"
    done = http.post("/api/chat", json={"model": MODEL, "messages": HI, "stream": False}).json()
    assert done["done_reason"] == "length" and done["message"]["content"] == "Hello there"
    reply = anthropic_client(http).messages.create(model=MODEL, messages=HI, max_tokens=2)
    assert reply.stop_reason == "max_tokens"


# -- the Anthropic API's refusals ----------------------------------------------------------------------


def _refused(client: anthropic.Anthropic, error: type[anthropic.APIStatusError], **fields: Any) -> str:
    """The client's error for a request with these fields (None: the field left out), said as
    "type: message" once its body is checked for Anthropic's shape."""
    sent = {"model": MODEL, "messages": HI, "max_tokens": 24, **fields}
    with pytest.raises(error) as caught:
        client.post("/v1/messages", body={k: v for k, v in sent.items() if v is not None}, cast_to=object)
    said = caught.value.body
    assert isinstance(said, dict) and said["type"] == "error" and set(said["error"]) == {"type", "message"}
    return f"{said['error']['type']}: {said['error']['message']}"


@pytest.mark.fast
def test_a_body_sent_without_its_length_is_bounded_as_it_arrives(http: TestClient, backend: StandIn) -> None:
    """Chunked, with no Content-Length to read first: refused once it passes the bound, in the same
    words (the bound's digits grouped)."""
    chunks = iter([BIG[i : i + (1 << 20)].encode() for i in range(0, len(BIG), 1 << 20)])
    got = http.post("/v1/chat/completions", content=chunks)
    assert got.status_code == 413 and "content-length" not in got.request.headers
    said = got.json()["error"]
    assert said["message"] == "the body is over the 4,194,304 bytes (4.2 MB) a request may be here", said
    assert backend.asks == []


@pytest.mark.fast
def test_an_images_media_type_is_held_to_its_bytes_as_anthropic_holds_it(
    http: TestClient, backend: StandIn
) -> None:
    """Anthropic's API refuses PNG bytes sent as image/jpeg, a media type outside its four, and none:
    so does runner, in Anthropic's error shape, through Anthropic's own client, before the model."""
    import base64

    from tests.helpers import random_png

    png = base64.b64encode(random_png(1)).decode()
    client = anthropic_client(http)

    def sent(source: dict[str, Any]) -> str:
        content = [{"type": "image", "source": {"type": "base64", **source}}, {"type": "text", "text": "Hi"}]
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": content}])
        said = caught.value.body
        assert isinstance(said, dict) and said["type"] == "error", said
        assert said["error"]["type"] == "invalid_request_error", said
        return said["error"]["message"]

    where = "messages[0].content[0].source"
    assert sent({"media_type": "image/jpeg", "data": png}) == (
        f"{where}.data: the image's bytes are image/png, not the image/jpeg its media_type says"
    )
    assert sent({"media_type": "image/bmp", "data": png}).startswith(
        f"{where}.media_type: Input should be one of 'image/jpeg', 'image/png', 'image/gif', 'image/webp'"
    )
    assert sent({"data": png}) == f"{where}.media_type: Field required"
    assert "takes no images" in sent({"media_type": "image/png", "data": png})  # right: on to the model
    assert backend.asks == []


@pytest.mark.fast
def test_bad_requests_are_refused_in_anthropics_shape(http: TestClient, backend: StandIn) -> None:
    client = anthropic_client(http)
    bad = anthropic.BadRequestError
    assert _refused(client, bad, max_tokens=None).startswith(
        "invalid_request_error: max_tokens: Field required"
    )
    assert "max_tokens" in _refused(client, bad, max_tokens=0)
    assert "temperature" in _refused(client, bad, temperature=1.5)
    assert "messages[0].role" in _refused(client, bad, messages=[{"role": "robot", "content": "Hi"}])
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    said = _refused(client, bad, messages=[{"role": "user", "content": [image]}])
    assert "messages[0].content[0].source.data" in said and "takes no images" in said
    misplaced = [
        {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]}
    ]
    assert "tool_use blocks belong in assistant messages" in _refused(client, bad, messages=misplaced)
    tool = {"name": "get_weather", "input_schema": {"type": "object"}}
    assert "tool_choice.name" in _refused(
        client, bad, tools=[tool], tool_choice={"type": "tool", "name": "x"}
    )
    assert "'any' needs tools" in _refused(client, bad, tool_choice={"type": "any"})
    assert "only client tools" in _refused(client, bad, tools=[{**tool, "type": "web_search_20250305"}])
    assert "a sequence's context" in _refused(client, bad, messages=[{"role": "user", "content": "x" * 5000}])
    too_large = _refused(
        client, anthropic.APIStatusError, messages=[{"role": "user", "content": "x" * (4 << 20)}]
    )
    assert too_large.startswith("request_too_large:")
    missing = _refused(client, anthropic.NotFoundError, model="claude-opus-4")
    assert missing.startswith("not_found_error:") and MODEL in missing
    assert backend.asks == []


@pytest.mark.fast
def test_a_wrong_method_is_refused_in_anthropics_shape(http: TestClient) -> None:
    reply = http.get("/v1/messages")
    assert reply.status_code == 405
    assert reply.json()["type"] == "error" and reply.json()["error"]["type"] == "invalid_request_error"


# -- the Responses API's refusals ----------------------------------------------------------------------


def test_responses_bad_requests_are_refused_in_openais_shape_and_keep_nothing(
    backend: StandIn, tmp_path: Path
) -> None:
    store = ResponseStore(tmp_path / "responses.db")
    try:
        with TestClient(create_app(backend, store=store, log=lambda _: None)) as http:
            client = openai.OpenAI(
                base_url="http://testserver/v1", api_key="unused", max_retries=0, http_client=http
            )

            def refused(status: int, **fields: Any) -> dict[str, Any]:
                sent = {"model": MODEL, "input": "Hi", "max_output_tokens": 8, **fields}
                with pytest.raises(openai.APIStatusError) as caught:
                    client.post("/responses", body=sent, cast_to=object)
                said = caught.value.body
                assert caught.value.status_code == status
                assert isinstance(said, dict) and set(said) == {"message", "type", "param", "code"}, said
                return said

            said = refused(404, model="gpt-9")
            assert said["type"] == "not_found_error" and said["param"] == "model"
            said = refused(400, tools=[{"name": "x"}])  # a web_search tool is left out: test_agents_traffic
            assert said["param"] == "tools[0].type" and "type" in said["message"]
            said = refused(400, input=[{"type": "computer_call", "id": "x"}])
            assert said["param"] == "input[0].type" and "computer_call" in said["message"]
            said = refused(404, previous_response_id="resp_nothing")
            assert said["type"] == "not_found_error" and said["param"] == "previous_response_id"
            image = {"type": "input_image", "image_url": "https://example.com/a.png"}
            said = refused(400, input=[{"role": "user", "content": [image]}])
            assert said["param"] == "input[0].content[0].image_url" and "takes no images" in said["message"]
            for field, value in [
                ("background", True),
                ("include", ["message.output_text.logprobs"]),
                ("include", [{}]),  # not a string: a 400, not a TypeError's 500
            ]:
                assert refused(400, **{field: value})["param"] == field
            weather = {
                "type": "function",
                "name": "get_weather",
                "parameters": WEATHER[0]["function"]["parameters"],
            }
            choice = {"type": "function", "name": "x"}
            assert refused(400, tools=[weather], tool_choice=choice)["param"] == "tool_choice"
            assert refused(400, tool_choice={"type": "function", "name": ["x"]})["param"] == "tool_choice"
            assert refused(400, temperature=3)["param"] == "temperature"
            assert refused(400, input="x" * 5000)["code"] == "context_length_exceeded"
            got = http.get("/v1/responses/resp_nothing")
            assert got.status_code == 404 and got.json()["error"]["type"] == "not_found_error"
            assert backend.asks == []
            assert http.post("/v1/responses", json={"model": MODEL, "input": "Hi"}).status_code == 200
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "responses.db") as db:
        assert db.execute("SELECT count(*) FROM responses").fetchone()[0] == 1  # the one answered


# -- embeddings' refusals -------------------------------------------------------------------------------

OPENAI_BAD = [  # those only the model refuses (a text past the embedding context): test_serve_embed.py
    ({"model": MODEL}, "input"),
    ({"model": MODEL, "input": []}, "input"),
    ({"model": MODEL, "input": [1, 2, 3]}, "input"),
    ({"model": MODEL, "input": [[1, 2]]}, "input"),
    ({"model": MODEL, "input": ["a", ""]}, "input[1]"),
    ({"model": MODEL, "input": ["a"] * 257}, "input"),
    ({"model": MODEL, "input": "a", "dimensions": 64}, "dimensions"),
    ({"model": MODEL, "input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"model": "nope", "input": "a"}, "model"),
]


@pytest.mark.fast
@pytest.mark.parametrize(("sent", "param"), OPENAI_BAD)
def test_openai_embeddings_bad_input_is_a_400_naming_the_field(
    http: TestClient, sent: dict[str, Any], param: str
) -> None:
    reply = http.post("/v1/embeddings", json=sent)
    assert reply.status_code == (404 if param == "model" else 400)
    error = reply.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


@pytest.mark.fast
@pytest.mark.parametrize(
    "sent",
    [
        {"model": MODEL, "input": ["a", ""]},
        {"model": MODEL, "input": [1]},
        {"model": MODEL, "input": "a", "dimensions": 64},
    ],
)
def test_ollama_embed_bad_input_is_a_400_in_its_shape(http: TestClient, sent: dict[str, Any]) -> None:
    reply = http.post("/api/embed", json=sent)
    assert reply.status_code == 400
    assert set(reply.json()) == {"error"} and reply.json()["error"]


# the headers the official JavaScript SDKs send on every request (openai-node, anthropic-sdk-typescript:
# their Stainless-generated core), so a browser's preflight asks for all of them
OPENAI_JS = (
    "authorization,content-type,accept,x-stainless-arch,x-stainless-lang,x-stainless-os,"
    "x-stainless-package-version,x-stainless-retry-count,x-stainless-runtime,"
    "x-stainless-runtime-version,x-stainless-timeout,openai-organization,openai-project"
)
ANTHROPIC_JS = (
    "anthropic-dangerous-direct-browser-access,anthropic-version,content-type,x-api-key,accept,"
    "x-stainless-arch,x-stainless-lang,x-stainless-os,x-stainless-package-version,"
    "x-stainless-retry-count,x-stainless-runtime,x-stainless-runtime-version,x-stainless-timeout,"
    "x-stainless-helper-method"
)


@pytest.mark.fast
@pytest.mark.parametrize(
    ("path", "asked"), [("/v1/chat/completions", OPENAI_JS), ("/v1/messages", ANTHROPIC_JS)]
)
def test_a_browser_preflight_of_the_javascript_sdks_is_allowed(
    backend: StandIn, path: str, asked: str
) -> None:
    """`--cors '*'`: the preflight a browser makes for the openai and anthropic JavaScript SDKs (their
    x-stainless-* headers included) is allowed, every header it asks for named in the answer; it was
    a 400 "Disallowed CORS headers"."""
    with TestClient(create_app(backend, cors="*", log=lambda _: None)) as http:
        got = http.options(
            path,
            headers={
                "Origin": "http://localhost:5173",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": asked,
            },
        )
    assert got.status_code == 200, got.text
    assert got.headers["access-control-allow-origin"] in ("*", "http://localhost:5173")
    allowed = {h.strip() for h in got.headers["access-control-allow-headers"].lower().split(",")}
    assert set(asked.split(",")) <= allowed
