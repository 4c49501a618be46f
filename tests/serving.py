"""What the serve tests share (the one helpers module: test files never import each other).

A real `runner serve` for a test: started on a free loopback port, ready when /health says so, stopped
by SIGTERM (which must end it with exit 0 and no traceback); the data the tests send (questions, texts,
tools, schemas); the check that a bad request is refused in its API's shape; and, for the in-process
tier, a stand-in Backend that answers without a model (runner.serve.app over it, no process, no
model: the protocol and validation tables in seconds)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from runner.engine.answer import Result, Timings
from runner.serve.backend import Ask, ModelInfo, Outcome, QueueFull, TooLong

if TYPE_CHECKING:
    from runner.engine.engine import Engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ACCESS = re.compile(  # after the moment it was written (ISO 8601, UTC)
    r"(?P<at>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) "
    r"runner: (?P<method>[A-Z]+) (?P<path>\S+) (?P<status>\d+|-)"
    r"(?: prompt=(?P<prompt>\d+) completion=(?P<completion>\d+) ttft=(?P<ttft>[\d.]+)s)?"
    r" total=[\d.]+s(?: finish=(?P<finish>\w+))?"
)


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def mark(self) -> int:
        """Where the log is now: access_lines(since=mark) are the lines written after it."""
        return len(self.stderr())

    def access_lines(self, since: int = 0) -> list[re.Match[str]]:
        return [m for line in self.stderr()[since:].splitlines() if (m := ACCESS.match(line))]

    def wait_for_access(self, since: int, path: str, timeout: float = 15) -> re.Match[str]:
        """The first access line for `path` written after `since`, waiting up to `timeout` for it."""
        deadline = time.monotonic() + timeout
        while True:
            found = [m for m in self.access_lines(since) if m["path"] == path]
            if found:
                return found[0]
            assert time.monotonic() < deadline, f"no access line for {path} in {timeout} s:\n{self.stderr()}"
            time.sleep(0.1)


@contextmanager
def serving(args: list[str], log: Path, *, ready_s: float = 120) -> Iterator[Server]:
    """`runner serve ARGS --port FREE`, up and answering /health, for the with block. A server started
    outside a test (a module's fixture, before the test's own data folder is set) keeps its responses
    in a folder beside its log, never in the test home's, which outlives the run (a database there
    that a newer runner migrated would be refused, and the server would keep nothing)."""
    port = free_port()
    env = dict(os.environ)
    env.setdefault("RUNNER_DATA_DIR", str(log.parent / "data"))
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runner", "serve", *args, "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    server = Server(proc, port, log)
    try:
        end = time.monotonic() + ready_s
        while time.monotonic() < end and proc.poll() is None:
            try:
                if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert proc.poll() is None, server.stderr()
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 0, server.stderr()
    assert "Traceback" not in server.stderr(), server.stderr()


# -- the serve tests' shared data ---------------------------------------------------------------------

MODEL = "smollm2"
# One fixed thread: answers do not depend on the machine's load (an adapted count may round a near
# tie the other way), and no thread spins at a barrier waiting for another that a busy machine has
# preempted (two fixed threads on a busy 2-core machine: 2.7 s a token, measured; one: 7 ms).
THREADS = ("--threads", "1")
COUNTING = "1, 2, 3, 4, 5,"  # a raw prompt SmolLM2 goes on counting from, for hundreds of tokens
PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
QUESTIONS = [  # the batch tests' eight (test_batch.py)
    "What is the capital of France?",
    "Name a yellow fruit.",
    "How many legs does a spider have?",
    "What do bees make?",
    "Name a planet.",
    "What is 7 times 6?",
    "Which ocean is the largest?",
    "What is frozen water called?",
]
CLIENT_QUESTIONS = [  # the batch tests' eight, and eight more: 16 clients, 4 sequences
    *QUESTIONS,
    "What colour is the sky?",
    "Who wrote Hamlet?",
    "What is the boiling point of water?",
    "Name a musical instrument.",
    "What animal says moo?",
    "How many days are in a week?",
    "What is the opposite of hot?",
    "Name a language spoken in Spain.",
]
TEXTS = [  # the embedding tests' texts (test_embed.py, test_serve_embed.py)
    "The cat sat on the mat.",
    "A kitten is sitting on a rug.",
    "Stock markets fell sharply today.",
    "Share prices dropped and the economy slowed.",
    "How do I bake bread at home?",
    "A recipe for a loaf of homemade bread.",
]
# The same text batched with others, against alone: llama.cpp's CPU kernels round differently where a
# sequence starts at another offset of the batch (SIMD lanes), measured here at most 2.1e-3 per
# component and 1 - 1.3e-5 in cosine over the batches below (flash attention, which runner.engine.embed
# leaves off, made it 8e-3 and 1 - 5e-4); the first six, 46 tokens in one decode, 3e-8.
BATCH_TOLERANCE = 4e-3
BATCH_COSINE = 1 - 4e-5


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))  # both at unit length


NEAR_TIE = 0.5  # logits: where llama.cpp's batch-size-dependent kernels may choose either token


def top2_gap(engine: Engine, tokens: list[int]) -> float:
    """The logit gap between the best two next tokens after `tokens` (one sequence, one decode)."""
    from runner.engine.llamacpp import llama

    engine.context.reset()
    engine.context.prefill(tokens)
    row = llama().llama_get_logits_ith(engine.context.ctx, -1)
    logits = sorted(ctypes.cast(row, ctypes.POINTER(ctypes.c_float))[: engine.model.n_vocab], reverse=True)
    return logits[0] - logits[1]


def same_unless_near_tie(engine: Engine, prompt: list[int], a: str, b: str) -> bool:
    """True when a == b; False when they part at a near tie of the top two candidates (a flip that
    llama.cpp's batch-size-dependent kernels may make, which a caller may count); an AssertionError
    when they part anywhere else. Never assert its value: a near tie is allowed, not a failure."""
    if a == b:
        return True
    ta, tb = engine.model.tokenize(a, add_special=False), engine.model.tokenize(b, add_special=False)
    k = next((j for j in range(min(len(ta), len(tb))) if ta[j] != tb[j]), min(len(ta), len(tb)))
    gap = top2_gap(engine, prompt + ta[:k])
    assert gap < NEAR_TIE, (a, b, gap)
    return False


# -- `runner serve smollm2` of a test's own ---------------------------------------------------------


def serve_env(tmp: Path) -> dict[str, str]:
    """The test session's environment (conftest's offline runner home), a data dir of the server's
    own, and no API key from the outside."""
    env = {**os.environ, "RUNNER_DATA_DIR": str(tmp / "data")}
    env.pop("RUNNER_API_KEY", None)
    return env


def start_server(tmp: Path, *args: str, model: str = MODEL) -> Server:
    """`runner serve MODEL ARGS` on a free port (one thread), once GET /health answers 200."""
    port = free_port()
    log = tmp / f"serve-{port}.stderr"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runner", "serve", model, "--port", str(port), *THREADS, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=serve_env(tmp),
        )
    server = Server(proc, port, log)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"runner serve exited {proc.returncode} before it served:\n{server.stderr()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"runner serve did not answer /health within 120 s:\n{server.stderr()}")
        time.sleep(0.2)


def stop_server(server: Server, within: float = 30) -> float:
    """SIGTERM; the process must exit 0 within `within` seconds, with no traceback. Returns how long."""
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
        pytest.fail(f"runner serve did not exit within {within} s of SIGTERM:\n{server.stderr()}")
    took = time.monotonic() - start
    err = server.stderr()
    assert code == 0, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    return took


@contextmanager
def model_server(tmp: Path, *args: str, model: str = MODEL) -> Iterator[Server]:
    """start_server for the with block, stopped by stop_server (killed if the block failed)."""
    server = start_server(tmp, *args, model=model)
    try:
        yield server
    except BaseException:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()
        raise
    stop_server(server)


def openai_client(server: Server) -> openai.OpenAI:
    # no retries: a 429 or a 500 must show, not be retried away
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def ask(client: openai.OpenAI, question: str, **fields: Any) -> Any:
    """A greedy (unless told) chat answer to one question, through the openai client."""
    fields.setdefault("temperature", 0)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], **fields
    )


def sse(lines: Iterator[str]) -> list[Any]:
    """The data of a Server-Sent Events stream, [DONE] as the string "[DONE]"."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# -- bad requests, as every API must refuse them ---------------------------------------------------

HI = [{"role": "user", "content": "Hi"}]


def chat(**fields: Any) -> str:
    """A chat request's body (OpenAI's, which Ollama's /api/chat reads too), with these fields."""
    return json.dumps({"model": MODEL, "messages": HI, "max_tokens": 2, **fields})


def body(**fields: Any) -> str:
    return json.dumps(fields)


def check_refused(
    http: httpx.Client, path: str, content: str, status: int, param: str | None, says: str
) -> str:
    """The request refused with `status`, the error in the shape of the API it came through (OpenAI's
    object naming the field, Ollama's string), and the server answering after it. Returns the message."""
    got = http.post(path, content=content, headers={"Content-Type": "application/json"})
    assert got.status_code == status, got.text
    error = got.json()["error"]
    if path.startswith("/api/"):
        assert isinstance(error, str) and says in error, error
        message = error
    else:
        assert set(error) == {"message", "type", "param", "code"}, error
        assert error["param"] == param and says in error["message"], error
        assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
        message = error["message"]
    assert http.get("/health").status_code == 200
    return message


# -- the in-process tier: the real app over a stand-in backend -----------------------------------------


class Scripted:
    """A Generation that yields fixed parts, then has its fixed Outcome; cancel() is noted."""

    def __init__(self, parts: list[tuple[str, str]], outcome: Outcome) -> None:
        self.parts = parts
        self.outcome = outcome
        self.prompt_tokens = outcome.prompt_tokens
        self.cancelled = False

    def __aiter__(self) -> Any:
        return self._parts()

    async def _parts(self) -> Any:
        for part in self.parts:
            yield part

    def cancel(self) -> None:
        self.cancelled = True

    async def wait(self) -> None:
        return None


STAND_IN_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }} {{ m.content }}{% endfor %} tools think"


class StandIn:
    """A Backend that answers without a model: one model named MODEL (a 1024-token context, 4
    sequences, 576-dimensional vectors), every answer `parts` then `outcome`; the Asks it was given are
    kept. A message or prompt over `too_long` characters is TooLong; `full` makes submit a QueueFull."""

    def __init__(
        self,
        parts: list[tuple[str, str]] | None = None,
        outcome: Outcome | None = None,
        *,
        too_long: int = 4000,
    ) -> None:
        self.parts = parts if parts is not None else [("answer", "Hello"), ("answer", " there")]
        self.outcome = outcome or outcome_of("Hello there", prompt_tokens=5, completion_tokens=2)
        self.too_long = too_long
        self.full = False
        self.asks: list[Ask] = []
        self.generations: list[Scripted] = []

    def names(self) -> list[str]:
        return [MODEL]

    def info(self, name: str) -> ModelInfo:
        metadata = {"general.architecture": "llama", "llama.embedding_length": 576}
        return ModelInfo(
            MODEL, "/models/smollm2.gguf", 1000, 0.0, None, "llama", "Q4_1", "135M", 1024, 4,
            STAND_IN_TEMPLATE, metadata,
        )  # fmt: skip

    def ready(self) -> bool:
        return True

    def loaded(self) -> list[str]:
        return [MODEL]

    def memory(self, name: str) -> int:
        return 1000

    def counters(self, name: str) -> dict[str, int]:
        return {}

    def _check(self, ask: Ask) -> None:
        texts = [ask.prompt or ""] + [str(m.get("content", "")) for m in ask.messages or []]
        if any(len(text) > self.too_long for text in texts):
            raise TooLong(
                f"the prompt is {sum(map(len, texts)):,} tokens; a sequence's context is 1,024", 9, 1024
            )

    async def submit(self, ask: Ask) -> Scripted:
        if self.full:
            raise QueueFull("4 requests already wait (runner serve --queue)", 2)
        self._check(ask)
        self.asks.append(ask)
        generation = Scripted(self.parts, self.outcome)
        self.generations.append(generation)
        return generation

    async def load(self, name: str, keep_alive: float | None = None) -> float:
        return 0.0

    async def unload(self, name: str) -> bool:
        return True

    async def count_tokens(self, ask: Ask) -> int:
        self._check(ask)
        self.asks.append(ask)
        return 7

    async def embed(self, model: str, texts: list[str], *, truncate: bool) -> tuple[list[list[float]], int]:
        return [[1.0] + [0.0] * 575 for _ in texts], 3 * len(texts)


def outcome_of(
    text: str,
    finish_reason: str = "stop",
    *,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    stop: str | None = None,
    reasoning: str = "",
    tool_calls: tuple[dict[str, Any], ...] = (),
) -> Outcome:
    """An engine's answer as the stand-in backend hands it out: a Result with these fields."""
    timings = Timings(
        prompt_tokens=prompt_tokens, prefill_tokens=prompt_tokens, completion_tokens=completion_tokens
    )
    result = Result(text, finish_reason, timings, reasoning=reasoning, stop=stop, tool_calls=tool_calls)
    return Outcome(result)
