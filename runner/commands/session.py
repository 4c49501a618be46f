"""The chat's session: one loaded model, the conversation with it, the settings it is opened with
(ChatRequest), the turns sent and answered, and their store.

Sending a message fits the conversation to the context (the oldest exchanges give way), streams the
answer and keeps both turns; /retry, /undo and /clear change the turns too. A store that fails stops
saving and the chat goes on; at the end the evaluated state goes to the prompt cache (--resume, run -c).
Each turn holds its stored conversation (`holding`) from question to answer: runners continuing one
conversation take turns. /set's settings are stored with the conversation and come back with it,
unless a flag says otherwise. Not a command itself: chat.py runs the loop, slash.py the commands.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from runner import ui
from runner.commands import compact
from runner.commands.agent import (
    Approvals,
    HeldCalls,
    Step,
    ToolSettings,
    Turns,
    answer_with_tools,
    ask_terminal,
)
from runner.commands.attach import Attachments
from runner.commands.compact import CompactSettings
from runner.commands.output import (
    LOOP_WARNING,
    describe_timings,
    open_prompt_cache,
    sampling_for,
    shape_problem,
    stream_answer,
)
from runner.engine.answer import FINISH_INTERRUPTED, FINISH_REPEAT, Result, result_json
from runner.engine.conversation import Fitted
from runner.engine.promptcache import MIN_HEAD, text_head
from runner.engine.request import Request
from runner.engine.text.constrain import Constraint, constraint
from runner.engine.text.reasoning import THINK_LEVELS
from runner.engine.text.tools import call_shape
from runner.errors import RunnerError, UsageError
from runner.limits import check_answer_limits
from runner.loader import LoadedModel
from runner.settings import DEFAULTS, LoadSettings
from runner.store import Compaction, Store, StoredConversation, StoredMessage, StoreError, user_turns
from runner.store.turns import holding

if TYPE_CHECKING:
    from runner.tools.host import ToolHost

# what a stored answer's stats keep of runner.engine.answer.TIMINGS
STORED_TIMINGS = (
    "prompt_tokens",
    "prefill_tokens",
    "completion_tokens",
    "ttft_s",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
)


@dataclass(frozen=True)
class ChatRequest:
    """What `runner chat` (or `runner run -c`) was asked for: its flags, as typed."""

    model: str | None = None
    system: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    settings: LoadSettings = DEFAULTS  # how the model loads (--ctx, --threads, --spec, --mmproj ...)
    prompt_cache: bool = True  # --no-prompt-cache: False
    prompt_cache_size: str | None = None  # --prompt-cache-size as typed
    verbose: bool = False
    save: bool = True
    resume: str | None = None  # "last", or a conversation id
    load: Path | None = None
    markdown: bool = False
    think: bool | str | None = None  # --think [LEVEL] / --no-think
    reasoning_budget: int | None = None  # --reasoning-budget N
    hide_reasoning: bool = False
    tools: ToolSettings | None = None  # --mcp and the tool flags (a chat reads mcp.json without them)
    compact: CompactSettings | None = None  # --compact, --compact-keep, --compact-prompt
    max_audio_seconds: float = 600.0  # --max-audio-seconds: a clip's length at most, from its header


class Session:
    """One loaded model and the conversation with it: turns, settings, and where they are stored."""

    def __init__(
        self,
        loaded: LoadedModel,
        request: ChatRequest,
        store: Store | None,
        out: TextIO,
        interactive: bool,
        *,
        quiet: bool = False,
    ) -> None:
        self.loaded = loaded
        self.quiet = quiet  # print nothing of the answer (run -c --json prints it at the end)
        self.request = request
        self.store = store
        self.out = out
        self.interactive = interactive
        self.overrides = {k: v for k, v in request.sampling.items() if v is not None}
        self.origin = dict.fromkeys(self.overrides, "flag")  # each override's: flag, /set, conversation
        self.sampling, self.sources = sampling_for(loaded, self.overrides)
        self.max_tokens = request.max_tokens
        self.think = request.think
        self.constrained: tuple[str, str] | None = None  # /set format json, /set schema S: as typed
        self.constraint: Constraint | None = None
        entry_system = loaded.entry.system if loaded.entry is not None else None
        self.system = request.system if request.system is not None else entry_system
        self.turns: list[StoredMessage] = []
        self.conversation: int | None = None
        self.first = 0  # the first turn sent to the model (older exchanges dropped to fit)
        self.compaction: Compaction | None = None  # the summary sent for the first turns (compact.py)
        self.last: Result | None = None  # the last answer
        # /image: for the next message; those the turns carried
        self.attached = Attachments(loaded.engine, request.max_audio_seconds)
        self._held: ExitStack | None = None  # inside a turn: where a conversation created there is held
        self.answers = 0  # answers written in this chat (piped, a blank line goes between them)
        # the conversation's evaluated state is kept on disk at the end, loaded by --resume and -c
        self.prompt_cache = open_prompt_cache(request.prompt_cache, request.prompt_cache_size)
        self.host: ToolHost | None = None  # the MCP servers' tools (--mcp, mcp.json): chat.py starts them
        tools = request.tools or ToolSettings()
        self.approvals = Approvals(tools.allow, ask_terminal if interactive else None)
        self.steps: list[Step] = []  # the last turn's tool steps (run -c --json gives them)

    # -- the conversation and its store ------------------------------------------------------------

    def adopt(self, stored: StoredConversation, *, stored_here: bool) -> None:
        """Continue a stored or loaded conversation: its system message and its settings, unless -s
        or a flag says otherwise (what the flags changed is stored with it from now on)."""
        self.turns = list(stored.messages)
        self.conversation, self.first = None, 0  # the settings adopted are not written to the one before
        self.compaction = compact.stored(self.store, stored.id) if stored_here else None
        self.attached.resumed(self.turns)  # its images said, and read again where they still are
        if self.request.system is None:
            self.system = stored.system
        self._adopt_settings(stored.settings)
        if stored_here:
            self.conversation = stored.id
            if stored.model and stored.model != self.loaded.name:  # named: said, and kept per answer
                ui.info(
                    f"conversation {stored.id} was held with {stored.model}; {self.loaded.name} answers it "
                    f"from here on (runner history show {stored.id} names each answer's model)"
                )
                self._store(lambda s, c: s.set_model(c, self.loaded.name))
            if self.request.system is not None and stored.system != self.request.system:
                self._store(lambda s, c: s.set_system(c, self.system))
            if self.settings() != stored.settings:
                self._store(lambda s, c: s.set_settings(c, self.settings()))
        else:
            with self._holding():
                for message in self.turns:
                    self._persist(message)

    def set_system(self, system: str | None) -> None:
        """/set system: the system message from now on, stored with a conversation that is."""
        self.system = system
        if self.conversation is not None:
            self._store(lambda s, c: s.set_system(c, self.system))

    # -- settings: what /set changes, stored with the conversation ------------------------------------

    def settings(self) -> dict[str, Any]:
        """The conversation's settings as stored: sampling overrides, max_tokens, think, format or schema."""
        chosen: dict[str, Any] = dict(self.overrides)
        if self.max_tokens is not None:
            chosen["max_tokens"] = self.max_tokens
        if self.think is not None:
            chosen["think"] = self.think
        if self.constrained is not None:
            chosen[self.constrained[0]] = self.constrained[1]
        return chosen

    def set_sampling(self, name: str, value: Any, origin: str = "/set") -> None:
        """One sampling setting (None: back to the model's default), checked against its range."""
        overrides = {k: v for k, v in {**self.overrides, name: value}.items() if v is not None}
        self.sampling, sources = sampling_for(self.loaded, overrides)  # raises for a value out of range
        self.overrides = overrides
        self.origin = {k: o for k, o in {**self.origin, name: origin}.items() if k in overrides}
        self.sources = {k: (self.origin[k] if v == "flag" else v) for k, v in sources.items()}
        self._keep_settings()

    def set_max_tokens(self, value: int | None) -> None:
        check_answer_limits(value, ())
        self.max_tokens = value
        self._keep_settings()

    def set_think(self, value: bool | str | None) -> None:
        self.think = value
        self._keep_settings()

    def set_constraint(self, kind: str, value: str | None) -> None:
        """/set format json or /set schema S; value None: answers unconstrained."""
        self.constraint = constraint(**{kind: value}) if value is not None else None
        self.constrained = (kind, value) if self.constraint is not None and value is not None else None
        self._keep_settings()

    def _adopt_settings(self, stored: dict[str, Any]) -> None:
        """A stored conversation's settings, each unless a flag gave it (the flag wins)."""
        flags = {k for k, v in self.request.sampling.items() if v is not None}
        for f in dataclasses.fields(self.sampling):
            if f.name in stored and f.name not in flags:
                value = _typed(stored[f.name], int if str(f.type).startswith("int") else (int, float), f.name)
                self.set_sampling(f.name, value, origin="conversation")
        if "max_tokens" in stored and self.request.max_tokens is None:
            self.set_max_tokens(_typed(stored["max_tokens"], int, "max_tokens"))
        if "think" in stored and self.request.think is None:
            level = stored["think"]
            self.set_think(level if level in THINK_LEVELS else _typed(level, bool, "think"))
        for kind in ("format", "schema"):
            if kind in stored:
                self.set_constraint(kind, _typed(stored[kind], str, kind))

    def _keep_settings(self) -> None:
        if self.conversation is not None:
            self._store(lambda s, c: s.set_settings(c, self.settings()))

    def _store(self, action: Any) -> None:
        """Do a write, or give saving up (with one warning) when the database fails: the chat goes on."""
        if self.store is None:
            return
        try:
            if self.conversation is None:
                self.conversation = self.store.new_conversation(
                    self.loaded.name, self.system, self.settings()
                )
                if self._held is not None:  # created by a turn: held by it from its first message
                    self._held.enter_context(holding(self.store, self.conversation))
            action(self.store, self.conversation)
        except StoreError as exc:
            ui.warn(f"nothing more of this conversation is saved: {exc} (/save FILE still works)")
            self.store = None

    def _persist(self, message: StoredMessage) -> None:
        self._store(lambda s, c: s.add_message(c, message))

    def _forget(self, messages: list[StoredMessage]) -> None:
        ids = [m.id for m in messages if m.id is not None]
        if ids:
            self._store(lambda s, c: s.delete_messages(c, ids))

    @contextmanager
    def _holding(self) -> Iterator[None]:
        """A turn: the stored conversation to this runner alone until the block ends (another runner's
        turn waits), its turns first read again from the store, with what others added meanwhile."""
        with ExitStack() as held:
            if self.store is not None and self.conversation is not None:
                held.enter_context(holding(self.store, self.conversation))
                self._catch_up()
            self._held = held
            try:
                yield
            finally:
                self._held = None

    def _catch_up(self) -> None:
        assert self.store is not None and self.conversation is not None
        try:
            stored = self.store.load(self.conversation)
        except StoreError:
            return  # the write to come says so, and gives saving up
        if stored is None or [m.id for m in stored.messages] == [m.id for m in self.turns]:
            return
        added = user_turns(stored.messages) - user_turns(self.turns)
        if self.interactive and added > 0:
            ui.info(
                f"another runner added {ui.count(added, 'turn')} to this conversation; they are part of it"
            )
        self.turns, self.compaction = stored.messages, compact.stored(self.store, self.conversation)
        self.first = min(self.first, len(self.turns))

    # -- turns -----------------------------------------------------------------------------------

    def tool_defs(self) -> list[dict[str, Any]]:
        """The tools the model is shown now (OpenAI-shaped): the enabled ones of the host's servers."""
        return [tool.openai() for tool in self.host.tools()] if self.host is not None else []

    def _fitted(self, turns: list[StoredMessage], tools: list[dict[str, Any]] | None = None) -> Fitted:
        """What the model would be sent for these turns (nothing changes: see _fit)."""
        return compact.fitted(self, turns, tools)

    def _fit(self, turns: list[StoredMessage], tools: list[dict[str, Any]] | None = None) -> Fitted:
        """The next prompt: older turns compacted, or dropped, where they no longer fit (said)."""
        return compact.fit_turns(self, turns, tools)

    def compact(self) -> None:
        """/compact: the older turns summarised now."""
        with self._holding():
            compact.on_demand(self)

    def send(self, text: str) -> None:
        with self._holding():
            user = StoredMessage("user", text, images=tuple(self.attached.pending))
            fitted = self._fit([*self.turns, user])  # a message that cannot fit is refused before it is kept
            self.attached.pending.clear()  # they went with it
            self.turns.append(user)
            self._persist(user)  # committed before the answer starts
            self._answer(fitted)
            compact.ahead(self)  # the next turn would not fit: compacted now, while the answer is read

    def _answer(self, fitted: Fitted) -> None:
        if self.answers and not self.interactive and not self.quiet:
            self.out.write("\n")  # piped: one blank line between answers, so paragraphs do not run together
        self.answers += 1
        writer = HeldCalls(
            self.out,
            hide_reasoning=self.request.hide_reasoning,
            quiet=self.quiet,
            markdown=self.request.markdown,
            hold_all=self.quiet,  # run -c: stdout gets the final answer only
            verbose=self.request.verbose,
        )

        def lost(partial: Result) -> None:
            """A worker went away mid-answer: what came is kept as after a Ctrl-C. On ggml's thread,
            the process ending next (runner.engine.rpc.if_lost), so through a connection of its own."""
            writer.end()
            self.last, message = partial, self._message(partial)
            self.turns.append(message)
            if self.store is not None and self.conversation is not None:
                store = Store.open(self.store.path)
                try:
                    store.add_message(self.conversation, message)
                finally:
                    store.close()

        if self.host is not None and self.host.tools():
            answer = self._with_tools(writer, lost)
        else:
            asked = Request(
                fitted.prompt,
                self.sampling,
                max_tokens=self.max_tokens,
                stop=self.request.stop,
                shape=self.constraint,
                reasoning_budget=self.request.reasoning_budget,
            )
            with writer:
                answer = stream_answer(
                    self.loaded, asked, writer, prompt_cache=self.prompt_cache, if_lost=lost
                )
        writer.end()
        result = answer
        interrupted = result.finish_reason == FINISH_INTERRUPTED
        problem = shape_problem(result)
        if problem is not None and not self.quiet:  # run -c says it as its error (exit 1)
            ui.warn(problem)
        message = self._message(answer)
        self.turns.append(message)
        self._persist(message)
        self.last = answer
        if self.request.verbose:
            ui.info(describe_timings(result))
        if result.context_full:
            ui.warn(f"the answer reached the end of the {self.loaded.engine.context.n_ctx:,}-token context")
        if result.finish_reason == FINISH_REPEAT:
            ui.warn(LOOP_WARNING)
        if interrupted:
            if not self.interactive:
                raise KeyboardInterrupt  # a scripted chat stops here; what came is saved
            ui.info("interrupted: the partial answer stays in the conversation (/retry answers again)")

    def _with_tools(self, writer: HeldCalls, lost: Any) -> Result:
        """The turn through the agent loop (runner.commands.agent): each step kept (the turns, the
        store) as it is made; the last answer returned, to be kept as any answer is."""
        assert self.host is not None
        settings = self.request.tools or ToolSettings()
        see = self.attached.tool_images if self.attached.vision else None
        kept = Turns(self.turns, self.loaded.name, self._persist, see)

        def ask(choice: str | dict[str, Any]) -> Result:
            tools = self.tool_defs() if choice != "none" else []
            fitted = self._fit(self.turns, tools)
            forced = bool(tools) and choice not in ("auto", "none")
            shape = call_shape(tools, choice) if forced else self.constraint
            asked = Request(
                fitted.prompt, self.sampling, self.max_tokens, self.request.stop, shape, tuple(tools), forced
            )
            asked = replace(asked, reasoning_budget=self.request.reasoning_budget)
            with writer:
                result = stream_answer(
                    self.loaded, asked, writer, prompt_cache=self.prompt_cache, if_lost=lost
                )
                writer.release(result)
            return result

        answer, self.steps = answer_with_tools(ask, self.host, settings, self.approvals, kept)
        return answer

    def _message(self, result: Result) -> StoredMessage:
        """An answer as stored: its text, reasoning, how it ended and the model that gave it; its
        stats the answer's JSON (runner.engine.answer.result_json) laid flat."""
        data = result_json(result, STORED_TIMINGS, usage=())
        stats = {"finish_reason": result.finish_reason, **data["timings"]}
        stats.update({name: data[name] for name in ("speculation", "error") if name in data})
        interrupted = result.finish_reason == FINISH_INTERRUPTED
        reasoning = result.reasoning.strip() or None
        return StoredMessage(
            "assistant", result.text, reasoning, interrupted, stats=stats, model=self.loaded.name
        )

    def keep_state(self) -> None:
        """Store the evaluated conversation in the prompt cache, so that `--resume` and `run -c` load
        it instead of evaluating the history again: the tokens the KV cache shares with the prompt the
        next turn will send (the answer's own tokens may differ from their re-rendered text)."""
        engine = self.loaded.engine
        if self.prompt_cache is None or not self.turns or len(engine.context.cells[0]) < MIN_HEAD:
            return
        try:
            upcoming = self._fitted([*self.turns, StoredMessage("user", "\x00")]).prompt.tokens
        except RunnerError:
            return
        shared = min(
            engine.context.shared_prefix(upcoming), text_head(upcoming)
        )  # images are not kept on disk
        if shared >= MIN_HEAD and engine.context.drop_after(shared):
            self.prompt_cache.store(engine.context, upcoming[:shared])

    def retry(self) -> None:
        with self._holding():
            answers = []
            while self.turns and self.turns[-1].role == "assistant":
                answers.append(self.turns.pop())
            if not self.turns:
                raise UsageError("nothing to retry yet")
            fitted = self._fit(self.turns)
            self._forget(answers)
            self._answer(fitted)

    def undo(self) -> None:
        with self._holding():
            if not self.turns:
                raise UsageError("nothing to undo")
            gone = []
            while self.turns and self.turns[-1].role == "assistant":
                gone.append(self.turns.pop())
            if self.turns:
                gone.append(self.turns.pop())
            self._forget(gone)
            self.first = min(self.first, len(self.turns))
        ui.info(f"dropped the last exchange ({user_turns(self.turns)} left)")

    def clear(self) -> None:
        self.turns, self.conversation, self.first, self.compaction = [], None, 0, None
        ui.info("a new conversation")

    def context_used(self) -> int:
        """The tokens of the context the conversation takes: the prompt its turns make (0 with none;
        what the KV cache holds of an earlier conversation is not counted)."""
        if not self.turns:
            return 0
        try:
            return len(self._fitted(self.turns).prompt.tokens)
        except RunnerError:
            return len(self.loaded.engine.context.cells[0])

    def times(self) -> tuple[float, float]:
        """When the conversation was created and last updated: the store's times once it is stored."""
        if self.store is not None and self.conversation is not None:
            try:
                stored = self.store.load(self.conversation)
            except StoreError:
                stored = None
            if stored is not None:
                return stored.created, stored.updated
        now = time.time()
        return (self.turns[0].created, self.turns[-1].created) if self.turns else (now, now)


def _typed(value: Any, kind: type | tuple[type, ...], name: str) -> Any:
    """A stored setting of the type it must have (a hand-edited file may hold anything)."""
    if value is None or (isinstance(value, kind) and isinstance(value, bool) == (kind is bool)):
        return value
    wanted = "a number"
    if isinstance(kind, type):
        wanted = {int: "an integer", bool: "true or false", str: "text"}.get(kind, wanted)
    raise UsageError(f"the conversation's setting {name} must be {wanted} (got {value!r})")
