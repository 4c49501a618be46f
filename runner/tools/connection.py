"""One MCP server, from the event loop's side: connect, list, call, disconnect.

Everything here runs on the host's event loop thread (runner/tools/host.py). The SDK's transports
are async context managers whose task groups must be left by the task that entered them, so each
connection has an owner task (`serve`) that connects, lists what the server offers, reports that
through a Future, and then holds the connection open until `stop`. Calls are other tasks on the same
loop, sharing the SDK client.

A stdio server's stderr goes to its own log file, never the terminal, and its environment is only
what the config names, over the SDK's short list of safe variables (PATH, HOME, USER, LOGNAME,
SHELL, TERM): nothing of runner's own (HF_TOKEN, RUNNER_*) reaches a server.

A stdio server's process is started before the SDK is imported (`_spawn`), exactly as the SDK's
`stdio_client` starts it (same command, environment, stderr, a session of its own), and then handed to
`stdio_client`, which runs the transport over it as over one it started: the SDK's import (~0.4 s of
CPU) overlaps the servers' own start instead of delaying it.
"""

from __future__ import annotations

import contextvars
import os
import sys
import time
from concurrent.futures import Future
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from runner.tools.config import ServerConfig

LOG_LIMIT = 10 * 1024 * 1024  # a log over this is emptied when its server next starts
LIST_PAGES = 50  # a server that pages without end is read this far
WHY_CHARS = 300  # the most of a server's last stderr line a warning quotes
# the SDK's DEFAULT_INHERITED_ENV_VARS on POSIX (mcp.client.stdio), for a server started before the
# SDK is imported; tests/test_mcp_host.py holds the two equal
SAFE_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")

_started: contextvars.ContextVar[Any] = contextvars.ContextVar("runner_mcp_started", default=None)


@dataclass
class Listing:
    """What a server offers: its tools (the SDK's Tool objects), resources' and prompts' names."""

    tools: list[Any] = field(default_factory=list)
    resources: list[str] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)


class Lost(Exception):
    """The connection to the server is gone: its process ended, or the remote stopped answering."""


class TimedOut(Exception):
    """The server did not answer a call in time; the SDK sent it notifications/cancelled. (Not
    TimeoutError: concurrent.futures raises that for a wait that ends before the work does.)"""


class Connection:
    """One server's connection, owned by the task running `serve`."""

    def __init__(self, config: ServerConfig, log_dir: Path) -> None:
        self.config = config
        self.log: Path | None = log_dir / f"mcp-{_file_name(config.name)}.log"
        if config.transport != "stdio":
            self.log = None
        self._client: Any = None
        self._stop: Any = None  # an anyio.Event, made on the loop
        self._log_start = 0  # where this run's stderr begins in the log
        self._started: tuple[Any, TextIO] | None = None  # spawn()'s process and log, for serve()
        self._spawn_failed: Exception | None = None

    async def serve(self, ready: Future[Listing]) -> None:
        """Connect, list, set `ready`, then hold the connection until `stop` (or a cancel)."""
        import anyio

        self._stop = anyio.Event()
        try:
            async with AsyncExitStack() as stack:
                client = await self._open(stack)
                listing = await _listing(client)
                self._client = client
                ready.set_result(listing)
                await self._stop.wait()
        except Exception as exc:  # the SDK raises groups and its own errors: one reason is kept
            if not ready.done():
                ready.set_exception(Lost(self.why(exc)))
        finally:
            self._client = None

    async def spawn(self) -> None:
        """Start a stdio server's process now, before the SDK is imported; the next `serve` connects
        over it. A failure to start is kept for `serve` to report."""
        if self.config.transport != "stdio" or sys.platform == "win32" or self._started is not None:
            return
        assert self.log is not None
        log = _open_log(self.log, self.config)
        self._log_start = log.tell()
        try:
            self._started = (await _spawn(self.config, log), log)
        except Exception as exc:
            log.close()
            self._spawn_failed = exc

    async def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def call(self, name: str, arguments: dict[str, Any], timeout: float, scope: Any) -> Any:
        """The server's CallToolResult, or None when `scope` was cancelled (Ctrl-C). Raises Lost
        when the connection is gone, TimedOut when the server took longer than `timeout` (the SDK
        sends notifications/cancelled then, and when the scope is cancelled)."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        if self._client is None:
            raise Lost("not connected")
        with scope:
            try:
                return await self._client.call_tool(name, arguments, read_timeout_seconds=timeout)
            except MCPError as exc:
                if exc.code == REQUEST_TIMEOUT:
                    raise TimedOut from None
                if exc.code == CONNECTION_CLOSED:
                    raise Lost(self.why(exc)) from None
                raise
            except OSError as exc:  # a remote server's connection refused or reset
                raise Lost(self.why(exc)) from None
        return None

    async def _open(self, stack: AsyncExitStack) -> Any:
        """The SDK client, connected and initialized (what `async with Client(...)` gives)."""
        if self.config.transport == "stdio":
            transport = await self._stdio(stack)  # its process started before the SDK's import
        from mcp import Client

        if self.config.transport == "stdio":
            return await stack.enter_async_context(Client(transport, cache=None))
        if self.config.transport == "sse":
            return await stack.enter_async_context(Client(self._sse(), cache=None))
        try:
            async with AsyncExitStack() as attempt:
                client = await attempt.enter_async_context(Client(await self._http(attempt), cache=None))
                stack.push_async_exit(attempt.pop_all())
                return client
        except Exception as first:  # a server that speaks only the old HTTP+SSE transport
            try:
                return await stack.enter_async_context(Client(self._sse(), cache=None))
            except Exception:
                raise first from None

    async def _stdio(self, stack: AsyncExitStack) -> Any:
        """The SDK's stdio transport over the server's process: the one `spawn` started, or (a
        restart) one started here."""
        config = self.config
        assert config.command is not None and self.log is not None
        failed, self._spawn_failed = self._spawn_failed, None
        if failed is not None:
            raise failed
        if self._started is None:  # a restart: started now
            await self.spawn()
            failed, self._spawn_failed = self._spawn_failed, None
            if failed is not None:
                raise failed
        started, self._started = self._started, None
        if started is not None:
            process, log = started
            stack.enter_context(log)
        else:  # Windows: the SDK starts it
            process, log = None, stack.enter_context(_open_log(self.log, config))
            self._log_start = log.tell()
        from mcp import StdioServerParameters, stdio_client

        _hand_over()
        _started.set(process)
        params = StdioServerParameters(
            command=config.command, args=list(config.args), env=dict(config.env), cwd=config.cwd
        )
        return stdio_client(params, errlog=log)

    async def _http(self, stack: AsyncExitStack) -> Any:
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        assert self.config.url is not None
        http = await stack.enter_async_context(create_mcp_http_client(headers=dict(self.config.headers)))
        return streamable_http_client(self.config.url, http_client=http)

    def _sse(self) -> Any:
        from mcp.client.sse import sse_client

        assert self.config.url is not None
        return sse_client(self.config.url, headers=dict(self.config.headers))

    def why(self, exc: BaseException) -> str:
        """One line for what went wrong: the innermost cause the SDK raised, and for a stdio server
        that ended, the last line it wrote to stderr this run."""
        cause = _innermost(exc)
        if isinstance(cause, FileNotFoundError) and self.config.transport == "stdio":
            return f"command not found: {self.config.command}"
        text = str(cause).strip() or type(cause).__name__
        if self.config.transport != "stdio" and self._client is None:  # while connecting
            text = f"{self.config.url}: {text}"
        if self.config.transport == "stdio" and text.lower() == "connection closed":
            said = self._last_said() if self._client is None else ""  # while starting: why it ended
            text = "its process ended" + (f" ({said})" if said else "")
        return text.splitlines()[0][:WHY_CHARS]

    def _last_said(self) -> str:
        """The last non-empty line the server wrote to stderr since this run began."""
        if self.log is None or not self.log.is_file():
            return ""
        with self.log.open("rb") as f:
            f.seek(max(self._log_start, f.seek(0, 2) - 4096))
            lines = [line.strip() for line in f.read().decode("utf-8", "replace").splitlines()]
        said = [line for line in lines if line]
        return said[-1][:WHY_CHARS] if said else ""


async def _listing(client: Any) -> Listing:
    """Tools (every page); resources and prompts where the server has them, their failure ignored."""
    tools: list[Any] = []
    cursor = None
    for _ in range(LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            break
    listing = Listing(tools=tools)
    capabilities = client.server_capabilities
    try:
        if capabilities.resources is not None:
            listing.resources = [r.name for r in (await client.list_resources()).resources]
        if capabilities.prompts is not None:
            listing.prompts = [p.name for p in (await client.list_prompts()).prompts]
    except Exception:  # a listing for /tools only: the tools are what matter
        pass
    return listing


def _open_log(path: Path, config: ServerConfig) -> TextIO:
    """The server's stderr log, appended to; emptied first when over LOG_LIMIT."""
    path.parent.mkdir(parents=True, exist_ok=True)
    big = path.is_file() and path.stat().st_size > LOG_LIMIT
    log = path.open("w" if big else "a", encoding="utf-8", errors="replace")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    log.write(f"--- {stamp} runner starts {config.name}: {config.where()}\n")
    log.flush()
    return log


async def _spawn(config: ServerConfig, log: TextIO) -> Any:
    """The server's process as the SDK's stdio_client starts it (mcp.client.stdio
    _create_platform_compatible_process): its command, the safe variables and the config's own
    environment, stderr to its log, a session of its own (so that a shutdown kills its whole tree)."""
    import anyio

    assert config.command is not None
    env = {name: value for name in SAFE_ENV if (value := os.environ.get(name)) is not None}
    env = {name: value for name, value in env.items() if not value.startswith("()")} | dict(config.env)
    return await anyio.open_process(
        [config.command, *config.args], env=env, stderr=log, cwd=config.cwd, start_new_session=True
    )


def _hand_over() -> None:
    """Make the SDK's stdio_client take the process this task started (`_started`) where it would
    start one: its process factory, wrapped once. A task that started none (a restart after the
    SDK's import, Windows) gets the SDK's own."""
    from mcp.client import stdio

    create = stdio._create_platform_compatible_process
    if getattr(create, "runner_hand_over", False):
        return

    async def started_or_start(*args: Any, **kwargs: Any) -> Any:
        process = _started.get()
        if process is None:
            return await create(*args, **kwargs)
        _started.set(None)
        return process

    started_or_start.runner_hand_over = True  # type: ignore[attr-defined]
    stdio._create_platform_compatible_process = started_or_start


def _innermost(exc: BaseException) -> BaseException:
    """The first leaf of an exception group, or the exception's own cause where it is a Lost."""
    while getattr(exc, "exceptions", None):  # an exception group (3.11's, or anyio's backport)
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    if isinstance(exc, Lost):
        return exc
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, OSError) and not isinstance(exc, OSError):
        return cause
    return exc


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:100] or "server"
