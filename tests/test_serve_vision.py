"""Images through `runner serve MODEL --mmproj FILE`, with the real clients, on a real server of the test
model and a test projector (scripts/make_test_projector.py: random weights, so answers mean nothing,
but the same prompt gives the same tokens): each API's answer to an image and a question is the one
`runner run --image` gives; a chat that sends the same image every turn evaluates it once; every bad
image is a 4xx in the API's own shape, never a 5xx, and the server goes on; docs/serve.md's examples
run. One server for the module."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from runner.serve.app import create_app
from runner.serve.shared.images import ImageRef, joined
from tests.conftest import run_cli
from tests.helpers import random_png as png
from tests.serving import MODEL, THREADS, Server, StandIn, model_server, openai_client

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_test_projector.py"
PAGE = (Path(__file__).resolve().parent.parent / "docs" / "serve.md").read_text()
IMAGE_TOKENS = 4  # the mlp test projector: 28/14 = 2x2 patches
MAX_IMAGES = 3  # the module server's --max-images
MAX_IMAGE_BYTES = 50_000  # its --max-image-bytes
QUESTION = "What is this?"
ANSWER_TOKENS = 12


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{b64(data)}"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vision")
    made = {"mlp": folder / "mlp.gguf", "models": folder / "models"}
    subprocess.run(
        [sys.executable, str(SCRIPT), str(made["mlp"]), "--for", str(smollm2_path), "--type", "mlp"],
        check=True,
        capture_output=True,
    )
    for seed, name in ((1, "a.png"), (2, "b.png")):
        made[name] = folder / name
        made[name].write_bytes(png(seed))
    made["models"].mkdir()
    (made["models"] / "other.gguf").symlink_to(smollm2_path)  # served on demand, without a projector
    return made


@pytest.fixture(scope="module")
def server(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    args = ["--mmproj", str(files["mlp"]), "--max-images", str(MAX_IMAGES)]
    args += ["--max-image-bytes", str(MAX_IMAGE_BYTES), "--models", str(files["models"])]
    with model_server(tmp_path_factory.mktemp("serve"), *args) as started:
        yield started


def run_answer(question: str, *images: Path, mmproj: Path) -> dict[str, Any]:
    """`runner run --image …` of the same question: greedy, ANSWER_TOKENS tokens, one thread."""
    shown = [x for image in images for x in ("--image", str(image))]
    done = run_cli(
        "run", MODEL, question, *shown, "--mmproj", str(mmproj), "--temperature", "0",
        "--max-tokens", str(ANSWER_TOKENS), "--json", *THREADS,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# -- the join, as llama-server's concat_content_parts ---------------------------------------------------


@pytest.mark.fast
def test_parts_join_as_llama_server_joins_them() -> None:
    """Text parts with a newline between, none before or after an image (common/chat.cpp)."""
    a, b = ImageRef("x", "A"), ImageRef("y", "B")
    assert joined(["one", "two"]) == "one\ntwo"
    assert joined(["", "two"]) == "two"
    assert joined(["one", "", "two"]) == "one\n\ntwo"
    assert joined([a, "What?"]) == [a, "What?"]
    assert joined(["Look:", a, "and", "this", b]) == ["Look:", a, "and\nthis", b]
    assert joined([a, b, "Compare."]) == [a, b, "Compare."]
    assert joined([]) == ""


# -- each API answers as `runner run --image` does ---------------------------------------------------


def test_each_api_answers_an_image_as_runner_run_does(server: Server, files: dict[str, Path]) -> None:
    expected = run_answer(QUESTION, files["a.png"], mmproj=files["mlp"])
    prompt_tokens = expected["usage"]["prompt_tokens"]
    image = files["a.png"].read_bytes()
    greedy = {"temperature": 0}

    client = openai_client(server)
    parts = [{"type": "image_url", "image_url": {"url": data_url(image)}}, {"type": "text", "text": QUESTION}]
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": parts}], max_tokens=ANSWER_TOKENS, **greedy
    )
    assert chat.choices[0].message.content == expected["text"]
    assert chat.usage is not None and chat.usage.prompt_tokens == prompt_tokens
    streamed = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": parts}],
        max_tokens=ANSWER_TOKENS,
        stream=True,
        **greedy,
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected["text"]
    bare = [{"type": "image_url", "image_url": {"url": b64(image)}}, {"type": "text", "text": QUESTION}]
    plain = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": bare}], max_tokens=ANSWER_TOKENS, **greedy
    )
    assert plain.choices[0].message.content == expected["text"]  # bare base64 is the same image

    responses = client.responses.create(
        model=MODEL,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": data_url(image), "detail": "auto"},
                    {"type": "input_text", "text": QUESTION},
                ],
            }
        ],
        max_output_tokens=ANSWER_TOKENS,
        **greedy,
    )
    assert responses.output_text == expected["text"]
    assert responses.usage is not None and responses.usage.input_tokens == prompt_tokens

    olla = ollama.Client(host=server.url)
    options = {"temperature": 0, "num_predict": ANSWER_TOKENS}
    said = olla.chat(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION, "images": [str(files["a.png"])]}],
        options=options,
    )
    assert said.message.content == expected["text"]
    made = olla.generate(model=MODEL, prompt=QUESTION, images=[image], options=options)
    assert made.response == expected["text"] and made.prompt_eval_count == prompt_tokens

    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    source = {"type": "base64", "media_type": "image/png", "data": b64(image)}
    blocks: Any = [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]
    message = claude.messages.create(
        model=MODEL,
        max_tokens=ANSWER_TOKENS,
        messages=[{"role": "user", "content": blocks}],
        extra_body={"temperature": 0},  # the 2.x client has no argument for it
    )
    assert message.content[0].type == "text" and message.content[0].text == expected["text"]
    counted = claude.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": blocks}])
    assert counted.input_tokens == prompt_tokens


def test_two_images_in_order_as_runner_run_puts_them(server: Server, files: dict[str, Path]) -> None:
    expected = run_answer("Compare.", files["a.png"], files["b.png"], mmproj=files["mlp"])
    images = [
        {"type": "image_url", "image_url": {"url": data_url(files[name].read_bytes())}}
        for name in ("a.png", "b.png")
    ]
    reply = openai_client(server).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [*images, {"type": "text", "text": "Compare."}]}],
        max_tokens=ANSWER_TOKENS,
        temperature=0,
    )
    assert reply.choices[0].message.content == expected["text"]
    assert reply.usage is not None and reply.usage.prompt_tokens == expected["usage"]["prompt_tokens"]


# -- prefix reuse -------------------------------------------------------------------------------------


def test_the_same_image_each_turn_is_evaluated_once(server: Server, files: dict[str, Path]) -> None:
    """A 3-turn chat sending the same image with its first message every turn: turns 2 and 3 reuse
    the whole conversation before them, the image with it; the same turn with another image in its
    place reuses only what comes before that image."""
    client = openai_client(server)
    first = [{"type": "image_url", "image_url": {"url": data_url(files["a.png"].read_bytes())}}]
    messages: list[Any] = [{"role": "user", "content": [*first, {"type": "text", "text": QUESTION}]}]
    usages = []
    for question in ("And its colours?", "Say it again."):
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        usages.append(reply.usage)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}]
        messages += [{"role": "user", "content": question}]
    last = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert last.usage is not None and last.usage.prompt_tokens_details is not None
    usages.append(last.usage)
    for before, after in zip(usages, usages[1:], strict=False):
        cached = after.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
        # the earlier turn's whole prompt (the image in it) was evaluated, so it is reused now
        assert cached >= before.prompt_tokens, (before, after)
    other = [{"type": "image_url", "image_url": {"url": data_url(files["b.png"].read_bytes())}}]
    swapped = [{"role": "user", "content": [*other, {"type": "text", "text": QUESTION}]}, *messages[1:]]
    moved = client.chat.completions.create(model=MODEL, messages=swapped, max_tokens=8, temperature=0)
    assert moved.usage is not None and moved.usage.prompt_tokens_details is not None
    before_image = moved.usage.prompt_tokens_details.cached_tokens or 0
    assert before_image + IMAGE_TOKENS < usages[0].prompt_tokens  # evaluated again from the image on


def test_a_kept_response_keeps_its_image_for_the_next(server: Server, files: dict[str, Path]) -> None:
    """previous_response_id sends the kept conversation again, its image with it: the next turn
    reuses the first whole, the image in it."""
    client = openai_client(server)
    image = {"type": "input_image", "image_url": data_url(files["b.png"].read_bytes())}
    first = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": [image, {"type": "input_text", "text": QUESTION}]}],
        max_output_tokens=8,
        temperature=0,
    )
    then = client.responses.create(
        model=MODEL, previous_response_id=first.id, input="Say it again.", max_output_tokens=8, temperature=0
    )
    assert first.usage is not None and then.usage is not None
    assert then.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    kept = httpx.get(f"{server.url}/v1/responses/{first.id}").json()
    assert kept["id"] == first.id


# -- the models say which take images --------------------------------------------------------------------


def test_the_model_lists_say_which_model_takes_images(server: Server) -> None:
    listed = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert {m["id"]: m["meta"]["vision"] for m in listed} == {MODEL: True, "other": False}
    shown = httpx.post(f"{server.url}/api/show", json={"model": MODEL}).json()
    assert "vision" in shown["capabilities"]
    other = httpx.post(f"{server.url}/api/show", json={"model": "other"}).json()
    assert "vision" not in other["capabilities"]


# -- bad images: 4xx in each API's own shape ---------------------------------------------------------------


def corrupt_png() -> bytes:
    data = bytearray(png(3))
    data[60:80] = b"\0" * 20  # inside the image data: the header reads, the pixels do not
    return bytes(data)


TEXT = b64(b"hello, this is not an image at all\n")
BIG = png(4, (200, 200))  # random pixels do not compress: over MAX_IMAGE_BYTES
CUT = b64(png(3)[:60])


def openai_image(url: str, role: str = "user") -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Hi"}]
    return {"model": MODEL, "max_tokens": 1, "messages": [{"role": role, "content": content}]}


def anthropic_image(source: dict[str, Any]) -> dict[str, Any]:
    content = [{"type": "image", "source": source}, {"type": "text", "text": "Hi"}]
    return {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": content}]}


def responses_image(part: dict[str, Any]) -> dict[str, Any]:
    content = [{"type": "input_image", **part}, {"type": "input_text", "text": "Hi"}]
    return {"model": MODEL, "max_output_tokens": 1, "input": [{"role": "user", "content": content}]}


def ollama_chat(*images: str, role: str = "user", model: str = MODEL) -> dict[str, Any]:
    message = {"role": role, "content": "Hi", "images": list(images)}
    return {"model": model, "stream": False, "options": {"num_predict": 1}, "messages": [message]}


IMG = "messages[0].content[0].image_url.url"
SRC = "messages[0].content[0].source"
RSP = "input[0].content[0].image_url"
OLL = "messages[0].images[0]"
ONLY = "only data URLs (data:image/png;base64,...) and base64 are taken"
BAD: dict[str, tuple[str, dict[str, Any], str | None, str]] = {
    # name: (path, body, the field named (None: Ollama's shape names none but in its message), says)
    "http URL": ("/v1/chat/completions", openai_image("http://127.0.0.1:9/a.png"), IMG, ONLY),
    "https URL": ("/v1/chat/completions", openai_image("https://example.com/a.png"), IMG, ONLY),
    "file URL": ("/v1/chat/completions", openai_image("file:///etc/passwd"), IMG, ONLY),
    "not an image": ("/v1/chat/completions", openai_image(TEXT), IMG, "looks like text"),
    "not base64": ("/v1/chat/completions", openai_image("%%%not base64%%%"), IMG, "not valid base64"),
    "a data URL of text": (
        "/v1/chat/completions",
        openai_image(f"data:text/plain;base64,{TEXT}"),
        IMG,
        "not an image",
    ),
    "truncated": ("/v1/chat/completions", openai_image(CUT), IMG, "truncated or corrupt"),
    "corrupt": ("/v1/chat/completions", openai_image(b64(corrupt_png())), IMG, "truncated or corrupt"),
    "too many bytes": (
        "/v1/chat/completions",
        openai_image(b64(BIG)),
        IMG,
        f"the image is {len(BIG) / 1000:.1f} KB once decoded ({len(b64(BIG)) / 1000:.1f} KB of base64), over "
        "the 50.0 KB an image may be",
    ),
    "empty": ("/v1/chat/completions", openai_image(""), IMG, "no image data"),
    "an image from the assistant": (
        "/v1/chat/completions",
        openai_image(b64(png(1)), role="assistant"),
        "messages[0].content",
        "image_url parts go in user messages",
    ),
    "image_url without url": (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
        },
        "messages[0].content",
        '"url"',
    ),
    "too many images": (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "max_tokens": 1,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": b64(png(1))}}] * 4,
                }
            ],
        },
        "messages[0].content[3].image_url.url",
        "4 images in one request; at most 3",
    ),
    "a model on demand takes none": (
        "/v1/chat/completions",
        {**openai_image(b64(png(1))), "model": "other"},
        IMG,
        "other takes no images",
    ),
    "anthropic URL source": (
        "/v1/messages",
        anthropic_image({"type": "url", "url": "https://example.com/a.png"}),
        f"{SRC}.url",
        ONLY,
    ),
    "anthropic file source": (
        "/v1/messages",
        anthropic_image({"type": "file", "file_id": "file_1"}),
        f"{SRC}.type",
        "sources are not served",
    ),
    "anthropic not an image": (
        "/v1/messages",
        anthropic_image({"type": "base64", "media_type": "image/png", "data": TEXT}),
        f"{SRC}.data",
        "looks like text",
    ),
    "anthropic no data": (
        "/v1/messages/count_tokens",
        anthropic_image({"type": "base64", "media_type": "image/png"}),
        SRC,
        "a base64 source",
    ),
    "responses URL": (
        "/v1/responses",
        responses_image({"image_url": "https://example.com/a.png"}),
        RSP,
        ONLY,
    ),
    "responses file_id": (
        "/v1/responses",
        responses_image({"file_id": "file_1"}),
        "input[0].content",
        "file_id is not served",
    ),
    "responses truncated": ("/v1/responses", responses_image({"image_url": CUT}), RSP, "truncated"),
    "ollama URL": ("/api/chat", ollama_chat("https://example.com/a.png"), None, f"{OLL}: https: URLs"),
    "ollama images not strings": (
        "/api/chat",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi", "images": [3]}]},
        None,
        "must be a list of base64-encoded images",
    ),
    "ollama too many": ("/api/chat", ollama_chat(*[b64(png(1))] * 4), None, "at most 3"),
    "ollama from the assistant": (
        "/api/chat",
        ollama_chat(b64(png(1)), role="assistant"),
        None,
        "images go in user messages",
    ),
    "ollama on demand": (
        "/api/chat",
        ollama_chat(b64(png(1)), model="other"),
        None,
        "other takes no images",
    ),
    "ollama generate corrupt": (
        "/api/generate",
        {"model": MODEL, "prompt": "Hi", "images": [b64(corrupt_png())], "stream": False},
        None,
        "images[0]: a truncated or corrupt PNG",
    ),
    "ollama generate raw": (
        "/api/generate",
        {"model": MODEL, "prompt": "Hi", "raw": True, "images": [b64(png(1))], "stream": False},
        None,
        "not served with raw",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_images_are_4xx_in_the_apis_own_shape(server: Server, case: str) -> None:
    path, body, param, says = BAD[case]
    got = httpx.post(f"{server.url}{path}", json=body, timeout=60)
    assert got.status_code == 400, got.text
    error = got.json()
    if path.startswith("/api/"):  # Ollama: {"error": "..."}
        assert set(error) == {"error"} and says in error["error"], error
    elif path.startswith("/v1/messages"):  # Anthropic: {"type": "error", "error": {"type", "message"}}
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
        assert error["error"]["message"].startswith(param) and says in error["error"]["message"], error
    else:  # OpenAI's, the Responses API's too
        assert set(error["error"]) == {"message", "type", "param", "code"}, error
        assert error["error"]["param"] == param and says in error["error"]["message"], error
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_the_real_clients_raise_the_refusals(server: Server) -> None:
    """What each client makes of the 400: its own error, with the server's message."""
    url = "https://example.com/a.png"
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client(server).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
        )
    assert caught.value.body["param"] == IMG and ONLY in caught.value.body["message"]  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as refused:
        anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0).messages.create(
            model=MODEL,
            max_tokens=1,
            messages=[
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": url}}]}
            ],
        )
    assert f"{SRC}.url" in str(refused.value) and ONLY in str(refused.value)
    with pytest.raises(ollama.ResponseError) as said:
        ollama.Client(host=server.url).generate(
            model=MODEL, prompt="Hi", images=[b64(b"GIF89a" + b"\0" * 20)]
        )
    assert said.value.status_code == 400 and "images[0]" in said.value.error


@pytest.mark.fast
def test_a_text_only_model_names_itself_in_every_api() -> None:
    """Images to a model served without a projector, in process (the stand-in backend): a 400 naming
    the image's field and the model, before anything reaches it."""
    backend = StandIn()
    image = b64(png(1))
    with TestClient(create_app(backend, log=lambda _: None)) as http:
        cases = {
            "/v1/chat/completions": (openai_image(image), IMG),
            "/v1/messages": (
                anthropic_image({"type": "base64", "media_type": "image/png", "data": image}),
                SRC,
            ),
            "/v1/responses": (responses_image({"image_url": image}), RSP),
            "/api/chat": (ollama_chat(image), OLL),
            "/api/generate": ({"model": MODEL, "prompt": "Hi", "images": [image]}, "images[0]"),
        }
        for path, (body, field) in cases.items():
            got = http.post(path, json=body)
            assert got.status_code == 400 and f"{MODEL} takes no images" in got.text, (path, got.text)
            assert field in got.text, (path, got.text)
    assert backend.asks == []


@pytest.mark.fast
def test_the_projector_hint_quotes_a_reference_only_where_a_shell_would_split_it() -> None:
    """The hint names the model as `runner serve` was given it (ModelInfo.reference), as a shell takes
    it: a path with a space quoted, a leading ~ left to expand."""
    from dataclasses import replace

    for reference, shown in (
        ("~/models/a.gguf", "~/models/a.gguf"),
        ("./my model.gguf", "'./my model.gguf'"),
    ):
        backend = StandIn()
        info = replace(backend.info(MODEL), reference=reference)
        backend.info = lambda name, info=info: info  # type: ignore[method-assign]
        with TestClient(create_app(backend, log=lambda _: None)) as http:
            got = http.post("/v1/chat/completions", json=openai_image(b64(png(1))))
        assert got.status_code == 400 and f"(runner serve {shown} --mmproj FILE)" in got.text, got.text


# -- a fuzz of image bytes: never a 5xx ------------------------------------------------------------------


def mutated(data: bytes, cuts: list[int], flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for at, value in flips:
        out[at % len(out)] = value
    for cut in cuts:
        out = out[: max(1, cut % len(out))]
    return bytes(out)


MEDIA = st.sampled_from(
    ["image/png", "image/jpeg", "image/gif", "application/octet-stream", "text/plain", ""]
)
BYTES = st.one_of(
    st.binary(max_size=600),
    st.builds(
        mutated,
        st.sampled_from([png(5), png(6, (8, 8))]),
        st.lists(st.integers(0, 10_000), max_size=1),
        st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
    ),
)
URLS = st.one_of(
    st.builds(lambda data, media: f"data:{media};base64,{b64(data)}" if media else b64(data), BYTES, MEDIA),
    st.text(max_size=40),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(url=URLS)
def test_image_bytes_fuzzed_never_give_a_5xx(server: Server, url: str) -> None:
    got = httpx.post(f"{server.url}/v1/chat/completions", json=openai_image(url), timeout=60)
    assert got.status_code in (200, 400), got.text
    if got.status_code == 400:
        assert got.json()["error"]["param"].startswith("messages[0].content[0]"), got.text


# -- the flags ---------------------------------------------------------------------------------------------


def test_serve_refuses_images_flags_that_cannot_hold(files: dict[str, Path], smollm2_path: Path) -> None:
    mlp = str(files["mlp"])
    cases = {
        "name that model alone": ("--mmproj", mlp),
        "--mmproj is one model's": (MODEL, "other", "--mmproj", mlp),
        "no such file": (MODEL, "--mmproj", str(files["models"] / "none.gguf")),
        "--max-images must be": (MODEL, "--mmproj", mlp, "--max-images", "0"),
        "--max-image-bytes must be a size": (MODEL, "--mmproj", mlp, "--max-image-bytes", "lots"),
    }
    for expected, args in cases.items():
        done = run_cli("serve", *args, "--port", "9")
        lines = done.stderr.decode().strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and expected in lines[0], (expected, done.stderr)


# -- docs/serve.md's examples ------------------------------------------------------------------------------


def image_examples() -> list[str]:
    section = PAGE.split("\n## Images\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```py\n(.*?)```", section, re.DOTALL)


def test_the_docs_image_examples_run(server: Server, files: dict[str, Path], tmp_path: Path) -> None:
    examples = image_examples()
    assert len(examples) == 4  # OpenAI, Ollama, Anthropic, Responses
    (tmp_path / "photo.png").write_bytes(files["a.png"].read_bytes())
    for code in examples:
        code = code.replace("127.0.0.1:8080", server.address).replace('"gemma-3-4b-it-Q4_K_M"', f'"{MODEL}"')
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, timeout=180, env={**os.environ}
        )
        assert done.returncode == 0, done.stderr.decode()
        assert done.stdout.strip(), code
