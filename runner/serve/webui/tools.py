"""The chat page's turns with tools (`runner serve --mcp FILE`): the agent loop the terminal runs
(runner.tools.loop), with the person in the page asked before each call.

A turn's loop runs on a thread of its own, as the terminal's runs on the main one: each answer is submitted
to the server's one backend and streamed to the pages that follow the turn; each call the model makes
is an `approval` event (server, tool, arguments bounded) and the loop waits for the page's answer
(POST /runner/v1/conversations/ID/approve: allow, deny, or always for this tool in this chat). Deny
tells the model the user refused, as the terminal's "no". No answer within `wait_s`, no page
following the turn for `gone_s` (the tab closed; a reload comes back sooner), or the stop button:
the call does not run and the turn ends, every step kept. Each step is stored as the terminal stores
it (runner.tools.loop.Turns), so `runner chat --resume` continues the conversation.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as Late
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar

from runner import ui
from runner.engine.answer import FINISH_INTERRUPTED, Result, Timings
from runner.serve.backend import Generation, Outcome
from runner.serve.webui.conversations import Conversations, Held, as_json
from runner.serve.webui.turns import Turn
from runner.store import Store, StoredMessage
from runner.tools.loop import Approvals, ToolSettings, Turns, answer_with_tools, shown

if TYPE_CHECKING:
    from runner.tools.host import Tool, ToolHost

T = TypeVar("T")
APPROVAL_WAIT_S = 300.0  # how long a call waits for the page's answer
PAGE_GONE_S = 30.0  # how long a call waits with no page following its turn (the tab closed)
POLL_S = 0.1
DECISIONS = {"allow": "y", "deny": "n", "always": "a"}  # the page's answers, as Approvals reads them
SAID = {"y": "allowed", "n": "denied", "a": "always", "u": "unanswered"}


@dataclass
class PageTools:
    """The MCP servers' tools for the page's turns (--mcp, started with the server), their flags
    (--allow-tools, --max-tool-steps, --tool-timeout), how long a call waits for its answer, and
    "always" as chosen in each conversation while the server runs."""

    host: ToolHost
    settings: ToolSettings
    wait_s: float = APPROVAL_WAIT_S
    gone_s: float = PAGE_GONE_S
    always: dict[int, set[str]] = field(default_factory=dict)
    stopping: threading.Event = field(default_factory=threading.Event)  # the server is stopping

    def stop(self) -> None:
        """The server stops: every call waiting for an answer or running ends, as at the stop button."""
        self.stopping.set()

    def defs(self) -> list[dict[str, Any]]:
        """The tools the model is shown (OpenAI-shaped), as the terminal shows them."""
        return [tool.openai() for tool in self.host.tools()]


class Question:
    """One call waiting for the page's answer; answered once, from the event loop."""

    def __init__(self, tool: Tool, arguments: dict[str, Any]) -> None:
        self.id = f"ask_{secrets.token_hex(6)}"
        self.tool = tool
        self.arguments = arguments
        self.answer: Future[str] = Future()

    def event(self, wait_s: float) -> dict[str, Any]:
        return {
            "type": "approval",
            "id": self.id,
            "server": self.tool.server,
            "tool": self.tool.name,
            "arguments": shown(self.arguments),
            "wait_s": wait_s,
        }

    def answer_with(self, decision: str) -> bool:
        """The page's answer ("allow", "deny", "always"); False where one came already."""
        try:
            self.answer.set_result(DECISIONS[decision])
        except InvalidStateError:
            return False
        return True


class PageApprovals(Approvals):
    """Approvals whose question is asked in the page (the turn's `ask_page`)."""

    def __init__(self, turn: ToolTurn, allow: tuple[str, ...], always: set[str]) -> None:
        super().__init__(allow, None, always)
        self.turn = turn

    def question(self, tool: Tool, arguments: dict[str, Any]) -> str:
        return self.turn.ask_page(Question(tool, arguments))


# the next step's answer: submitted with the turns as they stand and the step's tool_choice
Again = Callable[[Sequence[StoredMessage], "str | dict[str, Any]"], Coroutine[Any, Any, Generation]]


class ToolTurn(Turn):
    """A page's turn through the agent loop: its answers, its questions and its steps all events of
    the one turn, so a second tab following it sees a question waiting too."""

    def __init__(
        self,
        conversation: int,
        generation: Generation,
        held: Held,
        store: Conversations,
        model: str,
        asked: Callable[[Store], object],
        *,
        tools: PageTools,
        sent: list[StoredMessage],
        again: Again,
    ) -> None:
        super().__init__(conversation, generation, held, store, model, asked)
        self.tools = tools
        self.question: Question | None = None  # the call waiting for the page's answer
        self.followers = 0  # the pages following the turn now (runner.serve.webui.routes._lines)
        self._sent = sent  # the turns the first answer was asked with, the question last
        self._again = again
        self._stopped = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def stop(self) -> None:
        """The stop button: the answer in progress ends, a call running is cancelled, a question
        waiting is not answered (its call does not run)."""
        self._stopped.set()
        self.generation.cancel()

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        asked = asyncio.ensure_future(self._store.call(self._asked))
        try:
            result = await self._on_thread(asked)
            # the last answer, as the terminal keeps it: calls it made past --max-tool-steps (or that
            # no one answered) are not kept with it, nothing answers them
            await self._keep(Outcome(replace(result, tool_calls=())))
        except Exception as exc:  # the store failing; a later step's prompt too long
            ui.warn(f"conversation {self.conversation}: the turn failed: {exc}")
            self.generation.cancel()
            await self.generation.wait()
            self.emit({"type": "error", "message": str(exc) or type(exc).__name__})
        finally:
            if not asked.done():
                asked.cancel()
            self._held.release()
            self.done = True
            self.emit({"type": "end"})

    def _on_thread(self, asked: asyncio.Future[object]) -> asyncio.Future[Result]:
        """The loop on a thread of its own: a turn may wait minutes for its question's answer, which
        would hold one of the event loop's few default workers."""
        done: Future[Result] = Future()

        def work() -> None:
            try:
                done.set_result(self._agent(asked))
            except BaseException as exc:  # handed to the event loop's side
                done.set_exception(exc)

        threading.Thread(target=work, name=f"tools-{self.conversation}", daemon=True).start()
        return asyncio.wrap_future(done)

    # -- on the turn's own thread -------------------------------------------------------------------

    def _agent(self, asked: asyncio.Future[object]) -> Result:
        """answer_with_tools, its answers asked of the backend, its steps stored and sent on."""
        conversation = self.conversation
        always = self.tools.always.setdefault(conversation, set())
        approvals = PageApprovals(self, self.tools.settings.allow, always)
        keep = Turns(list(self._sent), self._model, self._persist)
        first = True

        def ask(choice: str | dict[str, Any]) -> Result:
            nonlocal first
            if self._stop():
                return Result("", FINISH_INTERRUPTED, Timings())
            if not first:
                self.generation = self._on_loop(self._again(keep.turns, choice))
                if self._stop():
                    self.generation.cancel()
            outcome = self._on_loop(self._stream(self.generation))
            if first:  # the question is kept before any step
                first = False
                self._on_loop(_settled(asked))
            return outcome.result

        result, _steps = answer_with_tools(
            ask, self.tools.host, self.tools.settings, approvals, keep, self._stop
        )
        return result

    def ask_page(self, question: Question) -> str:
        """The question sent to the pages that follow the turn; their answer, or "u" for none."""
        self.question = question
        self._send(question.event(self.tools.wait_s))
        answer, why = self._wait(question)
        self.question = None
        if answer == "u":
            ui.info(f"conversation {self.conversation}: {question.tool.name} not run: {why}")
        self._send({"type": "approved", "id": question.id, "decision": SAID[answer], "why": why})
        return answer

    def _wait(self, question: Question) -> tuple[str, str]:
        deadline = time.monotonic() + self.tools.wait_s
        alone_since: float | None = None
        while True:
            try:
                return question.answer.result(timeout=POLL_S), ""
            except Late:
                pass
            now = time.monotonic()
            if self._stop():
                return "u", "the turn was stopped"
            if now > deadline:
                return "u", f"no answer in {self.tools.wait_s:g} s"
            alone_since = (alone_since or now) if self.followers == 0 else None
            if alone_since is not None and now - alone_since > self.tools.gone_s:
                return "u", "no page follows the conversation"

    def _stop(self) -> bool:
        return self._stopped.is_set() or self.tools.stopping.is_set()

    def _persist(self, message: StoredMessage) -> None:
        number = self._on_loop(self._store.add(self.conversation, message))
        self._send({"type": "message", "message": as_json(replace(message, id=number))})

    def _send(self, event: dict[str, Any]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.emit, event)

    def _on_loop(self, work: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    # -- on the event loop --------------------------------------------------------------------------

    async def _stream(self, generation: Generation) -> Outcome:
        async for kind, text in generation:
            if kind in ("answer", "reasoning") and text:
                self.emit({"type": kind, "text": text})
        return generation.outcome


async def _settled(future: asyncio.Future[T]) -> T:
    return await future
