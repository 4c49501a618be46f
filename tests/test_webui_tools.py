"""The chat page's turns with tools (`runner serve --mcp FILE`), over loopback: a scripted model whose
answer to a question is a call of `touch` (tests/mcp_servers.py: the file it makes is the check) and
whose answer to a tool's result is "The file is written.". Each call waits for the page's answer:
allowed, it runs and the answer follows; denied, nothing runs and the model is told; stopped, nothing
runs and the turn ends; "always", the next turn runs it without asking. A second tab sees the
question too, bad answers are 4xx, and every step is stored as the terminal stores it."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from runner.store import Store
from runner.tools.loop import INTERRUPTED_CALL, REFUSED_CALL, UNANSWERED_CALL, ToolSettings
from tests.conftest import run_cli
from tests.serving import THREADS, Server, free_port, serving

SERVERS = Path(__file__).resolve().parent / "mcp_servers.py"
API = "/runner/v1"
# SmolLM2's " go", " done", <|im_end|>, two rare tokens (rewritten: the call, the final answer)
GO, DONE, END, CALL, FINAL = 685, 2294, 2, 49001, 49150
# the generation prompt ends " go" for a question, " done" after a tool's result: the scripted model's
# answer depends on the last token only (tests/synth.py: write_scripted)
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content if m.content is string else '' }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if messages[-1].role == 'tool' %} done{% else %} go{% endif %}{% endif %}"
)
ANSWER = "The file is written."


def byte_level(text: str) -> str:
    """A token's text as a byte-level BPE vocabulary (SmolLM2's) spells it."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in keep]
    table = {b: chr(b) for b in keep} | {b: chr(256 + i) for i, b in enumerate(moved)}
    return "".join(table[b] for b in text.encode())


def caller(smollm2_path: Path, path: Path, tool: str, arguments: dict[str, Any]) -> Path:
    """A scripted model whose answer to a question is one call of `tool` (runner's generic call format:
    the call's JSON) and to a tool's result ANSWER."""
    from tests.synth import write_scripted

    call = json.dumps({"name": tool, "arguments": arguments})
    edits = {CALL: byte_level(call), FINAL: byte_level(ANSWER)}
    return write_scripted(
        path, smollm2_path, [GO, CALL, END, DONE, FINAL, END], edits=edits, template=TEMPLATE
    )


def tools_config(folder: Path) -> Path:
    """An mcpServers file naming the test tools' server, "calc"; `touch` writes in folder/work."""
    work = folder / "work"
    work.mkdir(exist_ok=True)
    config = folder / "mcp.json"
    server = {"command": sys.executable, "args": [str(SERVERS), "tools"], "env": {"MCP_TEST_ROOT": str(work)}}
    config.write_text(json.dumps({"mcpServers": {"calc": server}}))
    return config


@pytest.fixture(scope="module")
def served(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """runner serve with a model that calls `touch` and the test tools: the server, and the folder
    `touch` writes in (its data folder, the store, is beside it)."""
    folder = tmp_path_factory.mktemp("webui-tools")
    model = caller(smollm2_path, folder / "caller.gguf", "touch", {"name": "made"})
    args = [str(model), "--ctx", "4096", "--parallel", "1", "--mcp", str(tools_config(folder))]
    with serving([*args, "--allow-tools", "add", *THREADS], folder / "stderr") as running:
        yield running, folder / "work"


class Turn:
    """A turn posted from "the page": its events read as they come, in a thread of their own."""

    def __init__(self, url: str, body: dict[str, Any], path: str = f"{API}/turns") -> None:
        self.events: list[dict[str, Any]] = []
        self._more = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(url + path, body), daemon=True)
        self._thread.start()

    def _read(self, url: str, body: dict[str, Any] | None) -> None:
        method = "POST" if body is not None else "GET"
        with httpx.stream(method, url, json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.strip():
                    with self._more:
                        self.events.append(json.loads(line))
                        self._more.notify_all()
        with self._more:
            self.events.append({"type": "closed"})
            self._more.notify_all()

    def first(self, kind: str, timeout: float = 60) -> dict[str, Any]:
        """The first event of this kind, waited for."""
        end = time.monotonic() + timeout
        with self._more:
            while True:
                found = [e for e in self.events if e["type"] == kind]
                if found:
                    return found[0]
                assert self.events[-1:] != [{"type": "closed"}], self.events
                assert self._more.wait(end - time.monotonic()), f"no {kind} event: {self.events}"

    def ended(self) -> list[dict[str, Any]]:
        self.first("closed")
        return self.events


def approve(server: Server, conversation: int, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return httpx.post(
        f"{server.url}{API}/conversations/{conversation}/approve", json=body, timeout=30, **kwargs
    )


def stored(server: Server | None, conversation: int) -> list[tuple[str, str]]:
    """A conversation's turns as the server stored them (None: a server in the test's own data folder)."""
    kept = Store.open(server.log.parent / "data" / "conversations.db" if server else None).load(conversation)
    assert kept is not None
    return [(m.role, m.content) for m in kept.messages]


def test_an_allowed_call_runs_and_every_step_is_kept(served: tuple[Server, Path]) -> None:
    server, work = served
    turn = Turn(server.url, {"content": "Make the file."})
    number = turn.first("start")["conversation"]
    asked = turn.first("approval")
    assert (asked["server"], asked["tool"], asked["wait_s"]) == ("calc", "touch", 300)
    assert json.loads(asked["arguments"]) == {"name": "made"}
    assert not (work / "made.touched").exists()  # nothing runs before the person answers
    second = Turn(server.url, None, f"{API}/conversations/{number}/live")  # a second tab
    assert second.first("approval")["id"] == asked["id"]
    assert approve(server, number, {"id": asked["id"], "decision": "allow"}).json() == {"ok": True}
    events = turn.ended()
    assert (work / "made.touched").exists()
    said = [e for e in events if e["type"] == "approved"]
    assert [(e["id"], e["decision"]) for e in said] == [(asked["id"], "allowed")]
    steps = [e["message"] for e in events if e["type"] == "message"]
    assert [(m["role"], m.get("tool")) for m in steps] == [("assistant", None), ("tool", "touch")]
    assert steps[0]["tool_calls"][0]["name"] == "touch" and steps[1]["content"] == "made made.touched"
    assert "".join(e["text"] for e in events if e["type"] == "answer") == ANSWER
    assert [e["type"] for e in events][-3:] == ["done", "end", "closed"]
    assert second.ended()[-2:] == [{"type": "end"}, {"type": "closed"}]
    assert stored(server, number) == [
        ("user", "Make the file."),
        ("assistant", ""),
        ("tool", "made made.touched"),
        ("assistant", ANSWER),
    ]
    # the terminal shows it and continues it: the steps are what its template reads
    data = {"RUNNER_DATA_DIR": str(server.log.parent / "data")}
    history = run_cli("history", "show", str(number), env=data)
    assert history.returncode == 0, history.stderr
    assert b"touch" in history.stdout and ANSWER.encode() in history.stdout
    more = run_cli("chat", "--resume", str(number), "--max-tokens", "8", input=b"And again?\n", env=data)
    assert more.returncode == 0, more.stderr
    again = stored(server, number)[4:]  # no --mcp here: the model's call is text, the answer
    assert again == [("user", "And again?"), ("assistant", more.stdout.decode().strip())]
    assert '"touch"' in again[1][1]


def test_a_denied_call_does_not_run_and_bad_answers_are_refused(served: tuple[Server, Path]) -> None:
    server, work = served
    turn = Turn(server.url, {"content": "Make the file."})
    number = turn.first("start")["conversation"]
    asked = turn.first("approval")
    (work / "made.touched").unlink(missing_ok=True)
    bad = [
        ({"id": asked["id"], "decision": "maybe"}, 400),
        ({"id": asked["id"], "decision": "allow", "extra": 1}, 400),
        ({"decision": "allow"}, 400),
        ({"id": "ask_0000", "decision": "allow"}, 409),  # no such question
    ]
    for body, status in bad:
        got = approve(server, number, body)
        assert got.status_code == status, (body, got.text)
        assert "message" in got.json()["error"]
    form = httpx.post(
        f"{server.url}{API}/conversations/{number}/approve",
        content=f"id={asked['id']}&decision=allow",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert form.status_code == 415  # no cross-site form can answer
    assert approve(server, number + 1000, {"id": asked["id"], "decision": "allow"}).status_code == 409
    assert httpx.post(f"{server.url}{API}/conversations/x/approve", json={}).status_code == 404
    assert approve(server, number, {"id": asked["id"], "decision": "deny"}).status_code == 200
    assert approve(server, number, {"id": asked["id"], "decision": "allow"}).status_code == 409  # once
    events = turn.ended()
    assert not (work / "made.touched").exists()
    assert [e["decision"] for e in events if e["type"] == "approved"] == ["denied"]
    assert stored(server, number)[2] == ("tool", REFUSED_CALL)  # the model is told, as the terminal's "no"
    assert stored(server, number)[3] == ("assistant", ANSWER)


def test_stop_while_a_call_waits_runs_nothing_and_keeps_the_steps(served: tuple[Server, Path]) -> None:
    server, work = served
    (work / "made.touched").unlink(missing_ok=True)
    turn = Turn(server.url, {"content": "Make the file."})
    number = turn.first("start")["conversation"]
    asked = turn.first("approval")
    stop = httpx.post(f"{server.url}{API}/conversations/{number}/stop", json={})
    assert stop.json() == {"stopped": True}
    events = turn.ended()
    said = [e for e in events if e["type"] == "approved"]
    assert [(e["id"], e["decision"], e["why"]) for e in said] == [
        (asked["id"], "unanswered", "the turn was stopped")
    ]
    assert not (work / "made.touched").exists()
    roles = stored(server, number)
    assert [r for r, _ in roles] == ["user", "assistant", "tool", "assistant"]
    assert roles[2] == ("tool", UNANSWERED_CALL)
    kept = Store.open(server.log.parent / "data" / "conversations.db").load(number)
    assert kept is not None and kept.messages[-1].interrupted


def test_always_runs_the_tool_without_asking_again_in_this_chat(served: tuple[Server, Path]) -> None:
    server, work = served
    (work / "made.touched").unlink(missing_ok=True)
    turn = Turn(server.url, {"content": "Make the file."})
    number = turn.first("start")["conversation"]
    asked = turn.first("approval")
    assert approve(server, number, {"id": asked["id"], "decision": "always"}).status_code == 200
    assert [e["decision"] for e in turn.ended() if e["type"] == "approved"] == ["always"]
    assert (work / "made.touched").exists()
    (work / "made.touched").unlink()
    again = Turn(server.url, {"conversation": number, "content": "Once more."}).ended()
    assert not [e for e in again if e["type"] == "approval"]  # not asked again in this chat
    assert (work / "made.touched").exists()
    other = Turn(server.url, {"content": "Make the file."})  # another chat asks again
    other_number = other.first("start")["conversation"]
    asked = other.first("approval")
    assert approve(server, other_number, {"id": asked["id"], "decision": "deny"}).status_code == 200
    other.ended()


def test_the_page_asks_and_a_click_allows_the_call(served: tuple[Server, Path]) -> None:
    """In a real browser (as tests/test_webui_browser.py: Debian's chromium through Playwright): the
    call shown with its arguments, asked again after a reload, nothing run until Allow is clicked,
    then the answer; the steps shown once each."""
    import os
    import shutil

    chromium = (
        os.environ.get("RUNNER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    how = "apt-get install chromium (Debian) and pip install playwright, or RUNNER_CHROMIUM=/path/to/chrome"
    if chromium is None:
        pytest.skip(f"no Chromium for the browser tests: {how}")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason=f"no Playwright for the browser tests: {how}"
    )
    server, work = served
    (work / "made.touched").unlink(missing_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            tab = browser.new_page()
            problems: list[str] = []
            tab.on("pageerror", lambda exc: problems.append(str(exc)))
            tab.goto(server.url)
            tab.wait_for_selector("body[data-ready=true]")
            tab.fill("#input", "Make the file.")
            tab.keyboard.press("Enter")
            ask = tab.wait_for_selector("#log .msg.approval", timeout=60_000)
            assert "calc:touch" in ask.inner_text() and '"made"' in ask.inner_text()
            assert not (work / "made.touched").exists()
            tab.reload()  # the question waits for the page that comes back
            tab.wait_for_selector("body[data-ready=true]")
            tab.wait_for_selector("#log .msg.approval", timeout=60_000)
            artifacts = os.environ.get("RUNNER_TEST_ARTIFACTS")
            if artifacts:  # what the question looks like, kept with the run
                tab.screenshot(path=str(Path(artifacts) / "webui-tool-approval.png"))
            tab.get_by_role("button", name="Allow", exact=True).click()
            tab.wait_for_selector("#send:not([hidden])", timeout=60_000)
            assert (work / "made.touched").exists()
            shown = tab.locator("#log").inner_text()
            assert ANSWER in shown and shown.count("result of touch") == 1  # the stored steps, once
            assert not problems, problems
        finally:
            browser.close()


def test_an_allowed_tool_runs_unasked_and_stop_cancels_it(smollm2_path: Path, tmp_path: Path) -> None:
    """--allow-tools: no question; the stop button during the call cancels it (the tool `wait` takes
    a minute), and the turn ends with its steps kept."""
    model = caller(smollm2_path, tmp_path / "waiter.gguf", "wait", {})
    args = [str(model), "--ctx", "4096", "--mcp", str(tools_config(tmp_path)), "--allow-tools", "calc:*"]
    with serving([*args, *THREADS], tmp_path / "stderr") as server:
        turn = Turn(server.url, {"content": "Wait."})
        number = turn.first("start")["conversation"]
        end = time.monotonic() + 30
        while b"running calc:wait" not in server.log.read_bytes():
            assert time.monotonic() < end, server.stderr()
            time.sleep(0.1)
        began = time.monotonic()
        assert httpx.post(f"{server.url}{API}/conversations/{number}/stop", json={}).json() == {
            "stopped": True
        }
        events = turn.ended()
        assert time.monotonic() - began < 10  # cancelled, not waited out
        assert not [e for e in events if e["type"] in ("approval", "approved")]
        roles = stored(None, number)
        assert [r for r, _ in roles] == ["user", "assistant", "tool", "assistant"]
        assert roles[2] == ("tool", INTERRUPTED_CALL)
        assert b"tool calc:wait (allowed): interrupted" in server.log.read_bytes()


def test_bad_tool_flags_are_refused_before_anything_loads(tmp_path: Path) -> None:
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {}}))
    for flags, why in [
        (("--allow-tools", "add"), b"--allow-tools goes with --mcp"),
        (("--mcp", str(config), "--no-webui"), b"goes without --no-webui"),
        (("--mcp", str(config), "--max-tool-steps", "0"), b"--max-tool-steps"),
        (("--mcp", str(tmp_path / "none.json")), b"none.json"),
    ]:
        done = run_cli("serve", "nosuchmodel", "--port", str(free_port()), *flags)
        assert done.returncode == 2 and why in done.stderr, (flags, done.stderr)


@pytest.mark.fast
def test_an_answer_needs_the_key(_own_data_dir: Path) -> None:
    """In process, the real app over a stand-in backend: the approve route is under the key like
    every /runner/v1 request."""
    from starlette.testclient import TestClient

    from runner.serve.app import create_app
    from runner.serve.webui.conversations import Conversations
    from tests.serving import StandIn

    store = Conversations()
    try:
        app = create_app(StandIn(), webui=store, api_key="k3y", log=lambda line: None)
        with TestClient(app) as http:
            body = {"id": "ask_1", "decision": "allow"}
            assert http.post(f"{API}/conversations/1/approve", json=body).status_code == 401
            keyed = http.post(
                f"{API}/conversations/1/approve", json=body, headers={"Authorization": "Bearer k3y"}
            )
            assert keyed.status_code == 409  # no turn waits there
    finally:
        store.close()


def wait_for(
    answer: str | None, *, followers: int = 1, stopped: bool = False, **bounds: float
) -> tuple[str, str]:
    """ToolTurn's wait for the page's answer, on a stand-in turn: what it ends with."""
    from runner.serve.webui.tools import PageTools, Question, ToolTurn
    from runner.tools.catalog import Tool

    question = Question(Tool("calc", "touch", "touch", "", {}), {"name": "x"})
    if answer is not None:
        question.answer_with(answer)
    tools = PageTools(None, ToolSettings(), **bounds)  # type: ignore[arg-type]
    if stopped:
        tools.stop()  # the server stopping: as the stop button
    turn = SimpleNamespace(tools=tools, followers=followers, _stopped=threading.Event())
    turn._stop = lambda: ToolTurn._stop(turn)  # type: ignore[arg-type]
    return ToolTurn._wait(turn, question)  # type: ignore[arg-type]


@pytest.mark.fast
def test_a_question_no_one_answers_ends_within_its_bounds() -> None:
    assert wait_for("allow") == ("y", "")
    assert wait_for("always") == ("a", "")
    assert wait_for(None, stopped=True) == ("u", "the turn was stopped")
    began = time.monotonic()
    assert wait_for(None, wait_s=0.3) == ("u", "no answer in 0.3 s")
    assert wait_for(None, followers=0, gone_s=0.2) == ("u", "no page follows the conversation")
    assert time.monotonic() - began < 3
