"""runner serve as a server, with the real model: a client leaving mid-stream, the access line, model
names that never read a file, a full queue (429), the API key, CORS, SIGTERM with answers in flight,
the refusals before anything loads (another host without a key, a port in use), and a model given as
a path, served under its file's stem. One server (SmolLM2, 4 sequences of 1024 tokens) answers most;
servers of their own check what needs other flags. Every server is stopped with SIGTERM and must exit
0 without a traceback.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from tests.conftest import TEST_HOME
from tests.serving import (
    COUNTING,
    HI,
    MODEL,
    THREADS,
    Server,
    ask,
    body,
    chat,
    free_port,
    model_server,
    openai_client,
    serve_env,
    start_server,
    stop_server,
)


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The file's server: 4 sequences of 1024 tokens, no key, no CORS."""
    with model_server(tmp_path_factory.mktemp("serve"), "--parallel", "4", "--ctx", "1024") as running:
        yield running


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as raw:
        yield raw


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
    assert line["status"] == "499" and line["finish"] == "cancelled", line[0]  # nginx's "the client left"
    assert int(line["completion"]) < 800, line[0]
    assert ask(client, "Name a planet.", max_tokens=5).choices[0].finish_reason == "length"

    since = server.mark()  # a whole answer's client that leaves: the same word, the same status
    with pytest.raises(httpx.TimeoutException):
        http.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": COUNTING, "max_tokens": 700, "temperature": 0},
            timeout=1.5,
        )
    line = server.wait_for_access(since, "/v1/completions", timeout=15)
    assert line["status"] == "499" and line["finish"] == "cancelled", line[0]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", list(STREAMS))
def test_access_line_of_a_cancelled_stream_counts_what_was_sent(server: Server, path: str) -> None:
    """The access line of a stream its client left says the tokens that were decoded for it (at least
    the 5 pieces the client read) and when the first came, not completion=0 ttft=0.000s."""
    since, text = open_stream_then_leave(server, 5, path)
    assert text.startswith(" 6,")
    line = server.wait_for_access(since, path, timeout=15)
    assert line["status"] == "499" and line["finish"] == "cancelled", line[0]
    assert 5 <= int(line["completion"]) < 800, line[0]
    assert float(line["ttft"]) > 0, line[0]


@pytest.mark.timeout(300)
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the server's mapped files")
def test_the_server_streams_through_uvloop_and_httptools(server: Server, http: httpx.Client) -> None:
    # a quarter of the event loop's CPU a streamed token, on cores llama.cpp decodes on (docs/speed.md)
    answer = http.post("/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 2})
    assert answer.status_code == 200
    mapped = Path(f"/proc/{server.proc.pid}/maps").read_text()
    assert "/uvloop/" in mapped and "/httptools/" in mapped


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


@pytest.mark.timeout(300)
def test_a_full_queue_is_429_and_a_left_stream_frees_its_sequence(smollm2_path: Path, tmp_path: Path) -> None:
    """--parallel 1 --queue 0: while one answer streams, another request is a 429 with Retry-After, in
    each API's shape; once its client leaves, the sequence is free within seconds (the answer it was
    decoding, 4000 tokens, would have held it for much longer)."""
    with model_server(tmp_path, "--parallel", "1", "--queue", "0", "--ctx", "4096") as small:
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
        assert line["finish"] == "cancelled" and int(line["completion"]) < 4000, line[0]


@pytest.mark.timeout(300)
def test_api_key(smollm2_path: Path, tmp_path: Path) -> None:
    """--api-key: without it or with a wrong one, 401 in the API's shape (OpenAI's on /v1, Ollama's on
    /api); the key as a Bearer token or x-api-key, 200; /health needs none."""
    with model_server(tmp_path, "--api-key", "s3cret", "--parallel", "1", "--ctx", "512") as keyed:
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
    """SIGTERM while long answers are under way (OpenAI and Ollama streams, an Anthropic stream and a
    whole Anthropic answer, through their clients): OpenAI's and Ollama's streams end cleanly with
    their finish reason "interrupted"; Anthropic has none, so its stream ends with an error event
    after the text it sent and its whole answer is a 503, never `end_turn`; the server exits 0 within
    10 s."""
    small = start_server(tmp_path, "--parallel", "4", "--ctx", "2048")
    begun = [threading.Event() for _ in range(3)]
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

    counting = [{"role": "user", "content": f"Count from 1 to 1000: {COUNTING}"}]

    def anthropic_client() -> Any:
        import anthropic

        return anthropic.Anthropic(base_url=small.url, api_key="unused", max_retries=0, timeout=60)

    def anthropic_stream() -> None:
        events: list[Any] = []
        try:
            for event in anthropic_client().messages.create(
                model=MODEL, max_tokens=2000, messages=counting, extra_body={"temperature": 0}, stream=True
            ):
                events.append(event)
                if len(events) == 4:
                    begun[2].set()
        except Exception as exc:  # the error event: the client raises it
            events.append(exc)
        ends["anthropic"] = events

    def anthropic_whole() -> None:
        try:
            ends["anthropic whole"] = anthropic_client().messages.create(
                model=MODEL, max_tokens=2000, messages=counting, extra_body={"temperature": 0}
            )
        except Exception as exc:
            ends["anthropic whole"] = exc

    jobs = [anthropic_whole, openai_stream, ollama_stream, anthropic_stream]
    threads = [threading.Thread(target=job) for job in jobs]
    try:
        for thread in threads:
            thread.start()
        assert all(event.wait(120) for event in begun), (ends, small.stderr())
        took = stop_server(small, within=30)
    finally:
        if small.proc.poll() is None:
            small.proc.kill()
            small.proc.wait()
        for thread in threads:
            thread.join(timeout=30)
    assert took < 10, took
    assert set(ends) == {"openai", "ollama", "anthropic", "anthropic whole"}, small.stderr()
    last = ends["openai"][-1].choices[0]
    assert last.finish_reason == "interrupted", ends["openai"][-3:]
    assert sum(1 for c in ends["openai"] if c.choices and c.choices[0].finish_reason) == 1
    assert ends["ollama"][-1].done and ends["ollama"][-1].done_reason == "interrupted", ends["ollama"][-3:]
    assert ends["ollama"][-1].eval_count < 2000
    import anthropic

    *events, error = ends["anthropic"]
    assert isinstance(error, anthropic.APIStatusError) and "cut short" in str(error), ends["anthropic"][-3:]
    assert any(e.type == "content_block_delta" for e in events)  # the text went out before the error
    assert not any(e.type in ("message_delta", "message_stop") for e in events), events[-3:]
    whole = ends["anthropic whole"]
    assert isinstance(whole, anthropic.APIStatusError) and whole.status_code == 503, whole
    assert "cut short" in whole.message and "the server is stopping" in whole.message, whole.message
    assert "stopping" in small.stderr()


@pytest.mark.timeout(300)
def test_cors_only_when_asked_for(smollm2_path: Path, tmp_path: Path, http: httpx.Client) -> None:
    """--cors ORIGIN: a preflight from that origin is allowed (access-control-allow-origin), answers
    carry the header, another origin is not allowed; without --cors no CORS header at all."""
    preflight = {"Origin": "https://example.org", "Access-Control-Request-Method": "POST"}
    asked = {**preflight, "Access-Control-Request-Headers": "authorization, content-type"}
    cors = ("--cors", "https://example.org", "--parallel", "1", "--ctx", "512")
    with model_server(tmp_path, *cors) as open_, httpx.Client(base_url=open_.url, timeout=60) as raw:
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


@pytest.mark.timeout(300)
def test_a_model_given_as_a_path_is_served_under_its_stem(smollm2_path: Path, tmp_path: Path) -> None:
    """`runner serve PATH`: /v1/models and /api/tags list the file's stem (as --models DIR and models
    on demand name theirs), requests name it so, and the whole path is no model name."""
    file = tmp_path / "tiny-chat.gguf"
    file.symlink_to(smollm2_path)
    with model_server(tmp_path, "--parallel", "1", "--ctx", "512", model=str(file)) as served:
        client = openai_client(served)
        assert [m.id for m in client.models.list()] == ["tiny-chat"]
        answer = client.chat.completions.create(model="tiny-chat", messages=HI, max_tokens=2)
        assert (
            answer.model == "tiny-chat" and answer.usage is not None and answer.usage.completion_tokens >= 1
        )
        tags = httpx.get(f"{served.url}/api/tags", timeout=10).json()
        assert [m["name"] for m in tags["models"]] == ["tiny-chat"]
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model=str(file), messages=HI, max_tokens=2)
        assert "serving tiny-chat on" in served.stderr()


@pytest.mark.timeout(300)
def test_two_files_with_one_stem_are_refused(smollm2_path: Path, tmp_path: Path) -> None:
    """Two files both named x.gguf: exit 2, one line saying the name is taken, before the second loads."""
    files = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        files.append(tmp_path / folder / "x.gguf")
        files[-1].symlink_to(smollm2_path)
    done = subprocess.run(
        [sys.executable, "-m", "runner", "serve", *map(str, files), "--port", str(free_port()), *THREADS],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=serve_env(tmp_path),
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "another model is already served as 'x'" in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
