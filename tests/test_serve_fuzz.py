"""runner serve under fuzzed requests, with the real model: random JSON in every field of OpenAI's and
Ollama's chat and completion requests (and random extra fields), ~100 requests a path against a real
`runner serve` (SmolLM2, 4 sequences of 1024 tokens): never a 5xx, errors in the API's shape, answers
whole and streamed without an error inside, and no traceback or warning in the server's log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

from tests.serving import HI, MODEL, Server, model_server, sse


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The file's server: 4 sequences of 1024 tokens, no key, no CORS."""
    with model_server(tmp_path_factory.mktemp("serve"), "--parallel", "4", "--ctx", "1024") as running:
        yield running


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
