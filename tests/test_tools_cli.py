"""Tools in the terminal, end to end: runner run and runner chat with SmolLM2 and real MCP servers over
stdio (tests/mcp_servers.py), a call forced by --tool-choice so that the small model makes it.

What a pipe may run (only what --allow-tools allows: the tool's side effect is checked absent), what
stdout carries (the final answer alone), the questions on a terminal (yes, no, always), Ctrl-C during
a call, and every step kept: history show, export, and run -c continuing with them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.helpers import ready, spawn

pytestmark = pytest.mark.slow

SERVERS = Path(__file__).resolve().parent / "mcp_servers.py"
GREEDY = ("--temperature", "0", "--max-tokens", "40")


def config(folder: Path) -> Path:
    """An mcpServers file naming one stdio server, "calc", with the test tools; `touch` and `read`
    work in `folder`."""
    path = folder / "mcp.json"
    env = {"MCP_TEST_ROOT": str(folder)}
    server = {"command": sys.executable, "args": [str(SERVERS), "tools"], "env": env}
    path.write_text(json.dumps({"mcpServers": {"calc": server}}))
    return path


def test_run_makes_the_forced_call_and_prints_the_final_answer_only(tmp_path: Path) -> None:
    mcp = config(tmp_path)
    asked = ("run", "smollm2", "What is 2 plus 3?", "--mcp", str(mcp), "--tool-choice", "add")
    done = run_cli(*asked, "--allow-tools", "add", "--json", *GREEDY)
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.decode().splitlines()
    answer = json.loads(line)
    [step] = answer["steps"]
    assert (step["tool"], step["server"], step["approved"], step["error"]) == ("add", "calc", "allowed", 0)
    assert step["result_bytes"] == len(str(step["arguments"]["a"] + step["arguments"]["b"]))
    assert answer["finish_reason"] == "stop" and "tool_calls" not in answer
    assert b"tool calc:add (allowed): ok" in done.stderr
    plain = run_cli(*asked, "--allow-tools", "calc:*", *GREEDY)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.decode().strip() == answer["text"].strip()  # the final answer alone: no call
    assert b"tool calc:add (allowed)" in plain.stderr


def test_a_pipe_runs_no_tool_it_was_not_allowed(tmp_path: Path) -> None:
    mcp = config(tmp_path)
    asked = ("run", "smollm2", "Make the file done.txt", "--mcp", str(mcp), "--tool-choice", "touch", *GREEDY)
    refused = run_cli(*asked, "--allow-tools", "add")
    assert refused.returncode == 1 and refused.stdout == b""
    assert b"which --allow-tools does not allow" in refused.stderr and b"nothing ran" in refused.stderr
    assert not list(tmp_path.glob("*.touched"))  # the tool never ran
    allowed = run_cli(*asked, "--allow-tools", "touch")
    assert allowed.returncode == 0, allowed.stderr
    assert list(tmp_path.glob("*.touched"))


def test_bad_tool_flags_are_refused_before_anything_runs(tmp_path: Path) -> None:
    mcp = config(tmp_path)
    for flags, why in [
        (("--max-tool-steps", "0"), b"--max-tool-steps"),
        (("--allow-tools", "calc:add"), b"--allow-tools"),
        (("--tool-choice", "nosuch"), b"no such tool"),
        (("--format", "json"), b"--mcp goes without"),
    ]:
        done = run_cli("run", "smollm2", "Hi", "--mcp", str(mcp), *flags)
        assert done.returncode == 2 and why in done.stderr, (flags, done.stderr)
    missing = run_cli("run", "smollm2", "Hi", "--mcp", str(tmp_path / "none.json"))
    assert missing.returncode == 2 and b"none.json" in missing.stderr


def test_a_chat_keeps_each_step_and_run_c_continues_with_them(tmp_path: Path) -> None:
    mcp = config(tmp_path)
    chat = run_cli(
        "chat", "smollm2", "--mcp", str(mcp), "--tool-choice", "add", "--allow-tools", "add", *GREEDY,
        input=b"What is 2 plus 3?\n",
    )  # fmt: skip
    assert chat.returncode == 0, chat.stderr
    shown = run_cli("history", "show", "1")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout.decode()
    assert "  call add {" in text and "tool add: " in text, text
    exported = json.loads(run_cli("history", "show", "1", "--json").stdout)
    roles = [m["role"] for m in exported["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"], roles
    call = exported["messages"][1]["tool_calls"][0]
    assert call["name"] == "add" and exported["messages"][2]["call_id"] == call["id"]
    more = run_cli("run", "-c", "And plus 1?", "--json", *GREEDY)
    assert more.returncode == 0, more.stderr
    again = json.loads(run_cli("history", "show", "1", "--json").stdout)
    assert [m["role"] for m in again["messages"]][:4] == roles  # the steps stayed, the turn came after


def test_on_a_terminal_each_call_is_asked_and_always_is_remembered(tmp_path: Path) -> None:
    mcp = config(tmp_path)
    child = spawn("chat", "smollm2", "--mcp", str(mcp), "--tool-choice", "touch", *GREEDY, "--no-save")
    try:
        ready(child)
        child.sendline("Make the file a.txt")
        child.expect_exact("run touch? [y]es / [n]o / [a]lways")
        child.sendline("n")
        child.expect_exact("tool calc:touch: refused, not run")
        ready(child)
        assert not list(tmp_path.glob("*.touched"))
        child.sendline("Make the file b.txt")
        child.expect_exact("run touch?")
        child.sendline("a")
        child.expect_exact("tool calc:touch (always): ok")
        ready(child)
        assert len(list(tmp_path.glob("*.touched"))) == 1
        child.sendline("Make the file c.txt")
        child.expect_exact("tool calc:touch (always): ok")  # not asked again
        ready(child)
        child.sendeof()
        child.expect(pytest.importorskip("pexpect").EOF)
    finally:
        child.close(force=True)


def test_ctrl_c_cancels_a_running_call_and_the_chat_goes_on(tmp_path: Path, _own_data_dir: Path) -> None:
    mcp = config(tmp_path)
    flags = ("--tool-choice", "wait", "--allow-tools", "wait")
    child = spawn("chat", "smollm2", "--mcp", str(mcp), *flags, *GREEDY)
    try:
        ready(child)
        child.sendline("Wait for me")
        child.expect_exact("running calc:wait")
        started = time.monotonic()
        child.sendintr()
        child.expect_exact("tool calc:wait (allowed): interrupted")
        ready(child)
        assert time.monotonic() - started < 10  # the tool sleeps for a minute
        child.sendeof()
        child.expect(pytest.importorskip("pexpect").EOF)
        # the server heard MCP's cancellation notice: its stderr (in its log, never the terminal) says so
        log = _own_data_dir / "logs" / "mcp-calc.log"
        assert "wait cancelled" in log.read_text()
    finally:
        child.close(force=True)


def test_a_real_mcp_server_as_people_install_it(tmp_path: Path) -> None:
    """mcp-server-time (PyPI), started from its console script as Claude Desktop's configs name it."""
    command = Path(sys.executable).with_name("mcp-server-time")
    if not command.exists():
        pytest.skip("mcp-server-time is not installed (pip install '.[test]' brings it)")
    mcp = tmp_path / "time.json"
    mcp.write_text(
        json.dumps({"mcpServers": {"time": {"command": str(command), "args": ["--local-timezone", "UTC"]}}})
    )
    asked = (
        "run",
        "smollm2",
        "What time is it in UTC?",
        "--mcp",
        str(mcp),
        "--tool-choice",
        "get_current_time",
    )
    done = run_cli(*asked, "--allow-tools", "time:*", "--json", *GREEDY)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    [step] = answer["steps"]
    assert (step["tool"], step["server"], step["error"]) == ("get_current_time", "time", False)
    assert step["result_bytes"] > 20  # the server's JSON: its timezone, the datetime


def test_a_tools_image_goes_to_a_vision_model_as_an_image(tmp_path: Path, smollm2_path: Path) -> None:
    """The test server's `image` tool returns a PNG: with a projector (the test one, --mmproj) the chat
    keeps it as the tool message's image, a file of runner's data folder, sent to the model as
    images are; without one, the model reads a note instead."""
    projector = tmp_path / "mlp.gguf"
    script = Path(__file__).resolve().parent.parent / "scripts" / "make_test_projector.py"
    made = [sys.executable, str(script), str(projector), "--for", str(smollm2_path), "--type", "mlp"]
    subprocess.run(made, check=True, capture_output=True)
    mcp = config(tmp_path)
    flags = ("--mcp", str(mcp), "--tool-choice", "image", "--allow-tools", "image", *GREEDY)
    seen = run_cli("chat", "smollm2", "--mmproj", str(projector), *flags, input=b"Show me the picture\n")
    assert seen.returncode == 0, seen.stderr
    stored = json.loads(run_cli("history", "show", "1", "--json").stdout)
    result = stored["messages"][2]
    assert result["role"] == "tool" and "does not see images" not in result["content"]
    [image] = result["images"]
    assert Path(image["path"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    blind = run_cli("chat", "smollm2", *flags, input=b"Show me the picture\n")
    assert blind.returncode == 0, blind.stderr
    noted = json.loads(run_cli("history", "show", "2", "--json").stdout)["messages"][2]
    assert "this model does not see images" in noted["content"] and "images" not in noted
