"""MCP servers for the tool tests (tests/test_mcp_host.py), written with the SDK's own server API.

    python tests/mcp_servers.py KIND [ARG]

KIND:
  tools       the test tools over stdio (add, read, touch, sleep, wait, crash, big, image, env, pid), a
              resource and a prompt
  slow        the same, after sleeping ARG seconds before it serves (a slow start)
  noisy       the same, after a line on stdout that is not JSON-RPC (which the SDK logs)
  exit        exits at once with status 3 (a server that fails to start)
  mute        never answers (a server that hangs at the start)
  http        the test tools over Streamable HTTP on 127.0.0.1, port ARG (under uvicorn)
  sse         the test tools over the old HTTP+SSE transport on 127.0.0.1, port ARG

`read` reads files under $MCP_TEST_ROOT (the test's temp folder) and `touch` makes NAME.touched there.
Every stdio kind first writes one line to stderr ("mcp test server KIND starting"), which the host
must keep in its log, not show. tests/test_tools_cli.py uses them too.
"""

import base64
import os
import sys
import time
from pathlib import Path

MEGABYTE = 1_000_000
# A 1x1 red PNG, so that no image library is needed to make one.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)


def build():
    from mcp.server.mcpserver import Image, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("runner-test", log_level="WARNING")

    @server.tool()
    def add(a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    @server.tool()
    def read(path: str) -> str:
        """Read a text file under the test folder."""
        root = Path(os.environ["MCP_TEST_ROOT"]).resolve()
        target = (root / path).resolve()
        if root not in target.parents:
            raise ToolError(f"{path} is outside the test folder")
        return target.read_text()

    @server.tool()
    def touch(name: str) -> str:
        """Make an empty file NAME.touched in the test folder (a tool with an effect)."""
        target = Path(os.environ["MCP_TEST_ROOT"]) / f"{Path(name).name or 'file'}.touched"
        target.touch()
        return f"made {target.name}"

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Sleep, then say so; says on stderr when the client cancelled it (notifications/cancelled)."""
        import anyio

        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            print("sleep cancelled", file=sys.stderr, flush=True)
            raise
        return f"slept {seconds}"

    @server.tool()
    async def wait() -> str:
        """Wait a minute (no arguments: a call any model can make); says on stderr when cancelled."""
        import anyio

        try:
            await anyio.sleep(60)
        except anyio.get_cancelled_exc_class():
            print("wait cancelled", file=sys.stderr, flush=True)
            raise
        return "waited"

    @server.tool()
    def crash() -> str:
        """End this server's process at once."""
        os._exit(9)

    @server.tool()
    def big() -> str:
        """One megabyte of text: 'é' then ASCII, so that a cut can land inside a character."""
        return "é" + "x" * (MEGABYTE - 2)

    @server.tool()
    def image() -> Image:
        """A 1x1 PNG."""
        return Image(data=PNG, format="png")

    @server.tool()
    def env(name: str) -> str:
        """An environment variable's value, or <unset>; for "*", every variable's name."""
        if name == "*":
            return " ".join(sorted(os.environ))
        return os.environ.get(name, "<unset>")

    @server.tool()
    def pid() -> str:
        """This server's process id."""
        return str(os.getpid())

    @server.resource("test://readme")
    def readme() -> str:
        """A resource, for the listing."""
        return "hello"

    @server.prompt()
    def greet(name: str) -> str:
        """A prompt, for the listing."""
        return f"Say hello to {name}."

    return server


def serve_http(app, port: int) -> None:
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def main(kind: str, arg: str | None) -> None:
    print(f"mcp test server {kind} starting", file=sys.stderr, flush=True)
    if kind == "exit":
        sys.exit(3)
    if kind == "mute":
        time.sleep(600)
    if kind == "slow":
        time.sleep(float(arg or 1))
    server = build()
    if kind == "noisy":
        print("this is not JSON-RPC", flush=True)
    if kind in ("tools", "slow", "noisy"):
        server.run("stdio")
    elif kind == "http":
        serve_http(server.streamable_http_app(), int(arg or 0))
    elif kind == "sse":
        serve_http(server.sse_app(), int(arg or 0))
    else:
        sys.exit(f"unknown kind {kind}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
