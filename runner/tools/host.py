"""`ToolHost`: MCP servers' tools for a synchronous caller (the chat's and run's thread).

The SDK is async. The host runs one event loop on a daemon thread (anyio's blocking portal) and
submits work to it; every method here is called from the caller's thread and blocks until its work
is done. All bookkeeping (states, names, on/off) lives on the caller's thread; the loop only holds
the connections (runner/tools/connection.py).

- `start()` starts every server at once and waits for the slowest, `start_timeout_s` at most: a
  server that fails is one warning line, and the others go on. It is `launch()` (every stdio
  server's process started, which takes milliseconds) and then `wait_ready()`: a chat launches them
  before its model loads and waits for them after.
- `call()` runs a tool, `timeout_s` at most (then the SDK cancels the request, sending
  `notifications/cancelled`). While it waits it polls runner's Ctrl-C flag (runner/interrupt.py);
  on Ctrl-C it cancels the request the same way and returns a result marked `interrupted`,
  leaving the flag set for the caller to handle as it does after an answer it stopped.
- A server whose connection is lost (its process ended) makes that call an error result saying so;
  the next call to one of its tools restarts it, once. After a second loss it stays down.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from pathlib import Path
from types import TracebackType
from typing import Any

from runner import interrupt
from runner.errors import UsageError
from runner.paths import data_dir
from runner.tools.catalog import ServerState, Tool, name_tools
from runner.tools.config import ServerConfig
from runner.tools.connection import Connection, Listing, Lost, TimedOut
from runner.tools.result import MAX_RESULT_BYTES, Limits, ToolResult, failure, from_call

TIMEOUT_S = 60.0
START_TIMEOUT_S = 30.0
POLL_S = 0.05  # how often a wait looks at the Ctrl-C flag
CANCEL_WAIT_S = 5.0  # how long a cancelled call may take to send its cancel and return
CLOSE_WAIT_S = 8.0  # the SDK's shutdown: stdin closed, 2 s, SIGTERM, 2 s, SIGKILL
SPAWN_WAIT_S = 5.0  # the most launch() waits for the processes to be started
SDK_LOGGERS = ("mcp",)  # the SDK logs a bad server's output with tracebacks: to a file, not stderr


class _Server:
    """The host's view of one server: its connection, its owner task, its state."""

    def __init__(self, config: ServerConfig, log_dir: Path) -> None:
        self.config = config
        self.connection = Connection(config, log_dir)
        self.owner: Future[None] | None = None  # the task holding the connection open
        self.status = "not started"  # "ready", "crashed", "failed: why"
        self.listing = Listing()
        self.enabled = True
        self.restarts = 0
        self.lock = threading.Lock()  # its state: calls may come from several threads (the page's turns)
        self.ready_s: float | None = None  # launch() to its tools listed, its first start


def _timer(server: _Server, began: float) -> Callable[[Future[Listing]], None]:
    """A ready Future's callback: the seconds from `began` to the server's tools listed."""

    def done(_ready: Future[Listing]) -> None:
        server.ready_s = time.monotonic() - began

    return done


def _never() -> bool:
    return False


class ToolHost:
    """MCP servers started from their configs; their tools listed, switched on and off, called."""

    def __init__(
        self,
        servers: Sequence[ServerConfig],
        *,
        timeout_s: float = TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
        max_result_bytes: int = MAX_RESULT_BYTES,
        log_dir: Path | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.limits = Limits(text_bytes=max_result_bytes)
        self.log_dir = log_dir if log_dir is not None else data_dir() / "logs"
        self._servers = {config.name: _Server(config, self.log_dir) for config in servers}
        self._tools: dict[str, Tool] = {}
        self._off: set[str] = set()  # tools switched off, by name
        self._portal: Any = None
        self._portal_cm: Any = None
        self._sdk_log: logging.Handler | None = None
        self._pending: dict[_Server, Future[Listing]] = {}
        self._began = 0.0  # when launch() had started the servers

    # -- starting and stopping ------------------------------------------------------------------

    def start(self) -> list[str]:
        """Start every server in parallel; one warning line per server that failed (and per name
        a later config file redefined). The others are ready when this returns."""
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        """Start every server in parallel, waiting only until their processes are started (a remote
        server's connection begun): their start goes on beside what the caller does next."""
        from anyio.from_thread import start_blocking_portal

        if self._portal is not None:
            raise RuntimeError("ToolHost.launch: launched already")
        self._quiet_sdk()
        self._portal_cm = start_blocking_portal(name="runner-mcp")
        self._portal = self._portal_cm.__enter__()
        self._portal.call(self._spawn_all)
        self._began = began = time.monotonic()
        self._pending = {server: self._launch(server) for server in self._servers.values()}
        for server, ready in self._pending.items():
            ready.add_done_callback(_timer(server, began))

    async def _spawn_all(self) -> None:
        import anyio

        with anyio.move_on_after(SPAWN_WAIT_S):
            async with anyio.create_task_group() as group:
                for server in self._servers.values():
                    group.start_soon(server.connection.spawn)

    def wait_ready(self) -> list[str]:
        """Wait for the launched servers (see start)."""
        if self._portal is None:
            raise RuntimeError("ToolHost.wait_ready: not launched")
        notes = [
            f"server {s.config.name}: {s.config.source} replaces the one in {s.config.replaced[-1]}"
            for s in self._servers.values()
            if s.config.replaced
        ]
        pending, self._pending = self._pending, {}
        self._await_ready(pending, self._began)
        self._tools = {
            tool.name: tool
            for tool in name_tools(
                (s.config.name, tool) for s in self._servers.values() for tool in s.listing.tools
            )
        }
        failed = [s for s in self._servers.values() if s.status.startswith("failed: ")]
        return notes + [f"server {s.config.name}: {s.status.removeprefix('failed: ')}" for s in failed]

    def close(self) -> None:
        """Every server shut down (a stdio server's stdin closed, then SIGTERM, then SIGKILL, each
        after 2 s), then the loop's thread ended."""
        if self._portal is None:
            return
        portal, self._portal = self._portal, None
        owners = [s.owner for s in self._servers.values() if s.owner is not None and not s.owner.done()]
        for server in self._servers.values():
            portal.call(server.connection.stop)
        wait(owners, timeout=CLOSE_WAIT_S)
        portal.call(portal.stop, True)  # what is left is cancelled; the SDK's shutdown is shielded
        self._portal_cm.__exit__(None, None, None)
        self._loud_sdk()

    def __enter__(self) -> ToolHost:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _launch(self, server: _Server) -> Future[Listing]:
        """The server's owner task started; the Future is set once it is connected and listed."""
        ready: Future[Listing] = Future()
        server.owner = self._portal.start_task_soon(server.connection.serve, ready)
        return ready

    def _await_ready(self, pending: dict[_Server, Future[Listing]], began: float | None = None) -> None:
        """Wait for the servers to be ready, start_timeout_s at most from `began` (now), Ctrl-C seen;
        set each one's state."""
        deadline = (time.monotonic() if began is None else began) + self.start_timeout_s
        left = list(pending.values())
        while left and time.monotonic() < deadline and not interrupt.requested():
            wait(left, timeout=POLL_S)
            left = [f for f in left if not f.done()]
        late = "start interrupted" if interrupt.requested() else f"not ready after {self.start_timeout_s:g} s"
        for server, ready in pending.items():
            if not ready.done():
                server.status = f"failed: {late}"
                if server.owner is not None:
                    server.owner.cancel()  # the loop cancels the task; the SDK stops the process
            elif ready.exception() is not None:
                server.status = f"failed: {ready.exception()}"
            else:
                server.listing = ready.result()
                server.status = "ready"

    # -- what there is ----------------------------------------------------------------------------

    def tools(self) -> list[Tool]:
        """The tools the model may call: switched on, on a server that is on and not down."""
        return [tool for tool in self._tools.values() if self._usable(tool)]

    def servers(self) -> list[ServerState]:
        """Every server, with its state, its tools (on or off), resources and prompts."""
        return [
            ServerState(
                name=name,
                transport=server.config.transport,
                where=server.config.where(),
                state=server.status if server.enabled else "off",
                tools=[(t.name, t.name not in self._off) for t in self._tools.values() if t.server == name],
                resources=list(server.listing.resources),
                prompts=list(server.listing.prompts),
                log=server.connection.log,
                ready_s=server.ready_s,
            )
            for name, server in self._servers.items()
        ]

    def enable(self, target: str, on: bool) -> list[str]:
        """Switch a server (all its tools) or one tool on or off; the names of the tools affected.
        A server's name is looked up before a tool's."""
        if target in self._servers:
            self._servers[target].enabled = on
            names = [t.name for t in self._tools.values() if t.server == target]
        elif target in self._tools:
            names = [target]
            if on:
                self._servers[self._tools[target].server].enabled = True
        else:
            known = ", ".join([*self._servers, *self._tools]) or "none"
            raise UsageError(f"no MCP server or tool named {target!r} (there are: {known})")
        (self._off.difference_update if on else self._off.update)(names)
        return names

    def _usable(self, tool: Tool) -> bool:
        server = self._servers[tool.server]
        return tool.name not in self._off and server.enabled and server.status in ("ready", "crashed")

    # -- calls ------------------------------------------------------------------------------------

    def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        timeout: float | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> ToolResult:
        """Run a tool. Every failure is a result with `is_error` and its reason, never an exception;
        Ctrl-C (or `stop()` true: the chat page's stop button) while it runs cancels it and returns a
        result marked `interrupted`."""
        began = time.monotonic()
        if self._portal is None:
            return failure("the MCP servers are not running")
        tool = self._tools.get(name)
        if tool is None:
            return failure(f"unknown tool {name!r}")
        server = self._servers[tool.server]
        if name in self._off or not server.enabled:
            return failure(f"tool {name} is switched off")
        problem = self._revive(server)
        if problem is not None:
            return failure(problem, time.monotonic() - began)
        limit = timeout if timeout is not None else self.timeout_s
        result = self._run(server, tool, arguments, limit, stop or _never)
        result.seconds = time.monotonic() - began
        return result

    def _revive(self, server: _Server) -> str | None:
        """None where the server can take a call (restarting it after its first crash); else why not.
        One thread at a time: two calls meeting a crashed server restart it once."""
        with server.lock:
            return self._revive_held(server)

    def _revive_held(self, server: _Server) -> str | None:
        name = server.config.name
        if server.status == "ready":
            return None
        if server.status != "crashed":
            return f"server {name} is down ({server.status.removeprefix('failed: ')})"
        server.restarts += 1
        if server.owner is not None:
            wait([server.owner], timeout=CLOSE_WAIT_S)  # the crashed connection's teardown
        self._await_ready({server: self._launch(server)})
        if server.status != "ready":
            why = server.status.removeprefix("failed: ")
            server.status = f"failed: crashed, then did not restart ({why})"
            return f"server {name} crashed earlier and did not restart: {why}"
        return None

    def _run(
        self, server: _Server, tool: Tool, arguments: dict[str, Any], limit: float, stop: Callable[[], bool]
    ) -> ToolResult:
        import anyio

        scope = self._portal.call(anyio.CancelScope)  # made on the loop, cancelled from there
        task = self._portal.start_task_soon(server.connection.call, tool.original, arguments, limit, scope)
        interrupted = self._wait(task, scope, limit, stop)
        if interrupted or task.cancelled():
            return failure(f"{tool.name}: interrupted (Ctrl-C); the call was cancelled", interrupted=True)
        error = task.exception()
        if error is None:
            return from_call(task.result(), self.limits, 0.0)
        if isinstance(error, TimedOut):
            return failure(f"{tool.name}: no answer after {limit:g} s; the call was cancelled")
        if isinstance(error, Lost):
            return failure(self._lost(server, str(error)))
        return failure(f"{tool.name} failed: {str(error).strip() or type(error).__name__}")

    def _wait(self, task: Future[Any], scope: Any, limit: float, stop: Callable[[], bool]) -> bool:
        """Wait for a call, polling Ctrl-C and `stop`; on either (or well past the limit) cancel the
        call's scope and wait for the SDK to send its cancel. Whether Ctrl-C or `stop` ended it."""
        deadline = time.monotonic() + limit + CANCEL_WAIT_S  # the SDK's own timeout comes first
        cancelled_at: float | None = None
        interrupted = False
        try:
            while not task.done():
                wait([task], timeout=POLL_S)
                now = time.monotonic()
                if cancelled_at is None and (interrupt.requested() or stop() or now > deadline):
                    interrupted = interrupt.requested() or stop()
                    cancelled_at = now
                    self._portal.call(scope.cancel)
                elif cancelled_at is not None and now - cancelled_at > CANCEL_WAIT_S:
                    task.cancel()
                    break
        except KeyboardInterrupt:  # Python's own SIGINT handler (outside interrupt.deferred())
            self._portal.call(scope.cancel)
            wait([task], timeout=CANCEL_WAIT_S)
            raise
        return interrupted

    def _lost(self, server: _Server, why: str) -> str:
        """The server's connection is gone: crashed (restarted at its next call), or down for good."""
        with server.lock:
            return self._lost_held(server, why)

    def _lost_held(self, server: _Server, why: str) -> str:
        name = server.config.name
        self._portal.call(server.connection.stop)
        log = f"; its log: {server.connection.log}" if server.connection.log else ""
        if server.restarts == 0:
            server.status = "crashed"
            return f"server {name} crashed ({why}); it restarts at its next call{log}"
        server.status = "failed: crashed twice"
        return f"server {name} crashed again ({why}); it stays down{log}"

    # -- the SDK's own log ------------------------------------------------------------------------

    def _quiet_sdk(self) -> None:
        """The SDK's warnings (a server printing non-JSON on stdout, a dropped stream) to a file."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._sdk_log = logging.FileHandler(self.log_dir / "mcp-sdk.log", encoding="utf-8")
        self._sdk_log.setLevel(logging.WARNING)
        for name in SDK_LOGGERS:
            logger = logging.getLogger(name)
            logger.addHandler(self._sdk_log)
            logger.propagate = False

    def _loud_sdk(self) -> None:
        if self._sdk_log is None:
            return
        for name in SDK_LOGGERS:
            logger = logging.getLogger(name)
            logger.removeHandler(self._sdk_log)
            logger.propagate = True
        self._sdk_log.close()
        self._sdk_log = None
