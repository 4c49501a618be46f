"""`runner launch`: each agent's settings as it reads them (in process), the context checked before
anything starts, --print, an agent not installed, and a whole launch with a stand-in agent (a script
on PATH that reads its settings and calls the server as the agent would). The real agents run against
`runner launch` in test_agents_traffic.py."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from runner.commands.agents import AGENT_KEY_ENV, AGENTS, Endpoint, needed_context, output_limit, setup_for
from tests.conftest import run_cli

AT = Endpoint("http://127.0.0.1:43210", "k3y", "qwen2.5-coder", 32768, 8192)


@pytest.mark.fast
def test_claude_code_reads_the_server_the_model_and_its_limits_from_its_environment() -> None:
    setup = setup_for(AGENTS["claude"], AT)
    assert setup.args == ()
    assert setup.unset == ("ANTHROPIC_API_KEY",)  # with both, Claude Code asks which key to use
    env = setup.env
    assert (env["ANTHROPIC_BASE_URL"], env["ANTHROPIC_AUTH_TOKEN"]) == ("http://127.0.0.1:43210", "k3y")
    tiers = ["ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL"]
    tiers += ["ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL"]
    assert {env[name] for name in tiers} == {"qwen2.5-coder"}  # side requests on the same model
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "32768"
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "8192"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"


@pytest.mark.fast
def test_codex_gets_a_responses_provider_as_config_overrides_on_its_command_line() -> None:
    """`-c key=value` pairs, each value TOML as Codex parses it: no config.toml read or written."""
    setup = setup_for(AGENTS["codex"], AT)
    assert setup.env == {AGENT_KEY_ENV: "k3y"} and setup.unset == ()
    flags, pairs = setup.args[::2], setup.args[1::2]
    assert set(flags) == {"-c"}
    tomllib = pytest.importorskip("tomllib")  # Python 3.11's
    config = {}
    for pair in pairs:
        key, value = pair.split("=", 1)
        config[key] = tomllib.loads(f"v = {value}")["v"]
    assert config == {
        "model_provider": "runner",
        "model_providers.runner": {
            "name": "runner",
            "base_url": "http://127.0.0.1:43210/v1",
            "env_key": AGENT_KEY_ENV,
            "wire_api": "responses",
        },
        "model": "qwen2.5-coder",
        "model_context_window": 32768,
    }


@pytest.mark.fast
def test_opencode_gets_a_provider_in_its_config_variable_with_the_models_limits() -> None:
    setup = setup_for(AGENTS["opencode"], AT)
    assert setup.args == () and set(setup.env) == {"OPENCODE_CONFIG_CONTENT"}
    config = json.loads(setup.env["OPENCODE_CONFIG_CONTENT"])
    provider = config["provider"]["runner"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": "http://127.0.0.1:43210/v1", "apiKey": "k3y"}
    assert provider["models"]["qwen2.5-coder"]["limit"] == {"context": 32768, "output": 8192}
    assert config["model"] == config["small_model"] == "runner/qwen2.5-coder"  # titles on the same model


@pytest.mark.fast
def test_the_context_an_agent_needs_holds_its_first_request_and_a_turn() -> None:
    for agent in AGENTS.values():
        need = needed_context(agent)
        assert need % 1024 == 0 and agent.first_prompt + 4096 <= need < agent.first_prompt + 4096 + 1024
        assert output_limit(need, agent) == need - agent.first_prompt  # the room left, under 8,192
    assert output_limit(200_000, AGENTS["claude"]) == 8192
    assert needed_context(AGENTS["claude"]) > 20_000  # Claude Code's first request alone is ~20,000


@pytest.mark.fast
def test_the_agents_arguments_are_those_after_the_double_dash() -> None:
    from runner.cli.launch import _split

    assert _split("-p", ["hi"], ["launch", "claude", "--", "-p", "hi"]) == (None, ["-p", "hi"])
    assert _split("m", ["-p", "hi"], ["launch", "claude", "m", "--", "-p", "hi"]) == ("m", ["-p", "hi"])
    assert _split("m", [], ["launch", "claude", "m"]) == ("m", [])


def test_launch_refuses_a_context_the_agent_cannot_work_in_with_the_numbers(smollm2_path: Path) -> None:
    """SmolLM2 was trained on 8,192 tokens: Claude Code's first request alone is ~20,000."""
    model = str(smollm2_path)
    need = needed_context(AGENTS["claude"])
    got = run_cli("launch", "claude", model, "--print")
    assert got.returncode == 2 and got.stdout == b""
    said = got.stderr.decode()
    assert "trained on a context of 8,192 tokens" in said and f"--ctx {need}" in said, said
    got = run_cli("launch", "claude", model, "--ctx", "8192", "--print")
    assert got.returncode == 2 and "--ctx 8,192 is too small" in got.stderr.decode()
    assert f"give --ctx {need}" in got.stderr.decode()
    got = run_cli("launch", "opencode", model, "--ctx", "40000000", "--print")  # the memory planner's say
    said = got.stderr.decode()
    assert got.returncode == 2 and "does not fit this machine's memory" in said and "fits" in said, said


def test_launch_print_gives_the_two_commands(smollm2_path: Path) -> None:
    need = needed_context(AGENTS["codex"])
    got = run_cli("launch", "codex", str(smollm2_path), "--ctx", str(need), "--print", "--", "exec", "hi")
    assert got.returncode == 0, got.stderr
    serve, agent = got.stdout.decode().splitlines()
    assert serve.startswith(f"runner serve {smollm2_path} --port 8080 --api-key ")
    assert serve.endswith(f"--parallel 2 --ctx {need}")
    key = serve.split("--api-key ")[1].split()[0]
    assert agent.startswith(f"env {AGENT_KEY_ENV}={key} codex -c ") and agent.endswith(" exec hi")
    assert f"model_context_window={need}" in agent and "'model=\"SmolLM2-135M-Instruct.Q4_1\"'" in agent


@pytest.mark.fast
def test_an_agent_not_installed_is_one_line_saying_how_to_install_it(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    import runner.cli  # noqa: F401  (the commands registered)
    from runner.cli.app import app

    env = {"PATH": str(tmp_path)}  # nothing there
    for name, agent in AGENTS.items():
        got = CliRunner().invoke(app, ["launch", name, "smollm2"], env=env)
        assert got.exit_code == 2 and got.stdout == ""
        assert got.stderr.strip() == f"runner: error: {agent.binary} is not installed: {agent.install}"
    got = CliRunner().invoke(app, ["launch", "aider"], env=env)
    assert got.exit_code == 2 and "not an agent runner launches: claude, codex, opencode" in got.stderr


STAND_IN = """#!{python}
import json, os, sys, urllib.request
config = json.loads(os.environ["OPENCODE_CONFIG_CONTENT"])
provider = config["provider"]["runner"]
model = config["model"].split("/", 1)[1]
body = {{"model": model, "messages": [{{"role": "user", "content": "Hi"}}], "max_tokens": 4}}
request = urllib.request.Request(
    provider["options"]["baseURL"] + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={{"Authorization": "Bearer " + provider["options"]["apiKey"]}},
)
answer = json.load(urllib.request.urlopen(request))
limit = provider["models"][model]["limit"]
json.dump({{"argv": sys.argv[1:], "answer": answer, "limit": limit, "url": provider["options"]["baseURL"]}},
          open(os.environ["STAND_IN_OUT"], "w"))
sys.exit(3)
"""


def test_launch_serves_the_agent_runs_it_then_stops_the_server(
    tmp_path: Path, scripted_agent_model: Path
) -> None:
    """A stand-in `opencode` on PATH calls the server with what it was told; its exit code is
    launch's, and the server is gone once it exits."""
    import httpx

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "opencode"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out.json"
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "STAND_IN_OUT": str(out)}
    got = run_cli("launch", "opencode", str(scripted_agent_model), "--", "run", "hi", env=env, timeout=300)
    assert got.returncode == 3, got.stderr
    seen = json.loads(out.read_text())
    assert seen["argv"] == ["run", "hi"]
    assert (
        seen["answer"]["object"] == "chat.completion" and seen["answer"]["model"] == scripted_agent_model.stem
    )
    # the model's trained 32,768 tokens (within 65,536), told to the agent as they are served
    assert seen["limit"] == {"context": 32768, "output": 8192}
    with pytest.raises(httpx.TransportError):
        httpx.get(seen["url"].removesuffix("/v1") + "/health", timeout=2)


def test_ctrl_c_is_the_agents_and_launch_then_stops_the_server(
    tmp_path: Path, scripted_agent_model: Path
) -> None:
    """Ctrl-C on the terminal (SIGINT to the foreground group) ends the agent as it would end it in a
    shell; launch exits as the agent did (130), and the server, in a session of its own, is stopped."""
    import signal
    import subprocess

    import httpx

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "opencode"
    stand_in.write_text(  # Python handles SIGINT unless it starts with it ignored: then it would sleep on
        f"#!{sys.executable}\nimport sys, time\nprint('agent up', file=sys.stderr, flush=True)\n"
        "try:\n    time.sleep(120)\nexcept KeyboardInterrupt:\n    sys.exit(130)\n"
    )
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    command = [sys.executable, "-m", "runner", "launch", "opencode", str(scripted_agent_model)]
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, start_new_session=True)
    assert proc.stderr is not None
    said = b""
    while b"agent up" not in said:
        line = proc.stderr.readline()
        assert line, said
        said += line
    url = said.decode().split(" · ")[-1].split()[0]  # "runner: opencode on M · context N a sequence · URL"
    os.killpg(proc.pid, signal.SIGINT)
    try:
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:  # SIGTERM: launch ends the agent and stops the server as it exits
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    with pytest.raises(httpx.TransportError):  # launch waited for the server to end before it exited
        httpx.get(f"{url}/health", timeout=2)


@pytest.fixture(scope="module")
def scripted_agent_model(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-layer scripted model on SmolLM2's tokenizer with a 32,768-token trained context: tiny KV
    cache, answers in milliseconds."""
    from tests.synth import set_context_length, write_scripted

    path = tmp_path_factory.mktemp("launch") / "scripted.gguf"
    write_scripted(
        path, smollm2_path, [28, 29, 2], template="{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    return set_context_length(path, 32768)
