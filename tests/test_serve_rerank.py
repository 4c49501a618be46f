"""Reranking served: POST /v1/rerank (and /rerank, /v1/reranking) on a real `runner serve` of the test
reranker beside SmolLM2, over loopback with httpx: the scores `runner rerank` prints (and so
llama-server's, tests/test_rerank.py), the Jina/Cohere shape, every bad input a 400 in OpenAI's error
shape naming its field, a chat model refused naming it, and the capability listed; and the reranker
asked to generate, through every API's own client, refused with a 400 in that API's shape (before it
loads, where it is served on demand) where SmolLM2 answers the same call."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from runner.engine.rerank import MAX_DOCUMENTS
from tests.conftest import run_cli
from tests.helpers import load_script
from tests.serving import Server, serving

make = load_script("make_test_reranker")
QUERY, DOCUMENTS = make.QUERY, make.DOCUMENTS


@pytest.fixture(scope="module")
def server(
    reranker_path: Path, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve-rerank") / "stderr"
    with serving(["smollm2", str(reranker_path), "--parallel", "2"], log) as running:
        yield running


@pytest.fixture(scope="module")
def name(server: Server) -> str:
    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    return next(m["id"] for m in models if m["meta"]["rerank"])


@pytest.fixture(scope="module")
def printed(reranker_path: Path) -> dict[str, Any]:
    done = run_cli("rerank", str(reranker_path), QUERY, *DOCUMENTS, "--json")
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def post(server: Server, body: dict[str, Any], path: str = "/v1/rerank") -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v1/reranking"])
def test_the_scores_are_runner_reranks_best_first(
    server: Server, name: str, printed: dict, path: str
) -> None:
    reply = post(server, {"model": name, "query": QUERY, "documents": DOCUMENTS}, path)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert (body["model"], body["object"]) == (name, "list")
    assert [r["index"] for r in body["results"]] == [r["index"] for r in printed["results"]]
    worst = max(
        abs(a["relevance_score"] - b["relevance_score"])
        for a, b in zip(body["results"], printed["results"], strict=True)
    )
    assert worst <= 1e-4
    assert body["usage"] == printed["usage"] and body["usage"]["prompt_tokens"] > len(DOCUMENTS)
    assert all("document" not in r for r in body["results"])


def test_objects_top_n_and_return_documents(server: Server, name: str, printed: dict) -> None:
    documents = [{"text": d} if i % 2 else d for i, d in enumerate(DOCUMENTS)]
    body = post(
        server, {"model": name, "query": QUERY, "documents": documents, "top_n": 3, "return_documents": True}
    )
    results = body.json()["results"]
    assert [r["index"] for r in results] == [r["index"] for r in printed["results"][:3]]
    assert [r["document"] for r in results] == [{"text": DOCUMENTS[r["index"]]} for r in results]
    unnamed = post(server, {"query": QUERY, "documents": DOCUMENTS[:2]})  # the first served reranker
    assert unnamed.status_code == 200 and unnamed.json()["model"] == name


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"query": QUERY, "documents": []}, "documents", "must not be empty"),
        ({"query": QUERY}, "documents", "required"),
        (
            {"query": QUERY, "documents": ["sky"] * (MAX_DOCUMENTS * 10)},
            "documents",
            f"at most {MAX_DOCUMENTS:,}",
        ),
        ({"query": QUERY, "documents": "sky"}, "documents", "must be a list"),
        ({"query": QUERY, "documents": ["sky", 3]}, "documents", "item 1 must be a string"),
        ({"query": QUERY, "documents": [{"txt": "sky"}]}, "documents", "item 0 must be a string"),
        ({"query": 3, "documents": ["sky"]}, "query", "string"),
        ({"query": "", "documents": ["sky"]}, "query", "at least 1 character"),
        ({"query": QUERY, "documents": ["sky"], "top_n": 0}, "top_n", "greater than or equal to 1"),
        ({"query": QUERY, "documents": ["sky"], "top_n": "2"}, "top_n", "integer"),
        ({"query": QUERY, "documents": ["sky"], "return_documents": "yes"}, "return_documents", "boolean"),
        ({"query": QUERY, "documents": ["sky", ""]}, "documents[1]", "documents[1] is empty"),
        (
            {"query": QUERY, "documents": ["sky", "cat " * 600]},
            "documents[1]",
            "documents[1]: the query and this document make ",
        ),
        (
            {"query": QUERY, "documents": ["sky", "cat " * 600]},
            "documents[1]",
            " tokens together, more than the 512 a rerank pair takes here",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    server: Server, name: str, body: dict, param: str, message: str
) -> None:
    reply = post(server, {"model": name, **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param) and message in error["message"]


def test_a_chat_model_is_refused_naming_it_and_a_reranker_does_not_embed(server: Server, name: str) -> None:
    chat = post(server, {"model": "smollm2", "query": QUERY, "documents": ["sky"]})
    assert chat.status_code == 400
    assert chat.json()["error"]["message"].startswith(
        "smollm2 is not a reranking model (its pooling is 'none'"
    )
    embed = httpx.post(f"{server.url}/v1/embeddings", json={"model": name, "input": "sky"}, timeout=60)
    assert embed.status_code == 400 and f"{name} is a reranking model" in embed.json()["error"]["message"]
    assert (
        httpx.post(f"{server.url}/v1/embeddings", json={"model": "smollm2", "input": "sky"}).status_code
        == 200
    )


def test_the_capability_is_listed(server: Server, name: str) -> None:
    meta = {m["id"]: m["meta"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]}
    assert (meta[name]["rerank"], meta["smollm2"]["rerank"]) == (True, False)
    show = httpx.post(f"{server.url}/api/show", json={"model": name}).json()
    assert show["capabilities"] == ["rerank"]
    assert (
        "rerank" not in httpx.post(f"{server.url}/api/show", json={"model": "smollm2"}).json()["capabilities"]
    )


def test_a_reranker_is_served_as_what_it_is_with_no_chat_warning(server: Server, name: str) -> None:
    """What a pooling model gets: no chat template warning, no sequences or prompt states said at the
    start (it keeps none), its pair length instead; /api/show without the chat warning, and no
    prompt_states in /v1/models (SmolLM2 beside it keeps its own)."""
    started = [line for line in server.stderr().splitlines() if f"runner: {name} (" in line]
    assert len(started) == 1, server.stderr()
    line = started[0]
    assert "reranks (POST /v1/rerank): a query and a document of 512 tokens at most a pair" in line
    assert "no chat, no KV cache kept between requests, no prompt states" in line
    assert "prompt states kept up to" not in line and "at once" not in line and "ctx " not in line
    assert "no chat template" not in server.stderr()
    shown = httpx.post(f"{server.url}/api/show", json={"model": name}).json()
    assert "warnings" not in shown and shown["capabilities"] == ["rerank"]
    meta = {m["id"]: m["meta"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]}
    assert "prompt_states" not in meta[name] and "prompt_states" in meta["smollm2"]


def test_the_pages_curl_example_answers(server: Server) -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "rerank.md").read_text()
    (line,) = [ln for ln in page.splitlines() if ln.startswith("curl ")]
    done = subprocess.run(
        line.replace("127.0.0.1:8080", server.address), shell=True, capture_output=True, timeout=60
    )
    body = json.loads(done.stdout)
    assert body["model"] == "reranker" and len(body["results"]) == 1
    assert body["results"][0]["document"]["text"] in {"The sky scatters blue light.", "Cats eat fish."}


# -- a reranker asked to generate ----------------------------------------------------------------

HI = [{"role": "user", "content": "Hi"}]


def generate(server: Server, api: str, model: str) -> str:
    """One generation request for `model` through `api`'s own client (one token): its text, or the
    client's own exception for a refusal."""
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
    olla = ollama.Client(host=server.url, timeout=60)
    if api == "openai chat":
        return oai.chat.completions.create(model=model, messages=HI, max_tokens=1).choices[0].message.content
    if api == "openai chat streamed":
        chunks = oai.chat.completions.create(model=model, messages=HI, max_tokens=1, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    if api == "openai completions":
        return oai.completions.create(model=model, prompt="Hi", max_tokens=1).choices[0].text
    if api == "responses":
        return oai.responses.create(model=model, input="Hi", max_output_tokens=1).output_text
    if api == "ollama chat":
        return olla.chat(model=model, messages=HI, options={"num_predict": 1}).message.content or ""
    if api == "ollama chat streamed":
        parts = olla.chat(model=model, messages=HI, options={"num_predict": 1}, stream=True)
        return "".join(p.message.content or "" for p in parts)
    if api == "ollama generate":
        return olla.generate(model=model, prompt="Hi", options={"num_predict": 1}).response
    if api == "anthropic":
        client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
        reply = client.messages.create(model=model, messages=HI, max_tokens=1)  # type: ignore[arg-type]
        return "".join(getattr(block, "text", "") for block in reply.content)
    raise AssertionError(api)


APIS = [
    "openai chat",
    "openai chat streamed",
    "openai completions",
    "responses",
    "ollama chat",
    "ollama chat streamed",
    "ollama generate",
    "anthropic",
]


def refusal(exc: Exception) -> tuple[int, str]:
    """The status and the message of a client's exception, checked to be in its API's error shape."""
    if isinstance(exc, ollama.ResponseError):  # Ollama's {"error": "..."}
        return exc.status_code, exc.error
    assert isinstance(exc, (openai.APIStatusError, anthropic.APIStatusError)), exc
    body = exc.response.json()
    if isinstance(exc, anthropic.APIStatusError):  # {"type": "error", "error": {"type", "message"}}
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    else:  # OpenAI's and the Responses API's {"error": {"message", "type", "param", "code"}}
        assert (body["error"]["type"], body["error"]["param"]) == ("invalid_request_error", "model"), body
    return exc.status_code, body["error"]["message"]


@pytest.mark.parametrize("api", APIS)
def test_a_reranker_asked_to_generate_is_refused_in_each_apis_shape(
    server: Server, name: str, api: str
) -> None:
    assert isinstance(generate(server, api, "smollm2"), str)  # the same call answers for a chat model
    with pytest.raises((openai.APIStatusError, anthropic.APIStatusError, ollama.ResponseError)) as refused:
        generate(server, api, name)
    status, message = refusal(refused.value)
    assert status == 400
    assert message == (
        f"{name} is a reranking model: it scores documents against a query (runner rerank, "
        "POST /v1/rerank) and does not generate text"
    )
    assert post(server, {"model": name, "query": QUERY, "documents": DOCUMENTS[:2]}).status_code == 200


def test_a_reranker_on_demand_is_refused_before_it_loads(reranker_path: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "reranker.gguf").symlink_to(reranker_path)
    with serving(["--models", str(models)], tmp_path / "stderr") as server:
        for path in ("/v1/chat/completions", "/api/chat"):
            body = {"model": "reranker", "messages": HI, "max_tokens": 1, "stream": False}
            reply = httpx.post(f"{server.url}{path}", json=body, timeout=60)
            assert reply.status_code == 400 and "reranker is a reranking model" in reply.text, reply.text
            assert httpx.get(f"{server.url}/api/ps").json()["models"] == []
        ranked = post(server, {"model": "reranker", "query": QUERY, "documents": DOCUMENTS[:2]})
        assert ranked.status_code == 200, ranked.text
        assert [m["name"] for m in httpx.get(f"{server.url}/api/ps").json()["models"]] == ["reranker"]
