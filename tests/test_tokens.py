"""Token utilities: /tokenize (pieces, special tokens, mixed prompts), /detokenize, /apply-template,
/v1/responses/input_tokens and /v1/messages/count_tokens answer as the pinned llama-server answers on
the same model and text (its answers recorded below, and compared live where its binary is:
LLAMA_SERVER, or the peers' build), from the vocabulary alone; `runner tokens` counts the same tokens
on the command line, its bad input one line and exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import MODEL, THREADS, free_port, serving

from tests.conftest import run_cli

LLAMA_SERVER = Path(os.environ.get("LLAMA_SERVER", "/tmp/peers/build/bin/llama-server"))

SKY = [{"role": "user", "content": "Why is the sky blue?"}]
CASES = [  # (path, body, llama-server's answer for SmolLM2-135M-Instruct Q4_1, the pinned build)
    (
        "/tokenize",
        {"content": "Hello, wörld! 🦙 <|im_start|>x", "with_pieces": True},
        {
            "tokens": [
                {"id": 19556, "piece": "Hello"},
                {"id": 28, "piece": ","},
                {"id": 267, "piece": " w"},
                {"id": 29989, "piece": "ör"},
                {"id": 400, "piece": "ld"},
                {"id": 17, "piece": "!"},
                {"id": 15107, "piece": [32, 240, 159]},  # a character split across tokens: its bytes
                {"id": 116, "piece": [166]},
                {"id": 243, "piece": [153]},
                {"id": 216, "piece": " "},
                {"id": 1, "piece": "<|im_start|>"},
                {"id": 104, "piece": "x"},
            ]
        },
    ),
    (
        "/tokenize",
        {"content": "Hello <|im_start|>", "add_special": True, "parse_special": False},
        {"tokens": [19556, 2067, 108, 306, 79, 3738, 108, 46]},
    ),
    ("/tokenize", {"content": ["a", 1, "b"]}, {"tokens": [81, 1, 82]}),
    ("/tokenize", {}, {"tokens": []}),
    (
        "/detokenize",
        {"tokens": [1, 9690, 198, 28120, 216, 10635, 2]},
        {"content": "<|im_start|>system\nhello  civilization<|im_end|>"},
    ),
    (
        "/apply-template",
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Why?"},
            ]
        },
        {
            "prompt": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n"
        },
    ),
    (
        "/v1/responses/input_tokens",
        {"input": SKY, "instructions": "Be brief."},
        {"input_tokens": 23, "object": "response.input_tokens"},
    ),
    ("/v1/responses/input_tokens", {"input": "hi"}, {"input_tokens": 31, "object": "response.input_tokens"}),
    (
        "/v1/messages/count_tokens",
        {"model": MODEL, "system": "Be brief.", "messages": SKY},
        {"input_tokens": 23},
    ),
]
IDS = [
    "pieces",
    "no-parse-special",
    "mixed",
    "no-content",
    "detokenize",
    "template",
    "responses",
    "bare",
    "anthropic",
]


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    log = tmp_path_factory.mktemp("tokens-serve") / "serve.log"
    args = [MODEL, "--ctx", "2048", "--parallel", "1", *THREADS]
    with serving(args, log) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


@pytest.mark.parametrize(("path", "body", "theirs"), CASES, ids=IDS)
def test_each_answer_is_llama_servers(
    http: httpx.Client, path: str, body: dict[str, Any], theirs: Any
) -> None:
    got = http.post(path, json=body)
    assert got.status_code == 200, got.text
    assert got.json() == theirs


def test_tokens_answer_from_the_vocabulary_alone(smollm2_path: Path) -> None:
    """No engine asked: the app over a backend that answers nothing, the real vocabulary under it."""
    from dataclasses import replace

    from serving import StandIn
    from starlette.testclient import TestClient

    from runner.serve.app import create_app

    class VocabOnly(StandIn):
        def info(self, name: str) -> Any:
            return replace(super().info(name), path=str(smollm2_path))

    backend = VocabOnly()
    with TestClient(create_app(backend, log=lambda line: None)) as client:
        for path, body, theirs in CASES[:5]:
            assert client.post(path, json=body).json() == theirs
    assert backend.asks == [] and backend.generations == []


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/detokenize", {"tokens": [1, 49152]}, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
        ("/tokenize", {"content": 5}, "content"),
        ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
        ("/apply-template", {"messages": []}, "messages"),
        ("/tokenize", {"content": "x", "model": "nope"}, "model"),
        ("/tokenize", {"content": ["a", 99999999], "with_pieces": True}, "content"),  # never to llama.cpp
        ("/tokenize", {"content": [-1]}, "content"),
        ("/tokenize", {"content": [2**40]}, "content"),
        ("/apply-template", {"messages": [{"role": "user", "content": "hi"}], "tools": [1]}, "tools"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    http: httpx.Client, path: str, body: dict[str, Any], param: str
) -> None:
    got = http.post(path, json=body)
    assert got.status_code in (400, 404), got.text
    assert got.json()["error"]["param"] == param


def test_the_cli_counts_what_the_server_counts(http: httpx.Client) -> None:
    text = "Hello, wörld! 🦙 <|im_start|>x\n"
    served = http.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
    done = run_cli("tokens", MODEL, "--offline", input=text.encode())
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == f"{len(served)}\n"
    ids = run_cli("tokens", MODEL, text, "--ids", "--offline")
    assert ids.stdout.decode().splitlines() == [str(len(served)), " ".join(map(str, served))]
    pieces = run_cli("tokens", MODEL, "Hi there", "--pieces", "--offline").stdout.decode().splitlines()
    assert pieces == ["2", '26843\t"Hi"', '665\t" there"']


def test_the_cli_counts_a_chat_as_the_apis_do(http: httpx.Client) -> None:
    counted = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": SKY}).json()
    done = run_cli("tokens", MODEL, "--template", "--offline", input=json.dumps(SKY).encode())
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == f"{counted['input_tokens']}\n"


@pytest.mark.parametrize(
    "given",
    [
        "not json",
        '{"messages": 3}',
        "[]",
        '[{"content": "no role"}]',
        '{"messages": [{"role": "user", "content": "hi"}], "tools": [1]}',
    ],
)
def test_a_bad_chat_is_one_line_and_exit_2(given: str) -> None:
    done = run_cli("tokens", MODEL, given, "--template", "--offline")
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr.decode().count("\n") == 1 and "--template" in done.stderr.decode()


# -- live, beside llama-server ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not LLAMA_SERVER.is_file():
        pytest.skip(f"no llama-server at {LLAMA_SERVER} (LLAMA_SERVER names another)")
    port, log = free_port(), tmp_path_factory.mktemp("llama-server") / "log"
    command = [str(LLAMA_SERVER), "-m", str(smollm2_path), "-c", "2048", "-np", "1", "-t", "1"]
    with log.open("wb") as out:
        proc = subprocess.Popen([*command, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize(("path", "body", "recorded"), CASES, ids=IDS)
def test_llama_server_answers_as_recorded(
    llama_server: str, path: str, body: dict[str, Any], recorded: Any
) -> None:
    assert httpx.post(f"{llama_server}{path}", json=body, timeout=60).json() == recorded
