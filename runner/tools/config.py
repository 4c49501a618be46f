"""The `mcpServers` file: which MCP servers to start, and how to reach them.

The same JSON that Claude Desktop, Cursor, LM Studio and llama-server read, so one file serves them
all:

    {"mcpServers": {"NAME": {"command": "...", "args": [...], "env": {...}, "cwd": "..."},
                    "NAME": {"url": "https://...", "headers": {...}}}}

VS Code's `{"servers": {...}}` is read too, and so is each server's `"type"` (`stdio`, `http`,
`streamable-http`, `sse`). Keys runner does not use (`disabled`, `autoApprove`, VS Code's `inputs`)
are other programs' and are left alone. Several files merge; a server named again in a later file
replaces the earlier one, and `ServerConfig.replaced` says so, so that the host can say it.

Pure JSON and file reading: nothing here imports the SDK.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from runner.errors import UsageError
from runner.paths import config_dir

CONFIG_NAME = "mcp.json"
TRANSPORTS = {"stdio": "stdio", "http": "http", "streamable-http": "http", "sse": "sse"}
REMOTE_SCHEMES = ("http://", "https://")


@dataclass(frozen=True)
class ServerConfig:
    """One server as a config file names it. `transport` is "stdio", "http" (Streamable HTTP, with
    SSE as the fallback for a server that offers only that) or "sse"."""

    name: str
    source: Path
    transport: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    replaced: tuple[Path, ...] = ()  # earlier files that named a server of the same name

    def where(self) -> str:
        """What it runs or reaches, for a listing: the command line, or the URL."""
        if self.transport == "stdio":
            return " ".join([self.command or "", *self.args])
        return self.url or ""


def default_config() -> Path:
    """`mcp.json` in runner's config folder ($RUNNER_HOME, else ~/.config/runner)."""
    return config_dir() / CONFIG_NAME


def configs(given: Sequence[Path]) -> list[Path]:
    """The files to read: the default one where it exists, then those given (each once)."""
    found = [default_config()] if default_config().is_file() else []
    for path in given:
        if not any(_same(path, seen) for seen in found):
            found.append(path)
    return found


def load_config(paths: Sequence[Path]) -> list[ServerConfig]:
    """Every server the files name, in order; a later file's server replaces an earlier one's of the
    same name (in the earlier one's place). A file that cannot be read is a UsageError naming it."""
    merged: dict[str, ServerConfig] = {}
    for path in paths:
        for server in read_file(path):
            before = merged.get(server.name)
            if before is not None:
                server = replace(server, replaced=(*before.replaced, before.source))
            merged[server.name] = server
    return list(merged.values())


def read_file(path: Path) -> list[ServerConfig]:
    """One file's servers."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such MCP config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    if not isinstance(data, dict):
        raise UsageError(f'{path}: expected an object with "mcpServers", got {_kind(data)}')
    key = "mcpServers" if "mcpServers" in data else "servers"
    servers = data.get(key)
    if servers is None:
        raise UsageError(f'{path}: no "mcpServers" in it (expected {{"mcpServers": {{"NAME": {{...}}}}}})')
    if not isinstance(servers, dict):
        raise UsageError(f'{path}: "{key}" should be an object of servers by name, not {_kind(servers)}')
    return [_server(path, str(name), entry) for name, entry in servers.items()]


def _server(path: Path, name: str, entry: Any) -> ServerConfig:
    where = f'{path}: server "{name}"'
    if not name.strip():
        raise UsageError(f"{path}: a server with an empty name")
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: should be an object, not {_kind(entry)}")
    transport = _transport(where, entry)
    if transport == "stdio":
        cwd = _text(where, entry, "cwd")
        return ServerConfig(
            name=name,
            source=path,
            transport=transport,
            command=_text(where, entry, "command"),
            args=tuple(_texts(where, entry, "args")),
            env=_table(where, entry, "env"),
            cwd=(path.parent / Path(cwd).expanduser()) if cwd else None,
        )
    url = _text(where, entry, "url") or ""
    if not url.startswith(REMOTE_SCHEMES):
        raise UsageError(f'{where}: "url" should start with http:// or https://, not {url!r}')
    return ServerConfig(
        name=name, source=path, transport=transport, url=url, headers=_table(where, entry, "headers")
    )


def _transport(where: str, entry: dict[str, Any]) -> str:
    """stdio, http or sse: the "type" where given (and checked against what else is there), else
    whichever of "command" and "url" the entry has."""
    kind = entry.get("type")
    has_command, has_url = "command" in entry, "url" in entry
    if kind is not None:
        if kind not in TRANSPORTS:
            raise UsageError(f'{where}: "type" should be one of {", ".join(TRANSPORTS)}, not {kind!r}')
        transport = TRANSPORTS[kind]
        needed = "command" if transport == "stdio" else "url"
        if needed not in entry:
            raise UsageError(f'{where}: "type": "{kind}" needs a "{needed}"')
        return transport
    if has_command and has_url:
        raise UsageError(f'{where}: has both "command" and "url"; give one, or a "type"')
    if not (has_command or has_url):
        raise UsageError(f'{where}: has neither "command" (a local server) nor "url" (a remote one)')
    return "stdio" if has_command else "http"


def _text(where: str, entry: dict[str, Any], key: str) -> str | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise UsageError(f'{where}: "{key}" should be a string, not {_kind(value)}')
    if key in ("command", "url") and not value.strip():
        raise UsageError(f'{where}: "{key}" is empty')
    return value


def _texts(where: str, entry: dict[str, Any], key: str) -> list[str]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise UsageError(f'{where}: "{key}" should be a list of strings, not {_kind(value)}')
    return value


def _table(where: str, entry: dict[str, Any], key: str) -> dict[str, str]:
    value = entry.get(key, {})
    if not isinstance(value, dict):
        raise UsageError(f'{where}: "{key}" should be an object of strings, not {_kind(value)}')
    wrong = [name for name, item in value.items() if not isinstance(item, str)]
    if wrong:
        raise UsageError(
            f'{where}: "{key}" values should be strings; "{wrong[0]}" is {_kind(value[wrong[0]])}'
        )
    return dict(value)


def _kind(value: Any) -> str:
    """A JSON value's kind, as a user would say it."""
    if value is None:
        return "null"
    names = {bool: "true/false", int: "a number", float: "a number", str: "a string", list: "a list"}
    return names.get(type(value), "an object")


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b
