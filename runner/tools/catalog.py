"""The tools the model sees: one name each across every server, and their on/off state.

A tool keeps its own name where no other server's tool has it (and it is a name an OpenAI-style
function may have: letters, digits, `_` and `-`, at most 64); otherwise it is `SERVER_NAME`, the
server's name before it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
EMPTY_SCHEMA: Mapping[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    """One tool: `name` is what the model calls, `original` what its server calls it."""

    server: str
    name: str
    original: str
    description: str
    schema: Mapping[str, Any] = field(hash=False)  # its JSON Schema (inputSchema)

    def openai(self) -> dict[str, Any]:
        """The tool as an OpenAI-style function, the shape chat templates and the engine read."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.schema) or dict(EMPTY_SCHEMA),
            },
        }


@dataclass
class ServerState:
    """A server for `/tools`: `state` is "ready", "failed: why", "crashed" (restarted at its next
    call), "off" or "not started"; `tools` its tools as the model names them, each on or off."""

    name: str
    transport: str
    where: str  # the command line or the URL
    state: str
    tools: list[tuple[str, bool]] = field(default_factory=list)
    resources: list[str] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)
    log: Path | None = None  # a stdio server's stderr
    ready_s: float | None = None  # from launch() to its tools listed, for its first start


def name_tools(listed: Iterable[tuple[str, Any]]) -> list[Tool]:
    """(server name, the SDK's Tool) pairs, in the servers' order -> Tools with unique names."""
    pairs = list(listed)
    counts = Counter(tool.name for _, tool in pairs)
    taken: set[str] = set()
    named: list[Tool] = []
    for server, tool in pairs:
        own = tool.name
        name = own if counts[own] == 1 and FUNCTION_NAME.fullmatch(own) else _prefixed(server, own)
        name = _unique(name, taken)
        taken.add(name)
        named.append(
            Tool(
                server=server,
                name=name,
                original=own,
                description=tool.description or "",
                schema=dict(tool.input_schema or {}),
            )
        )
    return named


def _prefixed(server: str, tool: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}_{tool}")
    return name[:64]


def _unique(name: str, taken: set[str]) -> str:
    """The name, or the name with _2, _3 ... where taken (two servers whose prefixed names meet)."""
    if name not in taken:
        return name
    n = 2
    while f"{name[:60]}_{n}" in taken:
        n += 1
    return f"{name[:60]}_{n}"
