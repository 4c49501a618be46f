"""The coding agents' real traffic: the first request each agent sent, captured once from the real
agent (tests/data/agents/*.json, its version inside; docs/agents.md says how), replayed through the
real `anthropic` and `openai` clients.

Three tiers: in process over the stand-in backend (every field accepted or ignored as the API allows,
the streamed events parsed by the SDKs' own stream readers, a tool call round-tripped, start-up
probes); against `runner serve` with SmolLM2 (the bodies with their long texts shortened, every field
kept, a few tokens answered); and each agent itself, headless, against `runner launch` with a scripted
model that calls the agent's file-writing tool, then says it is done (skipped where the agent is not
installed: scripts/get_agents.sh, which the test command runs, puts them in the test cache)."""

from __future__ import annotations

import inspect
import json
import os
import platform
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from starlette.testclient import TestClient

from runner.serve.app import create_app
from tests.conftest import TEST_HOME, run_cli
from tests.serving import THREADS, StandIn, outcome_of, serving

DATA = Path(__file__).parent / "data" / "agents"
platform.processor()  # `uname -p` run once, as the module loads: the openai SDK's headers ask it in a test


def captured(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text())


def split(create: Any, body: dict[str, Any]) -> dict[str, Any]:
    """A captured body as an SDK method's keywords: the fields it names as parameters, the rest (what
    this SDK version does not know yet) in extra_body, as an agent built on it sends them."""
    known = set(inspect.signature(create).parameters)
    kwargs = {k: v for k, v in body.items() if k in known}
    extra = {k: v for k, v in body.items() if k not in known}
    return {**kwargs, "extra_body": extra} if extra else kwargs


# -- in process: every field, the SDKs' stream readers, a tool call round-tripped ----------------------

WRITE = {"name": "Write", "arguments": {"file_path": "/tmp/x/hello.txt", "content": "hi"}}


@pytest.fixture
def backend() -> StandIn:
    return StandIn(too_long=10**9)


@pytest.fixture
def http(backend: StandIn) -> Iterator[TestClient]:
    with TestClient(create_app(backend, log=lambda _: None)) as client:
        yield client


@pytest.mark.fast
def test_claude_codes_request_is_answered_and_its_tool_call_comes_back(
    http: TestClient, backend: StandIn
) -> None:
    """Claude Code's first request (cache_control, metadata, thinking adaptive, context_management,
    output_config, its anthropic-beta header), streamed through the SDK's reader; the call the model
    makes comes back a tool_use block, and the agent's next request with its result is read."""
    seen = captured("claude-code")
    client = anthropic.Anthropic(base_url="http://testserver", api_key="k", max_retries=0, http_client=http)
    body = {k: v for k, v in seen["body"].items() if k != "stream"}
    backend.outcome = outcome_of(
        "", "tool_calls", prompt_tokens=20_000, completion_tokens=9, tool_calls=(WRITE,)
    )
    backend.parts = []
    headers = {"anthropic-beta": seen["headers"]["anthropic-beta"]}
    with client.messages.stream(**split(client.messages.create, body), extra_headers=headers) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "tool_use"
    [call] = [block for block in message.content if block.type == "tool_use"]
    assert (call.name, call.input) == ("Write", WRITE["arguments"])
    assert {tool["function"]["name"] for tool in backend.asks[0].tools or []} >= {"Write", "Bash", "Read"}
    after = [
        {"role": "assistant", "content": [block.model_dump() for block in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Done."}]},
    ]
    backend.outcome, backend.parts = outcome_of("Written.", prompt_tokens=5), [("answer", "Written.")]
    again = client.messages.create(
        **split(client.messages.create, {**body, "messages": body["messages"] + after})
    )
    assert [block.text for block in again.content if block.type == "text"] == ["Written."]
    tool_turn = backend.asks[-1].messages[-1]
    assert (tool_turn["role"], tool_turn["content"]) == ("tool", "Done.")


@pytest.mark.fast
def test_a_picture_claude_code_read_goes_to_the_model_as_a_note(http: TestClient, backend: StandIn) -> None:
    """A tool_result holding an image (Claude Code's Read of a PNG) or a document is named in the
    tool message's text, not a 400 that would end the session."""
    picture = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    read = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/tmp/a.png"}}
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "a.png"}, picture],
    }
    messages = [
        {"role": "user", "content": "What is in a.png?"},
        {"role": "assistant", "content": [read]},
        {"role": "user", "content": [result]},
    ]
    tools = [{"name": "Read", "input_schema": {"type": "object"}}]
    got = http.post(
        "/v1/messages", json={"model": "smollm2", "max_tokens": 5, "messages": messages, "tools": tools}
    )
    assert got.status_code == 200, got.text
    tool_turn = backend.asks[-1].messages[-1]
    assert tool_turn["role"] == "tool"
    assert tool_turn["content"] == "a.png\n[the tool returned image content, not shown to the model]"


@pytest.mark.fast
def test_codexs_request_is_answered_its_hosted_tools_left_out(
    http: TestClient, backend: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    """Codex's first request: store false, include ["reasoning.encrypted_content"] (a 400 before),
    reasoning.summary, prompt_cache_key, client_metadata; its web_search and namespace tools are left
    out (said once on stderr), its functions served. The SDK's stream reader takes the events, and
    the call comes back a function_call item, answered by a function_call_output."""
    seen = captured("codex")
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="k", max_retries=0, http_client=http)
    body = {k: v for k, v in seen["body"].items() if k != "stream"}
    call = {"name": "exec_command", "arguments": {"cmd": "echo hi > hello.txt"}}
    backend.outcome = outcome_of(
        "", "tool_calls", prompt_tokens=6_357, completion_tokens=9, tool_calls=(call,)
    )
    backend.parts = []
    with client.responses.stream(**split(client.responses.stream, body)) as stream:
        response = stream.get_final_response()
    assert response.status == "completed"
    [item] = [item for item in response.output if item.type == "function_call"]
    assert (item.name, json.loads(item.arguments)) == (call["name"], call["arguments"])
    served = [tool["function"]["name"] for tool in backend.asks[0].tools or []]
    assert "exec_command" in served and "multi_agent_v1" not in served and len(served) == 7
    said = capsys.readouterr().err
    assert '"web_search" tool is left out' in said and '"namespace" tool "multi_agent_v1" is left out' in said
    after = [
        item.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": item.call_id, "output": "ok"},
    ]
    backend.outcome, backend.parts = outcome_of("Written.", prompt_tokens=5), [("answer", "Written.")]
    again = client.responses.create(
        **{**split(client.responses.create, body), "input": body["input"] + after}
    )
    assert again.output_text == "Written."
    assert backend.asks[-1].messages[-1] == {
        "role": "tool",
        "tool_call_id": item.call_id,
        "name": "exec_command",
        "content": "ok",
    }
    refused = http.post("/v1/responses", json={**body, "include": ["message.output_text.logprobs"]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "include"


@pytest.mark.fast
@pytest.mark.parametrize("name", ["opencode", "opencode-title"])
def test_opencodes_requests_are_answered(http: TestClient, backend: StandIn, name: str) -> None:
    """opencode's main request (tools, stream_options) and the title request it sends beside it."""
    body = {k: v for k, v in captured(name)["body"].items() if k != "stream"}
    client = openai.OpenAI(base_url="http://testserver/v1", api_key="k", max_retries=0, http_client=http)
    chunks = list(client.chat.completions.create(**split(client.chat.completions.create, body), stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 5  # include_usage


@pytest.mark.fast
def test_the_agents_start_up_probes_are_answered(http: TestClient) -> None:
    assert http.head("/").status_code == 200 and http.get("/").status_code == 200  # Claude Code: HEAD /
    models = http.get("/v1/models")
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "smollm2"


# -- against runner serve with SmolLM2: the bodies shortened, every field kept --------------------------

SHORT = 60  # characters a text keeps
TOOLS_EACH = 2  # tools kept of each type


def shortened(body: dict[str, Any]) -> dict[str, Any]:
    """The body with its tools cut to TOOLS_EACH of each type (function, namespace, web_search ...)
    and every string to SHORT characters, every field kept: a few thousand tokens at most instead of
    20,000 (a busy 2-core machine prefills SmolLM2 at ~100 tokens a second)."""
    kept: dict[str, int] = {}
    tools = []
    for tool in body.get("tools", []):
        kind = str(tool.get("type", "custom"))
        kept[kind] = kept.get(kind, 0) + 1
        if kept[kind] <= TOOLS_EACH:
            tools.append(tool)
    return cut({**body, "tools": tools} if "tools" in body else body)


def cut(value: Any) -> Any:
    if isinstance(value, str):
        return value[:SHORT]
    if isinstance(value, list):
        return [cut(v) for v in value]
    if isinstance(value, dict):
        return {k: cut(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    log = tmp_path_factory.mktemp("agents") / "stderr"
    with serving([str(smollm2_path), "--ctx", "8192", "--parallel", "2", *THREADS], log) as running:
        running.model = smollm2_path.stem  # type: ignore[attr-defined]  (a file is served by its name)
        yield running


def test_each_agents_request_gets_an_answer_from_the_model(server: Any) -> None:
    claude = shortened(captured("claude-code")["body"]) | {"max_tokens": 4, "model": server.model}
    client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
    body = {k: v for k, v in claude.items() if k != "stream"}
    beta = {"anthropic-beta": captured("claude-code")["headers"]["anthropic-beta"]}
    with client.messages.stream(**split(client.messages.create, body), extra_headers=beta) as stream:
        message = stream.get_final_message()
    assert message.stop_reason in ("max_tokens", "end_turn", "tool_use") and message.usage.input_tokens > 500

    codex = shortened(captured("codex")["body"]) | {"max_output_tokens": 4, "model": server.model}
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="k", max_retries=0)
    body = {k: v for k, v in codex.items() if k != "stream"}
    events = list(oai.responses.create(**split(oai.responses.create, body), stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    last = events[-1].response  # Codex sends no temperature: a sampled answer may end before its 4 tokens
    if kinds[-1] == "response.completed":
        assert last.usage is not None and last.usage.output_tokens < 4, last
    else:
        assert kinds[-1] == "response.incomplete" and last.incomplete_details.reason == "max_output_tokens"
    # (the SDK's responses.stream() helper ends only at response.completed, not at an incomplete)

    for name in ("opencode", "opencode-title"):
        chat = shortened(captured(name)["body"]) | {"max_tokens": 4, "model": server.model}
        body = {k: v for k, v in chat.items() if k != "stream"}
        chunks = list(oai.chat.completions.create(**split(oai.chat.completions.create, body), stream=True))
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 4
        assert chunks[-2].choices[0].finish_reason in ("length", "stop", "tool_calls")


# -- each agent, headless, against runner launch ---------------------------------------------------------

AGENTS = {  # agent -> (its file-writing tool and arguments, its headless command line)
    "claude": (
        "Write",
        {"file_path": "{out}", "content": "hi"},
        ["-p", "Write hello.txt", "--allowedTools", "Write"],
    ),
    "codex": (
        "exec_command",
        {"cmd": "echo hi > {out}"},
        ["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "Write hello.txt"],
    ),
    "opencode": ("write", {"filePath": "{out}", "content": "hi"}, ["run", "Write hello.txt"]),
}
GO, DONE, END, CALL, FINAL = (
    685,
    2294,
    2,
    49001,
    49150,
)  # SmolLM2's " go", " done", <|im_end|>, two rare tokens
# the generation prompt ends " go" for a new question, " done" after a tool's result: the scripted
# model's answer depends on the last token only (tests/synth.py: write_scripted)
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content if m.content is string else '' }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if messages[-1].role == 'tool' %} done{% else %} go{% endif %}{% endif %}"
)


def byte_level(text: str) -> str:
    """A token's text as a byte-level BPE vocabulary (GPT-2's, SmolLM2's) spells it."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in keep]
    table = {b: chr(b) for b in keep} | {b: chr(256 + i) for i, b in enumerate(moved)}
    return "".join(table[b] for b in text.encode())


def writer(smollm2_path: Path, path: Path, tool: str, arguments: dict[str, Any]) -> Path:
    """A scripted model that answers a question with one call of `tool` (runner's generic call format:
    the answer is the call's JSON) and a tool's result with "The file is written."; its two answers are
    two of SmolLM2's rare tokens rewritten. Trained context 32,768: an agent's prompt fits."""
    from tests.synth import set_context_length, write_scripted

    call = json.dumps({"name": tool, "arguments": arguments})
    edits = {CALL: byte_level(call), FINAL: byte_level("The file is written.")}
    write_scripted(path, smollm2_path, [GO, CALL, END, DONE, FINAL, END], edits=edits, template=TEMPLATE)
    return set_context_length(path, 32768)


@pytest.mark.parametrize("agent", list(AGENTS))
def test_the_agent_writes_the_file_it_was_asked_to_through_runner_launch(
    agent: str, smollm2_path: Path, tmp_path: Path
) -> None:
    path = (
        f"{os.environ.get('PATH', '')}{os.pathsep}{TEST_HOME / 'agents' / 'bin'}"  # scripts/get_agents.sh's
    )
    if shutil.which(agent, path=path) is None:
        pytest.skip(f"{agent} is not installed (scripts/get_agents.sh, or npm install -g: docs/agents.md)")
    tool, arguments, argv = AGENTS[agent]
    out = tmp_path / "work" / "hello.txt"
    out.parent.mkdir()
    filled = json.loads(json.dumps(arguments).replace("{out}", str(out)))
    model = writer(smollm2_path, tmp_path / f"writer-{agent}.gguf", tool, filled)
    home = tmp_path / "home"  # the agents' own settings, sessions and caches: not the user's
    env = {
        "PATH": path,
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "XDG_CONFIG_HOME": str(home / ".config"),
    }
    env |= {"XDG_DATA_HOME": str(home / ".local/share"), "XDG_CACHE_HOME": str(home / ".cache")}
    env["PWD"] = str(out.parent)  # opencode takes its project folder from $PWD
    (home / ".codex").mkdir(parents=True)
    cwd = os.getcwd()
    os.chdir(out.parent)
    try:
        got = run_cli("launch", agent, str(model), "--", *argv, env=env, timeout=600)
    finally:
        os.chdir(cwd)
    said = got.stdout.decode() + got.stderr.decode()
    assert got.returncode == 0, said
    assert out.exists() and out.read_text().strip() == "hi", said
    assert "The file is written." in got.stdout.decode(), said
