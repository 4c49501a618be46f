"""The chat's session: one loaded model and the conversation with it, the settings it is opened with
(ChatRequest), the turns sent and answered, and their store.

Sending a message fits the conversation to the context (the oldest exchanges give way), streams the answer
and keeps both turns; /retry, /undo and /clear change the turns here too. A store that fails stops saving
and the chat goes on; at the end the evaluated state goes to the prompt cache for --resume and `run -c`.
Not a command itself: chat.py runs the loop, slash.py the slash commands over a Session.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from runner import ui
from runner.commands.output import (
    AnswerWriter,
    describe_timings,
    open_prompt_cache,
    sampling_for,
    speculation_json,
    stream_answer,
)
from runner.engine.constrain import Constraint, ConstraintError
from runner.engine.conversation import Fitted, fit
from runner.engine.engine import FINISH_INTERRUPTED
from runner.engine.promptcache import MIN_HEAD
from runner.engine.template import Message
from runner.errors import RunnerError, UsageError
from runner.loader import LoadedModel
from runner.store import Store, StoredConversation, StoredMessage, StoreError, from_json


@dataclass(frozen=True)
class ChatRequest:
    """What `runner chat` (or `runner run -c`) was asked for: its flags, as typed."""

    model: str | None = None
    system: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    ctx: int | None = None
    threads: int | None = None
    gpu_layers: int | None = None
    kv_type: str | None = None
    flash_attn: str | None = None  # --flash-attn as typed: auto, on, off; None: not given
    spec: str | None = None  # --spec as typed
    draft: str | None = None  # --draft MODEL
    prompt_cache: bool = True  # --no-prompt-cache: False
    prompt_cache_size: str | None = None  # --prompt-cache-size as typed
    force: bool = False
    offline: bool = False
    debug: bool = False
    verbose: bool = False
    save: bool = True
    resume: str | None = None  # "last", or a conversation id
    load: Path | None = None
    markdown: bool = False
    think: bool | None = None
    hide_reasoning: bool = False


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
        self.set_here: set[str] = set()  # sampling settings changed with /set (the rest: flags)
        self.sampling, self.sources = sampling_for(loaded, self.overrides)
        self.max_tokens = request.max_tokens
        self.think = request.think
        self.constraint: Constraint | None = None  # /set format json, /set schema ...
        entry_system = loaded.entry.system if loaded.entry is not None else None
        self.system = request.system if request.system is not None else entry_system
        self.turns: list[StoredMessage] = []
        self.conversation: int | None = None
        self.first = 0  # the first turn sent to the model (older exchanges dropped to fit)
        self.last: Any = None  # the last Answer
        # the conversation's evaluated state is kept on disk at the end, loaded by --resume and -c
        self.prompt_cache = open_prompt_cache(request.prompt_cache, request.prompt_cache_size)

    # -- the conversation and its store ------------------------------------------------------------

    def adopt(self, stored: StoredConversation, *, stored_here: bool) -> None:
        """Continue a stored or loaded conversation; its system message unless -s says otherwise."""
        self.turns = list(stored.messages)
        if self.request.system is None:
            self.system = stored.system
        self.first = 0
        if stored_here:
            self.conversation = stored.id
            if self.request.system is not None and stored.system != self.request.system:
                self._store(lambda s, c: s.set_system(c, self.system))
        else:
            self.conversation = None
            for message in self.turns:
                self._persist(message)

    def set_system(self, system: str | None) -> None:
        """/set system: the system message from now on, stored with a conversation that is."""
        self.system = system
        if self.conversation is not None:
            self._store(lambda s, c: s.set_system(c, self.system))

    def _store(self, action: Any) -> None:
        """Do a write, or give saving up (with one warning) when the database fails: the chat goes on."""
        if self.store is None:
            return
        try:
            if self.conversation is None:
                self.conversation = self.store.new_conversation(self.loaded.name, self.system)
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

    # -- turns -----------------------------------------------------------------------------------

    def _fitted(self, turns: list[StoredMessage]) -> Fitted:
        """What the model would be sent for these turns (nothing changes: see _fit)."""
        return fit(
            self.loaded.engine,
            self.loaded.header,
            self.system,
            [Message(t.role, t.content) for t in turns],
            first=self.first,
            max_tokens=self.max_tokens,
            enable_thinking=self.think,
        )

    def _fit(self, turns: list[StoredMessage]) -> Fitted:
        fitted = self._fitted(turns)
        if fitted.first > self.first:
            dropped = fitted.dropped_exchanges
            ui.info(
                f"the context is full: the {dropped} oldest exchange{'s' if dropped > 1 else ''} no longer "
                "reach the model (the system message stays; /show says how full it is)"
            )
        self.first = fitted.first
        return fitted

    def send(self, text: str) -> None:
        user = StoredMessage("user", text)
        fitted = self._fit([*self.turns, user])  # a message that cannot fit is refused before it is kept
        self.turns.append(user)
        self._persist(user)  # committed before the answer starts
        self._answer(fitted)

    def _answer(self, fitted: Fitted) -> None:
        writer = AnswerWriter(
            self.out,
            hide_reasoning=self.request.hide_reasoning,
            quiet=self.quiet,
            markdown=self.request.markdown,
        )
        with writer:
            answer = stream_answer(
                self.loaded,
                fitted.prompt,
                self.sampling,
                writer,
                max_tokens=self.max_tokens,
                stop=self.request.stop,
                grammar=self.constraint.grammar if self.constraint else None,
                prompt_cache=self.prompt_cache,
            )
        writer.end()
        result = answer.result
        interrupted = result.finish_reason == FINISH_INTERRUPTED
        if self.constraint is not None and not interrupted:
            try:
                self.constraint.check(answer.text, result.finish_reason)
            except ConstraintError as exc:
                ui.warn(str(exc))
        t = result.timings
        stats = {
            "finish_reason": result.finish_reason,
            "prompt_tokens": t.prompt_tokens,
            "prefill_tokens": t.prefill_tokens,
            "completion_tokens": t.completion_tokens,
            "ttft_s": round(t.ttft_s, 4),
            "prefill_tokens_per_s": round(t.prefill_tokens_per_s, 2),
            "decode_tokens_per_s": round(t.decode_tokens_per_s, 2),
        }
        if t.speculation.mode != "none":
            stats["speculation"] = speculation_json(t.speculation)
        message = StoredMessage(
            "assistant", answer.text, reasoning=answer.reasoning or None, interrupted=interrupted, stats=stats
        )
        self.turns.append(message)
        self._persist(message)
        self.last = answer
        if self.request.verbose:
            ui.info(describe_timings(result))
        if result.context_full:
            ui.warn(f"the answer reached the end of the {self.loaded.engine.n_ctx:,}-token context")
        if interrupted:
            if not self.interactive:
                raise KeyboardInterrupt  # a scripted chat stops here; what came is saved
            ui.info("interrupted: the partial answer stays in the conversation (/retry answers again)")

    def keep_state(self) -> None:
        """Store the evaluated conversation in the prompt cache, so that `--resume` and `run -c` load
        it instead of evaluating the history again: the tokens the KV cache shares with the prompt the
        next turn will send (the answer's own tokens may differ from their re-rendered text)."""
        engine = self.loaded.engine
        if self.prompt_cache is None or not self.turns or engine.n_cached < MIN_HEAD:
            return
        try:
            upcoming = self._fitted([*self.turns, StoredMessage("user", "\x00")]).prompt.tokens
        except RunnerError:
            return
        shared = engine.shared_prefix(upcoming)
        if shared >= MIN_HEAD and engine.drop_after(shared):
            self.prompt_cache.store(engine, upcoming[:shared])

    def retry(self) -> None:
        answers = []
        while self.turns and self.turns[-1].role == "assistant":
            answers.append(self.turns.pop())
        if not self.turns:
            raise UsageError("nothing to retry yet")
        fitted = self._fit(self.turns)
        self._forget(answers)
        self._answer(fitted)

    def undo(self) -> None:
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
        self.turns, self.conversation, self.first = [], None, 0
        ui.info("a new conversation")


def user_turns(turns: list[StoredMessage]) -> int:
    """How many of these turns are the user's: the count /show, /undo and a resumed chat report."""
    return sum(1 for m in turns if m.role == "user")


def read_conversation(path: Path) -> StoredConversation:
    """A conversation saved as JSON (/save FILE), for --load and /load."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not JSON ({exc.msg}, line {exc.lineno})") from exc
    return from_json(data, str(path))
