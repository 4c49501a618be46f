"""runner/tools' ToolHost against real MCP servers (tests/mcp_servers.py, the SDK's own server API):
started in parallel, failing ones reported, tools listed and called, results bounded, timeouts and
Ctrl-C cancelled on the wire, a crashed server restarted once, nothing of runner's environment or
of a server's stderr let through, and a remote server over Streamable HTTP (and old HTTP+SSE)."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner import interrupt
from runner.errors import UsageError
from runner.tools import ServerConfig, ToolHost, load_config
from runner.tools.result import MAX_RESULT_BYTES

pytestmark = pytest.mark.slow

SERVERS = Path(__file__).parent / "mcp_servers.py"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)


def stdio(name: str, kind: str, *args: str, root: Path | None = None) -> ServerConfig:
    env = {"MCP_TEST_ROOT": str(root)} if root is not None else {}
    return ServerConfig(
        name=name,
        source=Path("test.json"),
        transport="stdio",
        command=sys.executable,
        args=(str(SERVERS), kind, *args),
        env=env,
    )


def remote(name: str, url: str, transport: str = "http") -> ServerConfig:
    return ServerConfig(
        name=name, source=Path("test.json"), transport=transport, url=url, headers={"X-Test": "1"}
    )


def said(log: Path, text: str, within: float = 3.0) -> bool:
    """Whether the log file says `text`, waiting up to `within` seconds for the server to write it."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if log.is_file() and text in log.read_text():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mcp-root")
    (root / "notes.txt").write_text("the notes\n")
    return root


@pytest.fixture(scope="module")
def host(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolHost]:
    """One server, "t", for the calls that leave it as it was. HF_TOKEN is set in runner's own
    environment while it starts, as a user's would be."""
    before = os.environ.get("HF_TOKEN")
    os.environ["HF_TOKEN"] = "hf_not_for_tools"
    try:
        with ToolHost([stdio("t", "tools", root=folder)], log_dir=tmp_path_factory.mktemp("logs")) as started:
            assert started.start() == []
            yield started
    finally:
        if before is None:
            os.environ.pop("HF_TOKEN", None)
        else:
            os.environ["HF_TOKEN"] = before


def test_servers_start_in_parallel_and_a_failing_one_is_one_warning(tmp_path: Path) -> None:
    servers = [stdio(name, "slow", "1.5") for name in ("a", "b", "c")]
    servers += [
        stdio("quits", "exit"),
        ServerConfig("absent", Path("t.json"), "stdio", command="no-such-mcp"),
    ]
    with ToolHost(servers, log_dir=tmp_path) as host:
        began = time.monotonic()
        warnings = host.start()
        took = time.monotonic() - began
        assert took < 4.0, f"3 servers sleeping 1.5 s each took {took:.1f} s to start: not in parallel"
        assert warnings == [
            "server quits: its process ended (mcp test server exit starting)",
            "server absent: command not found: no-such-mcp",
        ]
        ready_s = {s.name: s.ready_s for s in host.servers() if s.state == "ready"}
        assert all(ready is not None and 1.5 <= ready <= took for ready in ready_s.values()), ready_s
        states = {s.name: s.state for s in host.servers()}
        assert states == {
            "a": "ready",
            "b": "ready",
            "c": "ready",
            "quits": "failed: its process ended (mcp test server exit starting)",
            "absent": "failed: command not found: no-such-mcp",
        }
        names = [tool.name for tool in host.tools()]
        assert "a_add" in names and "c_env" in names and "add" not in names  # three servers share names
        assert host.call("b_add", {"a": 2, "b": 3}).text == "5"
        assert host.tools()[0].original == "add" and host.tools()[0].server == "a"


def test_tools_are_listed_and_called(host: ToolHost, folder: Path) -> None:
    tools = {tool.name: tool for tool in host.tools()}
    assert sorted(tools) == ["add", "big", "crash", "env", "image", "pid", "read", "sleep", "touch", "wait"]
    add = tools["add"]
    assert add.server == "t" and add.original == "add" and add.description == "Add two integers."
    assert add.schema["required"] == ["a", "b"]
    assert add.openai() == {
        "type": "function",
        "function": {"name": "add", "description": "Add two integers.", "parameters": dict(add.schema)},
    }
    done = host.call("add", {"a": 40, "b": 2})
    assert (done.text, done.is_error, done.truncated, done.images) == ("42", False, False, [])
    assert 0 < done.seconds < 5
    assert host.call("read", {"path": "notes.txt"}).text == "the notes\n"
    assert host.call("touch", {"name": "done.txt"}).text == "made done.txt.touched"
    assert (folder / "done.txt.touched").is_file()
    refused = host.call("read", {"path": "../outside"})
    assert refused.is_error and "outside the test folder" in refused.text
    unknown = host.call("nope", {})
    assert unknown.is_error and unknown.text == "unknown tool 'nope'"
    (state,) = host.servers()
    assert (state.name, state.transport, state.state) == ("t", "stdio", "ready")
    assert state.resources == ["readme"] and state.prompts == ["greet"]
    assert ("add", True) in state.tools


def test_a_megabyte_result_is_cut_with_a_note(host: ToolHost) -> None:
    done = host.call("big", {})
    body, note = done.text.rsplit("\n", 1)
    assert done.truncated and not done.is_error
    assert note == "[result cut at 32.8 KB of 1.0 MB]"
    assert len(body.encode()) <= MAX_RESULT_BYTES and body.startswith("éxxx")
    assert len(body.encode()) > MAX_RESULT_BYTES - 4  # cut at the budget, not far before it


def test_an_image_arrives_as_bytes_with_its_mime_type(host: ToolHost) -> None:
    done = host.call("image", {})
    assert done.images == [("image/png", PNG)] and done.text == "" and not done.is_error


def test_runner_environment_does_not_reach_a_server(host: ToolHost, folder: Path) -> None:
    assert os.environ["HF_TOKEN"] == "hf_not_for_tools"  # set in runner's environment as it started
    assert host.call("env", {"name": "HF_TOKEN"}).text == "<unset>"
    assert host.call("env", {"name": "RUNNER_HOME"}).text == "<unset>"
    assert host.call("env", {"name": "MCP_TEST_ROOT"}).text == str(folder)  # what the config names
    assert host.call("env", {"name": "PATH"}).text == os.environ["PATH"]
    names = set(host.call("env", {"name": "*"}).text.split())
    sdk_safe = {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"}  # the SDK's stdio client passes these
    python_own = {"LC_CTYPE"}  # Python sets it in its own environment where it coerces the C locale
    assert "MCP_TEST_ROOT" in names and names <= {"MCP_TEST_ROOT"} | sdk_safe | python_own, names


def test_a_timeout_cancels_the_call_on_the_wire(host: ToolHost) -> None:
    began = time.monotonic()
    done = host.call("sleep", {"seconds": 30}, timeout=0.5)
    assert done.is_error and not done.interrupted
    assert done.text == "sleep: no answer after 0.5 s; the call was cancelled"
    assert time.monotonic() - began < 2.0
    (state,) = host.servers()
    assert state.log is not None and said(state.log, "sleep cancelled")  # notifications/cancelled
    assert host.call("add", {"a": 1, "b": 1}).text == "2"  # the server goes on


def test_ctrl_c_cancels_the_call_and_leaves_the_flag_set(host: ToolHost) -> None:
    (state,) = host.servers()
    assert state.log is not None
    before = state.log.read_text().count("sleep cancelled")
    threading.Timer(0.3, interrupt.request).start()
    try:
        began = time.monotonic()
        done = host.call("sleep", {"seconds": 30})
        assert time.monotonic() - began < 2.0
        assert interrupt.requested()  # the caller's to clear, as after an answer it stopped
    finally:
        interrupt.clear()
    assert done.interrupted and done.is_error and "interrupted" in done.text
    deadline = time.monotonic() + 3
    while state.log.read_text().count("sleep cancelled") == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state.log.read_text().count("sleep cancelled") == before + 1
    assert host.call("add", {"a": 1, "b": 2}).text == "3"


def test_tools_and_servers_switch_off_and_on(host: ToolHost) -> None:
    assert host.enable("sleep", False) == ["sleep"]
    assert "sleep" not in [t.name for t in host.tools()]
    assert host.call("sleep", {"seconds": 0}).text == "tool sleep is switched off"
    assert len(host.enable("t", False)) == 10
    assert host.tools() == [] and host.servers()[0].state == "off"
    assert len(host.enable("t", True)) == 10 and len(host.tools()) == 10
    with pytest.raises(UsageError, match="no MCP server or tool named 'nothing'"):
        host.enable("nothing", True)


def test_a_crashed_server_restarts_once_and_its_stderr_stays_in_its_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "mcp-c.log"
    with log.open("wb") as old:  # an old log over 10 MB (sparse) is emptied at the start
        old.truncate(11 * 1024 * 1024)
    with ToolHost([stdio("c", "tools"), stdio("noisy", "noisy")], log_dir=tmp_path) as host:
        assert host.start() == []
        assert log.stat().st_size < 1024 and said(log, "mcp test server tools starting")
        first = int(host.call("c_pid", {}).text)
        crashed = host.call("c_crash", {})
        assert crashed.is_error and crashed.text.startswith("server c crashed (its process ended);")
        assert "restarts at its next call" in crashed.text and str(log) in crashed.text
        assert {s.name: s.state for s in host.servers()}["c"] == "crashed"
        again = host.call("c_pid", {})
        assert not again.is_error and int(again.text) != first  # restarted
        assert host.call("c_crash", {}).text.startswith(
            "server c crashed again (its process ended); it stays down"
        )
        down = host.call("c_add", {"a": 1, "b": 1})
        assert down.is_error and down.text == "server c is down (crashed twice)"
        assert [t.server for t in host.tools()] == ["noisy"] * 10
        assert host.call("noisy_add", {"a": 1, "b": 1}).text == "2"  # the other server goes on
        assert log.read_text().count("mcp test server tools starting") == 2
    assert capfd.readouterr() == ("", "")  # nothing from the servers, nor from the SDK, on the terminal
    assert "not JSON-RPC" in (tmp_path / "mcp-sdk.log").read_text()


def test_a_server_that_never_answers_is_given_up_after_the_start_timeout(tmp_path: Path) -> None:
    began = time.monotonic()
    with ToolHost(
        [stdio("mute", "mute"), stdio("fine", "tools")], start_timeout_s=6, log_dir=tmp_path
    ) as host:  # 6 s: room for the fine one's start on a busy machine
        assert host.start() == ["server mute: not ready after 6 s"]
        assert time.monotonic() - began < 7.5
        assert host.call("add", {"a": 1, "b": 1}).text == "2"
        assert host.call("mute_x", {}).text == "unknown tool 'mute_x'"
    assert time.monotonic() - began < 13.5  # its process stopped: stdin closed, SIGTERM after 2 s


def test_close_ends_every_server_process(tmp_path: Path) -> None:
    with ToolHost([stdio("x", "tools"), stdio("y", "tools")], log_dir=tmp_path) as host:
        host.start()
        pids = [int(host.call(name, {}).text) for name in ("x_pid", "y_pid")]
        began = time.monotonic()
    assert time.monotonic() - began < 3.0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_launch_starts_the_processes_the_sdk_then_talks_to(tmp_path: Path) -> None:
    """launch() returns once each stdio server's process runs (started before the SDK's import, so
    that the import overlaps the servers' start); the SDK's transport then takes that process over
    rather than starting a second one."""
    import psutil

    me = psutil.Process()
    before = {child.pid for child in me.children()}  # the module's own server
    with ToolHost([stdio("x", "tools"), stdio("y", "tools")], log_dir=tmp_path) as host:
        host.launch()
        launched = {child.pid for child in me.children()} - before
        assert len(launched) == 2, launched
        assert host.wait_ready() == []
        answered = {int(host.call(name, {}).text) for name in ("x_pid", "y_pid")}
        assert answered == launched == {child.pid for child in me.children()} - before


def test_a_server_started_before_the_sdk_gets_the_sdks_environment() -> None:
    """The variables a server inherits when runner starts it itself are the SDK's safe list."""
    from mcp.client.stdio import DEFAULT_INHERITED_ENV_VARS

    from runner.tools.connection import SAFE_ENV

    assert sorted(SAFE_ENV) == sorted(DEFAULT_INHERITED_ENV_VARS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def web_servers() -> Iterator[dict[str, int]]:
    """The test tools served over Streamable HTTP and over the old HTTP+SSE, each under uvicorn."""
    ports = {"http": free_port(), "sse": free_port()}
    procs = [
        subprocess.Popen([sys.executable, str(SERVERS), kind, str(port)], stderr=subprocess.DEVNULL)
        for kind, port in ports.items()
    ]
    try:
        for port in ports.values():
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "the test's HTTP MCP server did not start"
                    time.sleep(0.05)
        yield ports
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_remote_server_over_streamable_http_and_one_over_sse(
    web_servers: dict[str, int], tmp_path: Path
) -> None:
    servers = [
        remote("web", f"http://127.0.0.1:{web_servers['http']}/mcp"),
        remote("old", f"http://127.0.0.1:{web_servers['sse']}/sse"),  # no type: tried as HTTP, then SSE
        remote("gone", f"http://127.0.0.1:{free_port()}/mcp"),
    ]
    with ToolHost(servers, log_dir=tmp_path) as host:
        (warning,) = host.start()
        assert warning.startswith("server gone: http://127.0.0.1:")
        assert host.call("web_add", {"a": 2, "b": 2}).text == "4"
        assert host.call("old_add", {"a": 3, "b": 3}).text == "6"
        timed_out = host.call("web_sleep", {"seconds": 30}, timeout=0.3)
        assert timed_out.is_error and "no answer after 0.3 s" in timed_out.text
        states = {s.name: (s.transport, s.state, s.log) for s in host.servers()}
        assert states["web"] == ("http", "ready", None) and states["old"] == ("http", "ready", None)


def test_a_config_file_to_a_started_server(tmp_path: Path, folder: Path) -> None:
    config = tmp_path / "mcp.json"
    server = {
        "command": sys.executable,
        "args": [str(SERVERS), "tools"],
        "env": {"MCP_TEST_ROOT": str(folder)},
    }
    config.write_text(json.dumps({"mcpServers": {"files": server}}))
    with ToolHost(load_config([config]), log_dir=tmp_path) as host:
        assert host.start() == []
        assert host.call("read", {"path": "notes.txt"}).text == "the notes\n"
