"""Tools in the terminal: the edge `runner chat` and `runner run` give the agent loop (--mcp).

The loop itself is runner.tools.loop (the chat page's turns run it too): each call approved (or not),
run on its MCP server, its result given back to the model, until an answer makes no call. Here is what
only a terminal has: the question on stderr (`ask_terminal`; with no terminal to ask, a call nothing
allowed ends the answer: ToolNotAllowed, exit 1, before anything runs), an answer written as it comes
but for its calls (`HeldCalls`), a kept step as the chat template reads it, and the servers started
beside the model's load (`Servers`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner import ui
from runner.commands.output import AnswerWriter
from runner.engine.answer import Result, since_process_start
from runner.engine.text.reasoning import ANSWER
from runner.engine.text.template import Message
from runner.store import StoredMessage
from runner.tools.loop import (
    Approvals,
    Step,
    ToolNotAllowed,
    ToolSettings,
    Turns,
    answer_with_tools,
    shown,
)

if TYPE_CHECKING:
    from runner.tools.host import ToolHost

# the loop's parts, as the terminal's callers (chat's session, run) import them from here
__all__ = [
    "Approvals",
    "HeldCalls",
    "Servers",
    "Step",
    "ToolNotAllowed",
    "ToolSettings",
    "Turns",
    "answer_with_tools",
    "ask_terminal",
    "shown",
    "template_message",
]

# what opens a call in the families' formats, as the answer's text carries it (runner.engine.text.toolcalls)
CALL_MARKERS = (
    "<tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "<|tool_call|>",
    "<|START_ACTION|>",
    "<｜tool▁calls▁begin｜>",
    "<function=",
    ">>>",
    "functools[",
    "<|channel|>",  # gpt-oss: a message to functions.NAME, in the answer (engine.text.reasoning)
)


def ask_terminal(question: str) -> str:
    """The question on stderr, one line read: "y", "n" or "a" (end of input, or anything else: no)."""
    answer = (ui.ask(question) or "").strip().lower()
    return {"y": "y", "yes": "y", "a": "a", "always": "a"}.get(answer, "n")


class HeldCalls(AnswerWriter):
    """An answer written as it comes, but for what may be a tool call: from a call's opening marker
    (CALL_MARKERS), or a first character "{" (a call as one JSON object), the text is held until the
    answer is read (release). A call is shown as a step, never as the answer's text on stdout."""

    def __init__(self, out: Any, *, hold_all: bool = False, verbose: bool = False, **kwargs: Any) -> None:
        super().__init__(out, **kwargs)
        self.hold_all = hold_all  # run: stdout gets the final answer only, so every answer waits
        self.verbose = verbose  # a call's marker that did not parse is said on stderr
        self.pending = ""
        self.holding = False  # a marker came: the rest waits for release
        self.begun = False  # some of the answer's text was written

    def write(self, kind: str, text: str) -> None:
        if kind != ANSWER:
            super().write(kind, text)
            return
        self.pending += text
        if self.holding or self.hold_all:
            return
        if not self.begun:
            start = self.pending.lstrip()
            if not start:
                return
            if start.startswith("{"):
                self.holding = True
                return
            self.begun = True
        at = min((i for i in (self.pending.find(m) for m in CALL_MARKERS) if i >= 0), default=-1)
        if at >= 0:
            self.holding = True
            self._emit(at)
            return
        self._emit(len(self.pending) - _marker_start(self.pending))

    def __exit__(self, *exc: Any) -> None:
        """An answer asked without tools is never released: what was held (it began with "{", a JSON
        answer) is its text, written now, once it ended without an error."""
        if exc[0] is None and self.pending:
            self._emit(len(self.pending))
        self.holding, self.begun = False, False
        super().__exit__(*exc)

    def release(self, result: Result) -> None:
        """The answer read: what was held is written unless it was the answer's calls (with hold_all,
        the text that came with calls goes to stderr: it is not the final answer)."""
        if not result.tool_calls:
            if self.verbose and self.holding:
                ui.info("the answer looked like a tool call but none parsed: it is kept as text")
            super().write(ANSWER, self.pending)
        elif self.hold_all and result.text.strip():
            ui.info(f"the model, calling tools: {result.text.strip()}")
        self.pending, self.holding, self.begun = "", False, False

    def _emit(self, n: int) -> None:
        text, self.pending = self.pending[:n], self.pending[n:]
        if text:
            super().write(ANSWER, text)


def _marker_start(text: str) -> int:
    """How many characters at the end of text could begin a call's marker (held back till the next)."""
    for n in range(min(len(text), max(map(len, CALL_MARKERS)) - 1), 0, -1):
        tail = text[-n:]
        if any(m.startswith(tail) for m in CALL_MARKERS):
            return n
    return 0


# -- the conversation's tool steps, and the servers -------------------------------------------------


def template_message(message: StoredMessage) -> Message:
    """A kept message as the chat template reads it: an assistant's calls as OpenAI's `tool_calls`
    (arguments as an object, as the templates read them), a tool's result with the call it answers."""
    extra: dict[str, Any] | None = None
    if message.tool_calls:
        extra = {
            "tool_calls": [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in message.tool_calls
            ]
        }
    elif message.role == "tool":
        extra = {"tool_call_id": message.call_id, "name": message.tool}
    return Message(message.role, message.content, extra)


class Servers:
    """The MCP servers of --mcp (and the default file), their processes started at once, before the
    model loads, so that their start goes on beside the load: `ready()` waits for the slowest, says
    each that failed in one line, and gives the host. A config file that cannot be read is refused
    at once, before the model loads."""

    def __init__(self, settings: ToolSettings, *, default: bool, verbose: bool = False) -> None:
        from runner.tools.config import configs, load_config
        from runner.tools.host import ToolHost

        given = [Path(p) for p in settings.configs]
        paths = configs(given) if default or given else []
        self.host = ToolHost(load_config(paths), timeout_s=settings.timeout_s) if paths else None
        self._warnings: list[str] | None = None
        self._verbose = verbose
        self._launched = 0.0  # the process's age at the launch
        if self.host is not None:
            try:
                self._launched = since_process_start()
                self.host.launch()
            except BaseException:  # Ctrl-C while they start: what started is stopped
                self.host.close()
                raise

    def ready(self) -> ToolHost | None:
        if self.host is None:
            return None
        if self._warnings is None:
            self._warnings = self.host.wait_ready()
            for warning in self._warnings:
                ui.warn(warning)
            if self._verbose:
                ui.info(self.describe_start())
        return self.host

    def describe_start(self) -> str:
        """--verbose: when each server was ready, in seconds since the process started."""
        assert self.host is not None
        servers = [s for s in self.host.servers() if s.state == "ready" and s.ready_s is not None]
        at = [f"{s.name} {self._launched + (s.ready_s or 0):.2f} s" for s in servers]
        return "MCP servers ready, since the start: " + (" · ".join(at) or "none")

    def close(self) -> None:
        if self.host is not None:
            self.host.close()
