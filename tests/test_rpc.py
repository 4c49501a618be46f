"""runner worker and --rpc, for real: two workers on loopback ports (llama.cpp's RPC server, started by
`runner worker`), and runner's commands spreading SmolLM2 over them."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pexpect
import pytest

from tests.conftest import run_cli
from tests.helpers import conversations
from tests.serving import free_port, serving

GREEDY = ["--temperature", "0", "--seed", "1"]
ALLOCATED = re.compile(r"a client allocated ([0-9.]+) (B|KB|MB|GB)")
UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}


@dataclass
class Worker:
    port: int
    process: subprocess.Popen
    log: Path
    lines: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.log.read_text()

    def allocated(self) -> float:
        """Bytes the last client allocated here, by the worker's own lines."""
        text = self.stderr().rsplit("runner worker on", 1)[-1]
        return sum(float(n) * UNITS[u] for n, u in ALLOCATED.findall(text))

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


def start_worker(tmp: Path, *args: str, port: int | None = None) -> Worker:
    port = port or free_port()
    log = tmp / f"worker-{port}-{time.monotonic_ns()}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "runner", "worker", "--port", str(port), "--threads", "1", *args],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    deadline = time.monotonic() + 30
    while "runner worker on" not in log.read_text():
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return Worker(port, process, log)


@contextlib.contextmanager
def workers(tmp: Path, n: int = 2, *args: str) -> Iterator[list[Worker]]:
    started = [start_worker(tmp, *args) for _ in range(n)]
    try:
        yield started
    finally:
        for w in started:
            if w.process.poll() is None:
                w.process.send_signal(signal.SIGTERM)
                try:
                    w.process.wait(5)
                except subprocess.TimeoutExpired:
                    w.kill()


def rpc(ws: list[Worker]) -> str:
    return ",".join(w.endpoint for w in ws)


def test_a_model_across_two_workers_answers_as_it_does_here(tmp_path: Path) -> None:
    prompt = ["run", "smollm2", "Name three colours.", "--max-tokens", "24", "--ctx", "512", *GREEDY]
    local = run_cli(*prompt)
    assert local.returncode == 0, local.stderr
    with workers(tmp_path) as ws:
        done = run_cli(*prompt, "--rpc", rpc(ws))
        assert done.returncode == 0, done.stderr
        assert done.stdout == local.stdout  # greedy: the same tokens, whichever device ran the layers
        held = [w.allocated() for w in ws]
        assert all(h > 10e6 for h in held), [w.stderr() for w in ws]  # both hold layers, by their report
        fit = run_cli("fit", "smollm2", "--ctx", "512", "--json", "--rpc", rpc(ws))
        assert fit.returncode == 0, fit.stderr
        planned = {d["device"]: d["total_bytes"] for d in json.loads(fit.stdout)["devices"]}
        for w, h in zip(ws, held, strict=True):
            assert abs(planned[w.endpoint] - h) <= 0.05 * h, (w.endpoint, planned[w.endpoint], h)


def test_a_model_too_big_for_here_is_planned_across_the_workers(tmp_path: Path) -> None:
    small = {"RUNNER_MEMORY": "100M"}  # SmolLM2 at 2,048 tokens needs ~200 MB of RAM here alone
    prompt = ["run", "smollm2", "Say hi.", "--max-tokens", "8", "--ctx", "2048", *GREEDY]
    alone = run_cli(*prompt, env=small)
    assert alone.returncode == 1 and b"does not fit in RAM" in alone.stderr, alone.stderr
    with workers(tmp_path) as ws:
        fit = run_cli("fit", "smollm2", "--ctx", "2048", "--rpc", rpc(ws), env=small)
        assert fit.returncode == 0, fit.stderr
        shown = fit.stdout.decode()
        assert "fits fully across the workers" in shown, shown
        assert re.search(r"31 of 31 layers: \d+ on 127.0.0.1:\d+, \d+ on 127.0.0.1:\d+", shown), shown
        done = run_cli(*prompt, "--rpc", rpc(ws), env=small)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip()


def test_a_worker_that_dies_mid_answer_is_one_line_and_exit_1(tmp_path: Path) -> None:
    with workers(tmp_path) as ws:
        args = [
            "run",
            "smollm2",
            "Write a long story about a dragon.",
            "--max-tokens",
            "2000",
            "--ctx",
            "4096",
        ]
        child = subprocess.Popen(
            [sys.executable, "-m", "runner", *args, *GREEDY, "--rpc", rpc(ws)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stdout is not None
        first = child.stdout.read(40)  # the answer is streaming
        assert first
        ws[1].kill()
        killed = time.monotonic()
        out, err = child.communicate(timeout=30)
        assert time.monotonic() - killed < 5
    assert child.returncode == 1
    lines = err.decode().strip().splitlines()
    assert lines == [
        f"runner: error: worker {ws[1].endpoint} went away during `runner run` ({lines[0].split('(', 1)[1]}"
    ]
    assert "Traceback" not in err.decode() and "ggml-rpc.cpp" not in err.decode()
    assert not list(Path.cwd().glob("core*"))
    assert first + out  # what came of the answer stays on stdout


def allocations(ws: list[Worker]) -> list[int]:
    return [len(ALLOCATED.findall(w.stderr())) for w in ws]


def wait_answering(ws: list[Worker], before: list[int], child: subprocess.Popen, settle: float = 3.0) -> None:
    """Until every worker holds this load's buffers (by their own lines), then `settle` seconds: the
    answer is under way (a long story over two workers runs for a minute here)."""
    deadline = time.monotonic() + 60
    while any(n <= b for n, b in zip(allocations(ws), before, strict=True)):
        assert child.poll() is None and time.monotonic() < deadline, [w.stderr() for w in ws]
        time.sleep(0.05)
    time.sleep(settle)
    assert child.poll() is None


def test_a_worker_lost_mid_answer_still_gives_the_json_of_what_came(tmp_path: Path) -> None:
    with workers(tmp_path) as ws:
        before = allocations(ws)
        args = ["run", "smollm2", "Write a long story about a dragon.", "--max-tokens", "2000", "--json"]
        child = subprocess.Popen(
            [sys.executable, "-m", "runner", *args, *GREEDY, "--rpc", rpc(ws)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        wait_answering(ws, before, child)
        ws[1].kill()
        out, err = child.communicate(timeout=30)
    assert child.returncode == 1
    [line] = err.decode().strip().splitlines()
    assert line.startswith(f"runner: error: worker {ws[1].endpoint} went away during `runner run` (")
    data = json.loads(out)  # one object, as after a Ctrl-C
    assert data["model"] == "smollm2" and data["finish_reason"] == "interrupted"
    assert data["text"] and data["usage"]["completion_tokens"] > 0
    assert data["error"].startswith("a worker's connection broke ("), data["error"]


def test_a_worker_lost_mid_answer_keeps_the_partial_answer_in_the_conversation(tmp_path: Path) -> None:
    with workers(tmp_path) as ws:
        chat = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runner",
                "chat",
                "smollm2",
                "--max-tokens",
                "2000",
                *GREEDY,
                "--rpc",
                rpc(ws),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert chat.stdin is not None and chat.stdout is not None
        chat.stdin.write(b"Write a long story about a dragon.\n")
        chat.stdin.flush()
        first = b""  # the answer is streaming (read from the pipe itself: communicate() reads it so)
        while len(first) < 40:
            piece = os.read(chat.stdout.fileno(), 40 - len(first))
            assert piece, chat.stderr.read() if chat.stderr else b""
            first += piece
        ws[1].kill()
        out, err = chat.communicate(timeout=30)
    assert chat.returncode == 1 and b"the conversation is kept: runner chat --resume" in err, err
    [conversation] = conversations()
    question, answer = conversation.messages
    assert question.role == "user" and answer.role == "assistant" and answer.interrupted
    assert answer.content == (first + out).decode().rstrip("\n")  # what was shown is what is kept
    assert answer.stats is not None and answer.stats["finish_reason"] == "interrupted"
    assert answer.stats["error"].startswith("a worker's connection broke (")

    with workers(tmp_path) as ws:  # run -c --json: the object printed after the answer is kept
        before = allocations(ws)
        go_on = "Now write a long story about a knight and his horse."
        args = ["run", "-c", go_on, "--max-tokens", "2000", "--json", *GREEDY, "--rpc", rpc(ws)]
        cont = subprocess.Popen(
            [sys.executable, "-m", "runner", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        wait_answering(ws, before, cont, settle=1.0)
        ws[0].kill()
        out, err = cont.communicate(timeout=30)
    assert cont.returncode == 1, err
    data = json.loads(out)
    assert data["finish_reason"] == "interrupted" and data["error"].startswith(
        "a worker's connection broke ("
    )
    [conversation] = conversations()
    assert [m.role for m in conversation.messages] == ["user", "assistant"] * 2
    assert conversation.messages[-1].interrupted and conversation.messages[-1].content == data["text"]


def test_ctrl_c_stops_an_answer_over_rpc(tmp_path: Path) -> None:
    with workers(tmp_path) as ws:
        args = ["run", "smollm2", "Write a long story about a dragon.", "--max-tokens", "2000"]
        child = subprocess.Popen(
            [sys.executable, "-m", "runner", *args, *GREEDY, "--rpc", rpc(ws)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert child.stdout is not None
        first = child.stdout.read(40)
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = child.communicate(timeout=30)
        assert time.monotonic() - sent < 3
        assert child.returncode == 130, err
        assert first and "Traceback" not in err.decode()
        assert all(w.process.poll() is None for w in ws)  # the workers serve on


def test_endpoints_that_are_no_worker_are_one_line_each(tmp_path: Path) -> None:
    closed = free_port()
    done = run_cli("run", "smollm2", "Hi", "--rpc", f"127.0.0.1:{closed}")
    assert done.returncode == 1
    assert done.stderr.decode().strip() == (
        f"runner: error: no worker at 127.0.0.1:{closed} (connection refused): start one there with "
        f"`runner worker --port {closed}`"
    )
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        start = time.monotonic()
        done = run_cli("fit", "smollm2", "--rpc", f"127.0.0.1:{httpd.server_port}")
        assert time.monotonic() - start < 10
    finally:
        httpd.shutdown()
    assert done.returncode == 1
    [line] = done.stderr.decode().strip().splitlines()
    assert f"127.0.0.1:{httpd.server_port}" in line and "Or is this no worker at all?" in line
    bad = run_cli("run", "smollm2", "Hi", "--rpc", "localhost")
    assert bad.returncode == 2 and b"--rpc" in bad.stderr
    with workers(tmp_path, 1) as [w]:
        second = run_cli("worker", "--port", str(w.port), timeout=30)
    assert second.returncode == 2
    assert second.stderr.decode().strip().splitlines()[-1] == (
        f"runner: error: port {w.port} on 127.0.0.1: in use; pick another with --port"
    )


def test_a_worker_on_another_address_warns_of_the_risk() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "runner", "worker", "--host", "0.0.0.0", "--port", str(port), "--no-cache"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        text = b""
        while b"runner worker on" not in text:
            chunk = process.stderr.read1(4096)
            assert chunk, text
            text += chunk
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(10)
    assert b"checks no key and encrypts nothing" in text and b"ssh -N -L" in text
    assert process.returncode == 0


def test_a_chat_over_rpc_survives_ctrl_c(tmp_path: Path) -> None:
    with workers(tmp_path) as ws:
        env = {**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm"}
        child = pexpect.spawn(
            sys.executable,
            ["-m", "runner", "chat", "smollm2", "--max-tokens", "1000", *GREEDY, "--rpc", rpc(ws)],
            env=env,
            encoding="utf-8",
            timeout=60,
            dimensions=(40, 160),
        )
        child.expect_exact("chatting with smollm2")
        child.expect_exact(">>>")
        child.sendline("Tell me a long story about a cat who sails the sea.")
        child.expect_exact("sails the sea.")
        child.expect_exact("Once upon a time")  # the greedy answer has begun (it runs for seconds here)
        child.sendintr()
        child.expect_exact("interrupted: the partial answer stays in the conversation")
        child.expect_exact(">>>")
        child.sendline("Say hello.")
        child.expect_exact("Say hello.")  # the line as accepted, redrawn after its own ">>>"
        child.expect_exact(">>>")  # the prompt after the answer
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
        child.close()
    assert child.exitstatus == 0, child.before


def test_a_second_load_from_the_worker_cache_sends_no_weights(tmp_path: Path) -> None:
    cache = tmp_path / "tensors"
    with workers(tmp_path, 1, "--cache", str(cache)) as [w]:
        for _ in range(2):
            done = run_cli("run", "smollm2", "Hi", "--max-tokens", "2", *GREEDY, "--rpc", w.endpoint)
            assert done.returncode == 0, done.stderr
    assert cache.is_dir() and sum(f.stat().st_size for f in cache.iterdir()) > 10e6


@pytest.mark.parametrize("flag", ["--rpc"])
def test_bench_runs_over_rpc(tmp_path: Path, flag: str) -> None:
    with workers(tmp_path) as ws:
        done = run_cli("bench", "smollm2", "--repetitions", "1", "--json", flag, rpc(ws), timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)


def test_serve_over_rpc_outlives_a_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx
    import openai

    monkeypatch.setenv("RUNNER_MEMORY", "100M")  # too little here alone: it waits for the worker
    with workers(tmp_path) as ws:
        args = ["smollm2", "--parallel", "2", "--ctx", "1024", "--rpc", rpc(ws)]
        with serving(args, tmp_path / "serve.log") as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
            stream = client.chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": "Write a long story about a dragon."}],
                max_tokens=900,
                temperature=0,
                stream=True,
            )
            pieces = []
            with pytest.raises(openai.APIError) as info:
                for chunk in stream:
                    pieces.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
                    if len(pieces) == 5:
                        ws[1].kill()
            assert f"worker {ws[1].endpoint} went away during the answer" in str(info.value)
            assert len(pieces) >= 5
            health = httpx.get(f"{server.url}/health", timeout=5)
            assert health.status_code == 503
            assert f"worker {ws[1].endpoint} went away" in health.json()["error"]
            refused = httpx.post(
                f"{server.url}/api/chat",
                json={"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}]},
                timeout=5,
            )
            assert refused.status_code == 503 and "went away" in refused.json()["error"]
            back = start_worker(tmp_path, port=ws[1].port)
            try:
                end = time.monotonic() + 60
                while httpx.get(f"{server.url}/health", timeout=5).status_code != 200:
                    assert time.monotonic() < end, server.stderr()
                    time.sleep(0.3)
                again = client.chat.completions.create(
                    model="smollm2", messages=[{"role": "user", "content": "Say hi."}], max_tokens=8
                )
                assert again.choices[0].message.content
            finally:
                back.process.send_signal(signal.SIGTERM)
                back.process.wait(10)
        log = server.stderr()
        assert f"worker {ws[1].endpoint} went away" in log and "ggml-rpc.cpp" not in log
        cut = [line for line in log.splitlines() if "finish=error" in line]  # the front says it
        assert len(cut) == 1 and "POST /v1/chat/completions 200" in cut[0], log
        assert "during the answer" in cut[0], log
        assert log.count("GET /health 200") == 2, log  # the test's own: not the front's polls
