"""The agent loop, whoever asks the person: an answer that calls tools is not the end of a turn.

Each call the model makes is approved (or not), run on its MCP server (runner.tools.host), and its
result goes back to the model as a message of its own; the model answers again, until it answers
without a call or --max-tool-steps is reached. Every answer goes through the one generation loop (the
caller's `ask`); what is kept of each step (the store, the turns) is the caller's too (`Turns`). How a
call is approved is `Approvals`: --allow-tools, "always" chosen in this chat, or the person's answer
(`Approvals.question`: the terminal's, runner.commands.agent; the chat page's, runner.serve.webui.tools).
A question no one answered (the page closed, stopped, or silent too long) runs nothing and ends the turn.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from runner import interrupt, ui
from runner.engine.answer import FINISH_INTERRUPTED, Result
from runner.errors import RunnerError, UsageError
from runner.images import ImageRef
from runner.store import StoredMessage

if TYPE_CHECKING:
    from runner.tools.host import Tool, ToolHost

TOOL_CHOICES = ("auto", "required", "none")  # --tool-choice, or a tool's name
SHOWN_ARGUMENTS = 1200  # characters of a call's pretty-printed arguments shown before it is asked
INTERRUPTED_CALL = "[the user interrupted this call before it finished]"
REFUSED_CALL = "[the user refused to run this call]"
NOT_ALLOWED_CALL = "[not run: --allow-tools does not allow it, and there was no terminal to ask]"
UNANSWERED_CALL = "[not run: the turn ended before the user approved this call]"


class ToolNotAllowed(RunnerError):
    """A call nothing allowed, with no terminal to ask: the answer ends here, nothing ran (exit 1)."""


@dataclass(frozen=True)
class ToolSettings:
    """The tool flags of run and chat, as typed."""

    configs: tuple[str, ...] = ()  # --mcp FILE, repeatable (the default file joins them: tools.config)
    allow: tuple[str, ...] = ()  # --allow-tools NAME or SERVER:*, each pre-approved
    max_steps: int = 10  # --max-tool-steps: calls the model may make in one turn
    timeout_s: float = 60.0  # --tool-timeout: one call's limit
    choice: str = "auto"  # --tool-choice auto|required|none|NAME: the first step's; later ones auto

    def check(self) -> None:
        """The flags' values refused before anything loads."""
        if not 1 <= self.max_steps <= 1000:
            raise UsageError(f"--max-tool-steps must be between 1 and 1000 (got {self.max_steps})")
        if not 0 < self.timeout_s <= 86400:
            raise UsageError(
                f"--tool-timeout must be more than 0 and at most 86400 s (got {self.timeout_s:g})"
            )
        for item in self.allow:
            if not item or item.count(":") > 1 or (":" in item and not item.endswith(":*")):
                raise UsageError(
                    f"--allow-tools {item!r}: give tool names, or SERVER:* for all of a server's"
                )

    def api_choice(self, step: int, names: Sequence[str]) -> str | dict[str, Any]:
        """The step's tool_choice as the API's (and the engine's forced call) reads it: --tool-choice
        for the first step, auto after it (a forced call every step would never end)."""
        if step > 0 or self.choice == "auto":
            return "auto"
        if self.choice in TOOL_CHOICES:
            return self.choice
        if self.choice not in names:
            listed = ", ".join(names) or "none"
            raise UsageError(f"--tool-choice {self.choice}: no such tool (the servers give: {listed})")
        return {"type": "function", "function": {"name": self.choice}}


@dataclass
class Step:
    """One call the model made and what became of it: for --json's `steps` and stderr's lines."""

    tool: str
    server: str
    arguments: dict[str, Any]
    approved: str  # "allowed" (--allow-tools), "always", "yes"; "no" (refused), "unanswered": not run
    seconds: float = 0.0
    result_bytes: int = 0
    error: bool = False
    interrupted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "server": self.server,
            "arguments": self.arguments,
            "approved": self.approved,
            "seconds": round(self.seconds, 3),
            "result_bytes": self.result_bytes,
            "error": self.error,
            **({"interrupted": True} if self.interrupted else {}),
        }

    def line(self) -> str:
        """The step as one line of stderr."""
        if self.approved == "no":
            return f"tool {self.server}:{self.tool}: refused, not run"
        if self.approved == "unanswered":
            return f"tool {self.server}:{self.tool}: not answered, not run"
        how = "failed" if self.error else "interrupted" if self.interrupted else "ok"
        return (
            f"tool {self.server}:{self.tool} ({self.approved}): {how}, {ui.human_bytes(self.result_bytes)} "
            f"in {self.seconds:.2f} s"
        )


Ask = Callable[[str], str]  # the terminal's question -> "y", "n" or "a"


@dataclass
class Approvals:
    """Which calls run: --allow-tools (a name, or SERVER:*), "always" chosen in this chat, else the
    terminal's question (`ask`: None with no terminal, where a call nothing allowed raises)."""

    allow: tuple[str, ...] = ()
    ask: Ask | None = None
    always: set[str] = field(default_factory=set)

    def decide(self, tool: Tool, arguments: dict[str, Any]) -> str:
        if tool.name in self.allow or f"{tool.server}:*" in self.allow:
            return "allowed"
        if tool.name in self.always:
            return "always"
        answer = self.question(tool, arguments)
        if answer == "a":
            self.always.add(tool.name)
            return "always"
        return {"y": "yes", "u": "unanswered"}.get(answer, "no")

    def question(self, tool: Tool, arguments: dict[str, Any]) -> str:
        """The person's answer: "y", "n", "a" (always), or "u" (none came: the call does not run and
        the turn ends). The terminal's: the call said on stderr, `ask` answers (None: no terminal)."""
        if self.ask is None:
            raise ToolNotAllowed(
                f"the model called {tool.server}:{tool.name}, which --allow-tools does not allow, and there "
                f"is no terminal to ask; nothing ran (allow it with --allow-tools {tool.name})"
            )
        ui.info(f"the model calls {tool.server}:{tool.name} with {shown(arguments)}")
        return self.ask(f"run {tool.name}? [y]es / [n]o / [a]lways for this tool in this chat")


def shown(arguments: dict[str, Any]) -> str:
    """A call's arguments pretty-printed and bounded, as they are shown before it is asked."""
    text = json.dumps(arguments, ensure_ascii=False, indent=2)
    if len(text) > SHOWN_ARGUMENTS:
        text = text[:SHOWN_ARGUMENTS] + f"\n… ({len(text) - SHOWN_ARGUMENTS:,} more characters)"
    return text


def answer_with_tools(
    ask: Callable[[str | dict[str, Any]], Result],
    host: ToolHost,
    settings: ToolSettings,
    approvals: Approvals,
    keep: Turns,
    stop: Callable[[], bool] = lambda: False,
) -> tuple[Result, list[Step]]:
    """The turn's answers until one makes no call: `ask(tool_choice)` answers the conversation as it
    stands (each step's messages kept in `keep` first), with the tools of `host`. The last answer and
    the steps, each also said on stderr as it ends. `stop()` true: a call running is cancelled, as
    Ctrl-C cancels it (the page's stop button; the terminal's is Ctrl-C itself)."""
    steps: list[Step] = []
    for n in range(settings.max_steps + 1):
        result = ask(settings.api_choice(n, [t.name for t in host.tools()]))
        if not result.tool_calls or result.finish_reason == FINISH_INTERRUPTED:
            return result, steps
        if n == settings.max_steps:
            ui.warn(
                f"the model called tools {n} times in this turn: --max-tool-steps {n} reached, it stops here"
            )
            return result, steps
        calls = [
            dict(call, id=call.get("id") or f"call_{secrets.token_hex(4)}") for call in result.tool_calls
        ]
        keep.calls(result, calls)
        for i, call in enumerate(calls):
            try:
                step = _run(call, host, approvals, keep, stop)
            except ToolNotAllowed:  # the answer ends; each call is answered, as a template expects
                for later in calls[i:]:
                    keep.tool_result(later, NOT_ALLOWED_CALL)
                raise
            steps.append(step)
            ui.info(step.line())
            if step.interrupted:  # the calls after it are answered too: a template expects each
                for later in calls[i + 1 :]:
                    keep.tool_result(later, INTERRUPTED_CALL)
                return replace(result, finish_reason=FINISH_INTERRUPTED), steps
    raise AssertionError("unreachable")  # the last pass returns


def _run(
    call: dict[str, Any], host: ToolHost, approvals: Approvals, keep: Turns, stop: Callable[[], bool]
) -> Step:
    """One call: approved, run (its result kept as the model will read it), measured."""
    tools = {t.name: t for t in host.tools()}
    tool = tools[call["name"]]  # the parser reads calls of these tools only
    approved = approvals.decide(tool, call["arguments"])
    step = Step(tool.name, tool.server, call["arguments"], approved)
    if approved == "no":
        keep.tool_result(call, REFUSED_CALL)
        return step
    if approved == "unanswered":  # the turn ends here, as after a Ctrl-C
        step.interrupted = True
        keep.tool_result(call, UNANSWERED_CALL)
        return step
    ui.info(f"running {tool.server}:{tool.name} (Ctrl-C cancels it)")
    start = time.perf_counter()
    done = None
    try:
        with interrupt.deferred():  # Ctrl-C cancels the call (the host sends MCP's notice)
            done = host.call(tool.name, call["arguments"], stop=stop)
            if interrupt.requested():  # seen by the host as it returned
                interrupt.clear()
                done = None
            elif done.interrupted:  # stop()
                done = None
    except KeyboardInterrupt:
        interrupt.clear()
    step.seconds = time.perf_counter() - start
    if done is None:
        step.interrupted = True
        keep.tool_result(call, INTERRUPTED_CALL)
        return step
    step.result_bytes = len(done.text.encode()) + sum(len(data) for _mime, data in done.images)
    step.error = done.is_error
    keep.tool_result(call, done.text, done.images)
    return step


def _image_note(mime: str, data: bytes) -> str:
    size = ui.human_bytes(len(data))
    return f"\n[the tool returned an image ({mime}, {size}); this model does not see images]"


@dataclass
class Turns:
    """The turns a tool loop adds to: each step a StoredMessage, given to `persist` as it is
    made (the chat's store) and appended to `turns`."""

    turns: list[StoredMessage]
    model: str
    persist: Callable[[StoredMessage], None] = lambda _message: None
    # a vision model's: a tool's images kept for it to see (runner.commands.attach.Attachments)
    see: Callable[[Sequence[tuple[str, bytes]], str], tuple[tuple[ImageRef, ...], str]] | None = None

    def calls(self, result: Result, calls: list[dict[str, Any]]) -> None:
        reasoning = result.reasoning.strip() or None
        self._add(
            StoredMessage("assistant", result.text, reasoning, tool_calls=tuple(calls), model=self.model)
        )

    def tool_result(self, call: dict[str, Any], text: str, images: Sequence[tuple[str, bytes]] = ()) -> None:
        """A call's result as the model reads it: its text, and its images where the model sees
        images (else a note for each)."""
        refs: tuple[ImageRef, ...] = ()
        if images and self.see is not None:
            refs, notes = self.see(images, call["name"])
        else:
            notes = "".join(_image_note(mime, data) for mime, data in images)
        self._add(StoredMessage("tool", text + notes, call_id=call["id"], tool=call["name"], images=refs))

    def _add(self, message: StoredMessage) -> None:
        self.turns.append(message)
        self.persist(message)
