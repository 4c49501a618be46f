"""Embeddings served: the `openai` and `ollama` clients against a real `runner serve`, the vectors
`runner embed` prints, bad input as each API's 400, and the server answering chat as before."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from tests.conftest import run_cli
from tests.serving import BATCH_COSINE, BATCH_TOLERANCE, TEXTS, Server, cosine, serving

MODEL = "smollm2"
FLOAT32 = 1e-7  # a unit vector's components through float32 (base64): within 2^-24 of each


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve-embed") / "stderr"
    with serving([MODEL, "--parallel", "2"], log) as running:
        yield running


@pytest.fixture(scope="module")
def printed(smollm2_path: Path) -> list[dict[str, Any]]:
    """`runner embed --each-line --jsonl` of TEXTS: one process, the texts batched as a request's are."""
    done = run_cli("embed", str(smollm2_path), "--each-line", "--jsonl", input="\n".join(TEXTS).encode())
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def worst(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for v, w in zip(a, b, strict=True) for x, y in zip(v, w, strict=True))


def test_openai_float_and_base64_are_runner_embeds(
    client: openai.OpenAI, printed: list[dict[str, Any]]
) -> None:
    expected = [p["embedding"] for p in printed]
    floats = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert [d.index for d in floats.data] == list(range(len(TEXTS)))
    assert worst([d.embedding for d in floats.data], expected) <= 1e-12
    tokens = sum(p["usage"]["prompt_tokens"] for p in printed)
    assert (floats.usage.prompt_tokens, floats.usage.total_tokens) == (tokens, tokens)
    assert floats.model == MODEL and floats.object == "list"
    decoded = client.embeddings.create(model=MODEL, input=TEXTS)  # the client asks for base64 itself
    assert worst([d.embedding for d in decoded.data], expected) <= FLOAT32
    raw = client.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="base64").data[0].embedding
    assert isinstance(raw, str)
    data = base64.b64decode(raw)
    assert len(data) == 576 * 4
    assert worst([list(struct.unpack("<576f", data))], [expected[0]]) <= FLOAT32


def test_ollama_embed_is_runner_embeds(server: Server, printed: list[dict[str, Any]]) -> None:
    olla = ollama.Client(host=server.url)
    reply = olla.embed(model=MODEL, input=TEXTS)
    assert worst([list(v) for v in reply.embeddings], [p["embedding"] for p in printed]) <= 1e-12
    assert reply.prompt_eval_count == sum(p["usage"]["prompt_tokens"] for p in printed)
    assert reply.total_duration and reply.total_duration > 0
    one = olla.embed(model=MODEL, input=TEXTS[0])
    assert worst([list(one.embeddings[0])], [printed[0]["embedding"]]) <= 1e-6  # alone, not batched
    long = olla.embed(model=MODEL, input="word " * 600)  # Ollama's default: truncate to the context
    assert long.prompt_eval_count == 512 and len(long.embeddings[0]) == 576


def test_requests_at_once_share_batches_and_give_the_same_vectors(
    client: openai.OpenAI, printed: list[dict[str, Any]]
) -> None:
    def one(i: int) -> list[float]:
        text = TEXTS[i % len(TEXTS)]
        return client.embeddings.create(model=MODEL, input=text, encoding_format="float").data[0].embedding

    def chat() -> str:
        question = [{"role": "user", "content": "Name a colour."}]
        answer = client.chat.completions.create(model=MODEL, messages=question, max_tokens=8, temperature=0)
        return answer.choices[0].message.content or ""

    with ThreadPoolExecutor(8) as pool:
        talking = pool.submit(chat)
        got = list(pool.map(one, range(18)))
        assert talking.result()
    expected = [printed[i % len(TEXTS)]["embedding"] for i in range(18)]
    assert worst(got, expected) <= BATCH_TOLERANCE
    assert min(cosine(v, w) for v, w in zip(got, expected, strict=True)) >= BATCH_COSINE


# The refusals the fields alone decide are in test_serve_protocol.py (in process); these need the model.
OPENAI_BAD = [({"model": MODEL, "input": ["a", "word " * 600]}, "input[1]")]


@pytest.mark.parametrize(("body", "param"), OPENAI_BAD)
def test_openai_bad_input_is_a_400_naming_the_field(server: Server, body: dict[str, Any], param: str) -> None:
    reply = httpx.post(f"{server.url}/v1/embeddings", json=body, timeout=60)
    assert reply.status_code == (404 if param == "model" else 400)
    error = reply.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


def test_openai_client_raises_on_a_text_too_long(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.embeddings.create(model=MODEL, input=["a", "word " * 600])
    assert "input[1] is 601 tokens, more than the 512" in raised.value.message
    assert raised.value.code == "context_length_exceeded"


@pytest.mark.parametrize(
    "body",
    [{"model": MODEL, "input": "word " * 600, "truncate": False}],
)
def test_ollama_bad_input_is_a_400_in_its_shape(server: Server, body: dict[str, Any]) -> None:
    reply = httpx.post(f"{server.url}/api/embed", json=body, timeout=60)
    assert reply.status_code == 400
    assert set(reply.json()) == {"error"} and reply.json()["error"]


def test_ollama_client_raises_and_an_empty_input_only_loads(server: Server) -> None:
    olla = ollama.Client(host=server.url)
    with pytest.raises(ollama.ResponseError) as raised:
        olla.embed(model=MODEL, input="word " * 600, truncate=False)
    assert raised.value.status_code == 400 and "601 tokens" in raised.value.error
    assert olla.embed(model=MODEL, input="").embeddings == []


def test_the_server_answers_chat_after(client: openai.OpenAI, server: Server) -> None:
    question = [{"role": "user", "content": "Say hello."}]
    answer = client.chat.completions.create(model=MODEL, messages=question, max_tokens=8)
    assert answer.choices[0].message.content
    assert "POST /v1/embeddings 200 prompt=" in server.stderr()
