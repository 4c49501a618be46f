"""MCP tools for the model: servers from an `mcpServers` file, their tools, calls with limits.

Imported only when `--mcp` is given: nothing here imports the SDK (`mcp`) or anyio until a host
starts, so `runner --help` and every command without tools start as before.

- config.py: the `mcpServers` JSON (Claude Desktop's, Cursor's, LM Studio's, VS Code's), read and checked
- host.py: `ToolHost`, the synchronous facade: start, list, switch on and off, call, close
- connection.py: one server's connection, on the host's event loop
- catalog.py: the tools as the model names them; a server's state for `/tools`
- result.py: a call's outcome, bounded before it is kept
- loop.py: the agent loop over an answer's calls (approved, run, kept), for the terminal and the page
"""

from runner.tools.catalog import ServerState, Tool
from runner.tools.config import ServerConfig, configs, default_config, load_config
from runner.tools.host import ToolHost
from runner.tools.result import ToolResult

__all__ = [
    "ServerConfig",
    "ServerState",
    "Tool",
    "ToolHost",
    "ToolResult",
    "configs",
    "default_config",
    "load_config",
]
