"""runner/tools without a server: the `mcpServers` file read and refused, the tools' names, and a
call's result bounded (tests/test_mcp_host.py runs real servers)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import mcp_types
import pytest

from runner.errors import UsageError
from runner.tools import configs, default_config, load_config
from runner.tools.catalog import name_tools
from runner.tools.result import Limits, cut, from_call

pytestmark = pytest.mark.fast


def write(folder: Path, data: object, name: str = "mcp.json") -> Path:
    path = folder / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_claude_desktop_and_remote_servers(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "mcpServers": {
                "files": {
                    "command": "npx",
                    "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
                    "env": {"DEBUG": "1"},
                    "cwd": "servers",
                    "autoApprove": ["read_file"],  # another program's key: left alone
                },
                "web": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}},
                "old": {"type": "sse", "url": "http://127.0.0.1:8000/sse"},
                "new": {"type": "streamable-http", "url": "http://127.0.0.1:8000/mcp"},
            }
        },
    )
    files, web, old, new = load_config([path])
    assert (files.name, files.transport, files.command) == ("files", "stdio", "npx")
    assert files.args == ("-y", "@modelcontextprotocol/server-filesystem", "/tmp")
    assert files.env == {"DEBUG": "1"} and files.cwd == tmp_path / "servers" and files.source == path
    assert files.where() == "npx -y @modelcontextprotocol/server-filesystem /tmp"
    assert (web.transport, web.url, web.headers) == (
        "http",
        "https://example.com/mcp",
        {"Authorization": "Bearer x"},
    )
    assert (old.transport, new.transport) == ("sse", "http")
    assert web.command is None and files.url is None


def test_vs_code_servers_key_and_type(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {"inputs": [], "servers": {"git": {"type": "stdio", "command": "uvx", "args": ["mcp-server-git"]}}},
    )
    (git,) = load_config([path])
    assert (git.name, git.transport, git.command, git.args) == ("git", "stdio", "uvx", ("mcp-server-git",))


def test_files_merge_and_a_later_name_wins(tmp_path: Path) -> None:
    first = write(tmp_path, {"mcpServers": {"a": {"command": "one"}, "b": {"command": "b"}}}, "first.json")
    second = write(
        tmp_path, {"mcpServers": {"a": {"url": "http://h/mcp"}, "c": {"command": "c"}}}, "second.json"
    )
    a, b, c = load_config([first, second])
    assert [a.name, b.name, c.name] == ["a", "b", "c"]  # the replaced one keeps its place
    assert (a.transport, a.url, a.source, a.replaced) == ("http", "http://h/mcp", second, (first,))
    assert b.replaced == () and c.source == second


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            '{"mcpServers": {"a": {"command": "x",}}}',
            "not JSON: Expecting property name enclosed in double quotes at line 1, column 38",
        ),
        (
            '{"mcpServers": {\n "a": {"args": []}}}',
            'server "a": has neither "command" (a local server) nor "url" (a remote one)',
        ),
        (
            '{"mcpServers": {"a": {"command": "x", "args": "-y"}}}',
            'server "a": "args" should be a list of strings, not a string',
        ),
        (
            '{"mcpServers": {"a": {"command": "x", "env": {"N": 1}}}}',
            'server "a": "env" values should be strings; "N" is a number',
        ),
        ('{"mcpServers": {"a": {"command": ["x"]}}}', 'server "a": "command" should be a string, not a list'),
        (
            '{"mcpServers": {"a": {"url": "ftp://h"}}}',
            'server "a": "url" should start with http:// or https://',
        ),
        (
            '{"mcpServers": {"a": {"command": "x", "url": "http://h"}}}',
            'server "a": has both "command" and "url"',
        ),
        (
            '{"mcpServers": {"a": {"type": "ws", "url": "http://h"}}}',
            'server "a": "type" should be one of stdio, http',
        ),
        ('{"mcpServers": {"a": {"type": "sse", "command": "x"}}}', 'server "a": "type": "sse" needs a "url"'),
        ('{"mcpServers": {"a": "npx x"}}', 'server "a": should be an object, not a string'),
        ('{"mcpServers": []}', '"mcpServers" should be an object of servers by name, not a list'),
        ('{"servers": null}', 'no "mcpServers" in it'),
        ("[]", 'expected an object with "mcpServers", got a list'),
    ],
)
def test_a_bad_file_is_a_usage_error_naming_it(tmp_path: Path, text: str, said: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as caught:
        load_config([path])
    assert str(caught.value).startswith(f"{path}: ") and said in str(caught.value), str(caught.value)


def test_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="absent.json: no such MCP config file"):
        load_config([tmp_path / "absent.json"])


def test_the_default_file_lives_in_runner_config_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNNER_HOME", str(tmp_path))
    given = write(tmp_path, {"mcpServers": {}}, "more.json")
    assert default_config() == tmp_path / "mcp.json"
    assert configs([given]) == [given]  # the default is read only where it exists
    write(tmp_path, {"mcpServers": {}})
    assert configs([given]) == [tmp_path / "mcp.json", given]
    assert configs([tmp_path / "mcp.json"]) == [tmp_path / "mcp.json"]  # once, even when named


def listed(server: str, *names: str) -> list[tuple[str, mcp_types.Tool]]:
    return [
        (server, mcp_types.Tool(name=n, description=f"{n}!", input_schema={"type": "object"})) for n in names
    ]


def test_a_tool_keeps_its_name_unless_another_server_has_it() -> None:
    tools = name_tools(
        listed("git", "status", "log") + listed("fs", "read", "log") + listed("web.search", "find it")
    )
    assert [(t.server, t.name, t.original) for t in tools] == [
        ("git", "status", "status"),
        ("git", "git_log", "log"),
        ("fs", "read", "read"),
        ("fs", "fs_log", "log"),
        ("web.search", "web_search_find_it", "find it"),  # a name a function may have
    ]
    assert tools[0].openai()["function"] == {
        "name": "status",
        "description": "status!",
        "parameters": {"type": "object"},
    }
    assert len(name_tools(listed("s", "x" * 80))[0].name) == 64


def test_prefixed_names_that_meet_get_a_number() -> None:
    tools = name_tools(listed("a_b", "c") + listed("a", "b_c") + listed("x", "c", "b_c"))
    assert [t.name for t in tools] == ["a_b_c", "a_b_c_2", "x_c", "x_b_c"]


def call_result(
    *content: object, is_error: bool = False, structured: object = None
) -> mcp_types.CallToolResult:
    return mcp_types.CallToolResult(content=list(content), is_error=is_error, structured_content=structured)


def text(value: str) -> mcp_types.TextContent:
    return mcp_types.TextContent(type="text", text=value)


def image(data: bytes, mime: str = "image/png") -> mcp_types.ImageContent:
    return mcp_types.ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=mime)


def test_text_is_cut_at_a_character_boundary_with_a_note() -> None:
    assert cut("héllo", 6) == ("héllo", False)
    assert cut("héllo", 2) == ("h\n[result cut at 2 B of 6 B]", True)  # é is two bytes: not split
    assert cut("€" * 1000, 1000)[0].startswith("€" * 333 + "\n[result cut at 1.0 KB of 3.0 KB]")


def test_a_result_keeps_text_and_images_within_limits() -> None:
    limits = Limits(text_bytes=10, images=2, image_bytes=100)
    done = from_call(
        call_result(text("one"), image(b"a" * 10), text("two"), image(b"b" * 500), image(b"c"), image(b"d")),
        limits,
        1.5,
    )
    assert done.images == [("image/png", b"a" * 10), ("image/png", b"c")]
    assert done.text.splitlines() == [
        "one",
        "two",
        "[image/png of 500 B left out: over 100 B]",
        "[image/png left out: at most 2 images are kept]",
    ]
    assert (done.is_error, done.truncated, done.seconds) == (False, False, 1.5)
    cut_short = from_call(call_result(text("0123456789abc"), is_error=True), limits, 0)
    assert cut_short.is_error and cut_short.truncated and cut_short.text.startswith("0123456789\n[result cut")


def test_structured_content_stands_in_for_missing_text() -> None:
    done = from_call(call_result(structured={"answer": "é"}), Limits(), 0)
    assert done.text == '{"answer": "é"}'
    bad = mcp_types.ImageContent(type="image", data="not base64!", mime_type="image/png")
    assert from_call(call_result(bad), Limits(), 0).text == "[image/png left out: its data is not base64]"
