"""runner serve's Ollama API with the real model: the `ollama` client against a real `runner serve`
(SmolLM2, 4 sequences of 1024 tokens) over 127.0.0.1. Chat whole and streamed, generate, lengths,
list, show, ps, version and `format` schemas, the older /api/embeddings, the load and unload of a
model named at start (it stays), model management refused, and the refusals only the model can make (a
prompt too long in tokens, a schema its constraint engine cannot enforce). The refusals the fields
alone decide are in test_serve_protocol.py, in process.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import ollama
import pytest

from tests.serving import MODEL, PERSON, Server, body, chat, check_refused, model_server

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
def olla(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as raw:
        yield raw


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


def test_the_older_embeddings_endpoint_is_embeds_vector(olla: ollama.Client, http: httpx.Client) -> None:
    """/api/embeddings (one prompt, one vector, Ollama's older endpoint; it was a 404) answers the
    vector /api/embed does; an empty prompt only loads the model; a prompt too long is a 400 naming it."""
    text = "The cat sat on the mat."
    one = olla.embeddings(model=MODEL, prompt=text).embedding
    (same,) = olla.embed(model=MODEL, input=text).embeddings
    assert len(one) == 576 and all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(one, same, strict=True))
    assert olla.embeddings(model=MODEL, prompt="").embedding == []
    refused = http.post("/api/embeddings", json={"model": MODEL, "prompt": LONG_TEXT})
    assert refused.status_code == 400 and refused.json()["error"].startswith("prompt is "), refused.text


def test_a_model_named_at_start_stays_loaded(olla: ollama.Client) -> None:
    """`runner serve MODEL`: Ollama's load answers at once (nothing to load); its unload (keep_alive 0,
    what `ollama stop` sends) is a 409 saying the model stays while served (it answered "load"); a
    request's keep_alive 0 does not unload it either."""
    load = olla.generate(model=MODEL)
    assert load.done_reason == "load" and load.load_duration == 0
    with pytest.raises(ollama.ResponseError) as refused:
        olla.generate(model=MODEL, keep_alive=0)
    assert refused.value.status_code == 409 and "stays loaded while this server runs" in refused.value.error
    with pytest.raises(ollama.ResponseError):
        olla.chat(model=MODEL, messages=[], keep_alive=0)
    olla.chat(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2}, keep_alive=0
    )
    time.sleep(1)  # the reaper looks every 0.25 s
    assert [m.model for m in olla.ps().models] == [MODEL]


def test_model_management_is_refused_naming_runners_command(olla: ollama.Client) -> None:
    """pull, push, create, copy and delete (404s before) are 403s in Ollama's shape saying what does it
    instead: a request never downloads, writes or removes a model."""
    calls = {
        'runner pull "qwen3"': lambda: olla.pull("qwen3"),
        "does not push": lambda: olla.push(MODEL),
        "does not create": lambda: olla.create(model="mine", from_=MODEL),
        "does not copy": lambda: olla.copy(MODEL, "mine"),
        f'runner rm "{MODEL}"': lambda: olla.delete(MODEL),
    }
    for says, call in calls.items():
        with pytest.raises(ollama.ResponseError) as refused:
            call()
        assert refused.value.status_code == 403 and says in refused.value.error, refused.value.error
    assert [m.model for m in olla.list().models] == [MODEL]


# -- what only the model refuses ----------------------------------------------------------------------


def test_a_schema_the_constraint_engine_cannot_enforce_is_a_400(http: httpx.Client) -> None:
    check_refused(http, "/api/chat", chat(format=UNIQUE), 400, None, "uniqueItems (at properties/tags)")


def check_too_long(http: httpx.Client, case: tuple[str, str, int, str | None, str]) -> None:
    """A prompt past a sequence's context, refused in the API's shape with its count of tokens."""
    message = check_refused(http, *case)
    counted = re.search(r"the prompt is ([\d,]+) tokens", message)
    assert counted and int(counted[1].replace(",", "")) > 2500, message


@pytest.mark.parametrize(
    "case",
    [
        (
            "/api/chat",
            body(model=MODEL, messages=[{"role": "user", "content": LONG_TEXT}], stream=False),
            400,
            None,
            "tokens; a sequence's context is 1,024",
        ),
        (
            "/api/generate",
            body(model=MODEL, prompt=LONG_TEXT),
            400,
            None,
            "tokens; a sequence's context is 1,024",
        ),
    ],
    ids=["ollama chat too long", "ollama generate too long"],
)
def test_a_prompt_too_long_is_a_400_with_its_count(
    http: httpx.Client, case: tuple[str, str, int, str | None, str]
) -> None:
    check_too_long(http, case)


@pytest.mark.fast
def test_capabilities_say_what_a_pooling_model_does_and_no_chat() -> None:
    """Ollama's clients read `capabilities` before they send anything: a reranker only reranks, an
    encoder (an embedding model) only embeds; a chat model completes, with what its template offers."""
    from dataclasses import replace

    from runner.serve.backend import ModelInfo
    from runner.serve.ollama.serving import capabilities

    chat_model = ModelInfo(MODEL, "/m.gguf", 1, 0.0, None, "llama", "Q4_1", "", 512, 1, "{{ tools }}")
    reranker = replace(chat_model, architecture="bert", template=None, metadata={"bert.pooling_type": 4})
    encoder = replace(chat_model, architecture="bert", template=None, metadata={"bert.pooling_type": 1})
    assert capabilities(chat_model) == ["completion", "tools"]
    assert capabilities(reranker) == ["rerank"]
    assert capabilities(encoder) == ["embedding"]
