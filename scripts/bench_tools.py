"""Tools benchmark: runner's own cost around a tool call, and a chat's start with three MCP servers.

Per tool step, through the agent loop's own code (runner.commands.agent.answer_with_tools), SmolLM2
forced to call an echo tool on a stdio MCP server (this script, started as `--serve-echo`):
- overhead: from the end of the call's last token (the answer read) to the next answer's request,
  less the tool's own time (the echo measures it inside the server and says it): the approval, the
  MCP round trip, the result kept, the conversation rendered and tokenized again;
- the next answer's prompt: tokens in all, and tokens evaluated (prefix reuse: only the call's
  result and the template's wrapper should be), its TTFT.
Start-up: `runner chat smollm2 --mcp --verbose` with three echo servers that each wait DELAY s before
serving, from the command to the first prompt, against: the slowest of the three servers in the same
run (the chat's --verbose says when each was ready: what runner adds after it), one such server's
start alone (a client process of its own: Python, the server started and its tools listed), the three
started by such a client, and `runner chat smollm2` with no server.

    .venv/bin/python scripts/bench_tools.py [--rounds 20] [--delay 1.0] [--json]

Targets: overhead p50 <= 20 ms; chat ready with 3 servers <= the slowest start + 0.2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib import machine, progress, target  # noqa: E402

OVERHEAD_P50_MS = 20.0
START_SLACK_S = 0.2
READY = "MCP servers ready, since the start: "  # runner chat --verbose's line (runner.commands.agent)


def serve_echo(delay: float) -> None:
    """The echo server: `echo(text)` returns the text and, after a tab, the seconds it took inside.
    It waits `delay` s once its code is loaded (a server that connects to something first)."""
    from mcp.server.mcpserver import MCPServer

    time.sleep(delay)

    server = MCPServer("echo", log_level="WARNING")

    @server.tool()
    def echo(text: str) -> str:
        """Say the text back."""
        start = time.perf_counter()
        said = text
        return f"{said}\t{time.perf_counter() - start:.6f}"

    server.run("stdio")


def config(folder: Path, servers: int, delay: float) -> Path:
    path = folder / f"mcp-{servers}.json"
    entry = {"command": sys.executable, "args": [__file__, "--serve-echo", str(delay)]}
    path.write_text(json.dumps({"mcpServers": {f"echo{i}": entry for i in range(servers)}}))
    return path


def steps(rounds: int, folder: Path) -> dict[str, Any]:
    """`rounds` turns of a chat whose every turn's first step is a forced echo call."""
    from runner.commands.agent import (
        Approvals,
        HeldCalls,
        Servers,
        ToolSettings,
        Turns,
        answer_with_tools,
        template_message,
    )
    from runner.commands.output import stream_answer
    from runner.engine.conversation import fit
    from runner.engine.request import Request
    from runner.engine.text.sampling import SamplingConfig
    from runner.engine.text.tools import call_shape
    from runner.loader import open_model
    from runner.settings import LoadSettings
    from runner.store import StoredMessage

    settings = ToolSettings(configs=(str(config(folder, 1, 0.0)),), allow=("echo0:*",), choice="echo")
    servers = Servers(settings, default=False)
    loaded = open_model("smollm2", LoadSettings(growing=True, spec="none"))
    host = servers.ready()
    assert host is not None
    sink = open(os.devnull, "w")  # noqa: SIM115
    turns: list[StoredMessage] = []
    kept = Turns(turns, loaded.name)
    marks: list[tuple[str, float, Any]] = []

    def ask(choice: str | dict[str, Any]) -> Any:
        marks.append(("ask", time.perf_counter(), None))
        tools = [t.openai() for t in host.tools()]
        messages = [template_message(m) for m in turns]
        prompt = fit(loaded.engine, loaded.header, None, messages, max_tokens=48, tools=tools).prompt
        forced = choice not in ("auto", "none")
        shape = call_shape(tools, choice) if forced else None
        request = Request(prompt, SamplingConfig(temperature=0), 48, (), shape, tuple(tools), forced)
        writer = HeldCalls(sink, quiet=True)
        result = stream_answer(loaded, request, writer)
        marks.append(("answered", time.perf_counter(), result))
        return result

    overhead, own, evaluated, prompt_tokens, ttft = [], [], [], [], []
    try:
        for i in range(rounds):
            turns.append(StoredMessage("user", f"Say back the word number {i} with the echo tool."))
            marks.clear()
            answer_with_tools(ask, host, settings, Approvals(settings.allow), kept)
            answered = [m for m in marks if m[0] == "answered"]
            asks = [m for m in marks if m[0] == "ask"]
            if len(answered) < 2 or not answered[0][2].tool_calls:
                continue
            inside = float(turns[-2].content.rsplit("\t", 1)[-1]) if "\t" in turns[-2].content else 0.0
            overhead.append((asks[1][1] - answered[0][1] - inside) * 1000)
            own.append(inside * 1000)
            t = answered[1][2].timings
            evaluated.append(t.prefill_tokens)
            prompt_tokens.append(t.prompt_tokens)
            ttft.append(t.ttft_s * 1000)
    finally:
        loaded.close()
        servers.close()
        sink.close()
    return {
        "steps": len(overhead),
        "overhead_ms_p50": statistics.median(overhead) if overhead else None,
        "overhead_ms_p90": sorted(overhead)[int(0.9 * (len(overhead) - 1))] if overhead else None,
        "tool_own_ms_p50": statistics.median(own) if own else None,
        "next_prompt_tokens_p50": statistics.median(prompt_tokens) if prompt_tokens else None,
        "next_evaluated_tokens_p50": statistics.median(evaluated) if evaluated else None,
        "next_ttft_ms_p50": statistics.median(ttft) if ttft else None,
    }


def startup(rounds: int, delay: float, folder: Path) -> dict[str, float]:
    """The chat's time to its first prompt with three servers, with none, and one server's start."""
    import pexpect

    three, none, one, bare, slowest = [], [], [], [], []
    env = {**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1", "RUNNER_NO_SAVE": "1", "RUNNER_HOME": str(folder)}
    for _ in range(rounds):
        for servers, into in ((3, three), (0, none)):
            flags = ["--mcp", str(config(folder, servers, delay)), "--verbose"] if servers else []
            start = time.perf_counter()
            command = ["-m", "runner", "chat", "smollm2", *flags]
            child = pexpect.spawn(sys.executable, command, env=env, timeout=60)
            child.expect_exact(b">>>")
            into.append(time.perf_counter() - start)
            if servers:  # each server's ready time in this run, as the chat says it (--verbose)
                said = child.before.decode().split(READY, 1)[1].splitlines()[0]
                slowest.append(max(float(part.split()[-2]) for part in said.split(" · ")))
            child.sendline(b"/bye")
            child.expect(pexpect.EOF)
        for servers, into in ((1, one), (3, bare)):  # a client process of its own: Python, the SDK
            spawned = str(time.time())
            command = [sys.executable, __file__, "--start-one", str(config(folder, servers, delay)), spawned]
            said = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            into.append(float(said))  # from the spawn to its servers ready (their shutdown apart)
    after = [t - s for t, s in zip(three, slowest, strict=True)]
    return {
        "chat_3_servers_s": statistics.median(three),
        "slowest_server_in_the_chat_s": statistics.median(slowest),
        "chat_after_its_slowest_server_s": statistics.median(after),
        "chat_no_server_s": statistics.median(none),
        "one_server_start_s": statistics.median(one),
        "three_servers_bare_client_s": statistics.median(bare),
    }


def start_one(path: str, spawned: float) -> None:
    """Servers' start as a client sees it: the host started and the tools listed; the seconds since
    `spawned` (the parent's clock when it started this process) printed, then the servers closed."""
    from runner.tools.config import load_config
    from runner.tools.host import ToolHost

    with ToolHost(load_config([Path(path)])) as host:
        assert not host.start() and len(host.tools()) == len(host.servers())
        print(time.time() - spawned, flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-echo":
        serve_echo(float(sys.argv[2]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--start-one":
        start_one(sys.argv[2], float(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--start-rounds", type=int, default=3)
    parser.add_argument("--delay", type=float, default=1.0, help="each server's wait before it serves")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        progress("tool steps …")
        figures = steps(args.rounds, folder)
        progress("start-up …")
        started = startup(args.start_rounds, args.delay, folder)
    figures.update(started)
    figures["machine"] = machine()
    if args.json:
        print(json.dumps(figures))
        return
    print(f"machine: {figures['machine']}")
    for key, value in figures.items():
        if key != "machine":
            print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    print(target("overhead p50 ms", figures["overhead_ms_p50"], OVERHEAD_P50_MS, at_least=False))
    after = started["chat_after_its_slowest_server_s"]
    print(target("chat ready - its slowest server ready, same run (s)", after, START_SLACK_S, at_least=False))
    slack = started["chat_3_servers_s"] - started["one_server_start_s"]
    print(target("chat ready with 3 servers - one server alone (s)", slack, START_SLACK_S, at_least=False))
    floor = max(started["three_servers_bare_client_s"], started["chat_no_server_s"])
    own = started["chat_3_servers_s"] - floor
    print(
        target("chat ready with 3 servers - a bare client's 3 starts (s)", own, START_SLACK_S, at_least=False)
    )


if __name__ == "__main__":
    main()
