"""`runner chat`: a conversation in a terminal, or scripted through a pipe, kept as it happens.

A loop that is only a loop (mlx-lm's chat.py): read a message, handle the few slash commands, send
it, stream the answer, repeat. Keys, history and paste are prompt_toolkit's (lineinput.py); the
template, the context and the generation are the engine's; the store keeps every turn.

Ctrl-C while the model answers stops that answer within one token (runner.interrupt): what came of it
stays in the conversation, marked interrupted, and the prompt returns (a piped chat exits 130 instead).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from runner import interrupt, ui
from runner.commands.lineinput import QUIT_HINT, PipeInput, TerminalInput
from runner.commands.output import (
    AnswerWriter,
    describe_load,
    describe_sampling,
    describe_speculation,
    describe_timings,
    open_prompt_cache,
    sampling_for,
    speculation_json,
    stream_answer,
    to_json,
)
from runner.engine.constrain import Constraint, ConstraintError, constraint
from runner.engine.conversation import Fitted, fit
from runner.engine.engine import FINISH_INTERRUPTED
from runner.engine.promptcache import MIN_HEAD
from runner.engine.reasoning import style_of
from runner.engine.template import TEMPLATE_KEY, Message
from runner.errors import InvalidSetting, PromptTooLong, RunnerError, UsageError
from runner.hub.catalog import load_catalog
from runner.limits import check_answer_limits, flash_attn_setting, spec_setting
from runner.loader import LoadedModel, open_model
from runner.paths import data_dir
from runner.store import (
    Store,
    StoredConversation,
    StoredMessage,
    StoreError,
    from_json,
    saving_disabled,
)
from runner.store import (
    to_json as conversation_json,
)

COMMANDS = {
    "/help": "this list",
    "/set": "/set PARAM VALUE: "
    + ", ".join(
        ["temperature", "top-k", "top-p", "min-p", "repeat-penalty", "presence-penalty"]
        + ["frequency-penalty", "seed", "max-tokens", "system", "think", "format json|none", "schema S|none"]
    ),
    "/show": "model, file, parameters and where they came from, template, context used",
    "/stats": "the last answer's timings and the tokens it evaluated",
    "/clear": "start a new conversation",
    "/retry": "answer the last message again",
    "/undo": "drop the last exchange",
    "/save": "/save FILE: the conversation as JSON",
    "/load": "/load FILE: continue a conversation saved as JSON",
    "/history": "recent conversations (runner chat --resume ID opens one)",
    "/edit": "write the next message in $EDITOR",
    "/bye": "quit (also /exit, Ctrl-D)",
    "/exit": "quit",
}
SAMPLING_PARAMS = {
    "temperature": "temperature",
    "top-k": "top_k",
    "top-p": "top_p",
    "min-p": "min_p",
    "repeat-penalty": "repeat_penalty",
    "repeat-last-n": "repeat_last_n",
    "presence-penalty": "presence_penalty",
    "frequency-penalty": "frequency_penalty",
    "seed": "seed",
}
INTEGER_PARAMS = {"top_k", "repeat_last_n", "seed"}
COMMAND = re.compile(r"/[A-Za-z-]+")
HISTORY_FILE = "chat_input_history"


@dataclass(frozen=True)
class ChatRequest:
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
        ui.info(f"dropped the last exchange ({_users(self.turns)} left)")

    def clear(self) -> None:
        self.turns, self.conversation, self.first = [], None, 0
        ui.info("a new conversation")

    # -- slash commands ----------------------------------------------------------------------------

    def command(self, line: str, source: Any) -> bool:
        """Handle a slash command; False means quit."""
        name, _, rest = line.strip().partition(" ")
        name, rest = name.lower(), rest.strip()
        if name in ("/bye", "/exit"):
            return False
        handlers = {
            "/help": lambda: ui.echo(_help()),
            "/set": lambda: self.set(rest),
            "/show": lambda: ui.echo(self.show()),
            "/stats": lambda: ui.echo(self.stats()),
            "/clear": self.clear,
            "/retry": self.retry,
            "/undo": self.undo,
            "/save": lambda: self.save(rest),
            "/load": lambda: self.load(rest),
            "/history": lambda: ui.echo(self.history()),
            "/edit": lambda: self._edit(source),
        }
        if name not in handlers:
            raise UsageError(f"unknown command {name}; valid: {', '.join(COMMANDS)}")
        handlers[name]()
        return True

    def _edit(self, source: Any) -> None:
        text = source.edit()
        if text:
            self.send(text)

    def set(self, args: str) -> None:
        param, _, value = args.partition(" ")
        param, value = param.strip().lower().replace("_", "-"), value.strip()
        valid = ", ".join([*SAMPLING_PARAMS, "max-tokens", "system", "think", "format", "schema"])
        if not param:
            raise UsageError(f"/set PARAM VALUE; PARAM is one of {valid}")
        if param == "system":
            self.system = value or None
            if self.conversation is not None:
                self._store(lambda s, c: s.set_system(c, self.system))
            ui.info(f"system message: {self.system!r}" if self.system else "no system message")
        elif param == "max-tokens":
            max_tokens = _number(param, value, int, allow_none=True)
            check_answer_limits(max_tokens, ())
            self.max_tokens = max_tokens
        elif param == "think":
            choices = {"on": True, "off": False, "default": None}
            if value.lower() not in choices:
                raise UsageError("/set think on|off|default")
            self.think = choices[value.lower()]
        elif param in ("format", "schema"):
            off = value.lower() in ("", "none", "off")
            self.constraint = None if off else constraint(**{param: value})
            ui.info(f"answers constrained: {param} {value}" if self.constraint else "answers unconstrained")
        elif param in SAMPLING_PARAMS:
            name = SAMPLING_PARAMS[param]
            parsed = _number(
                param, value, int if name in INTEGER_PARAMS else float, allow_none=name == "seed"
            )
            overrides = {**self.overrides, name: parsed}
            if parsed is None:
                overrides.pop(name)
            self.sampling, sources = sampling_for(self.loaded, overrides)  # checks the range
            self.overrides = overrides
            self.set_here = (self.set_here | {name}) if parsed is not None else (self.set_here - {name})
            self.sources = {k: ("/set" if k in self.set_here else v) for k, v in sources.items()}
        else:
            raise UsageError(f"/set {param}: unknown; valid: {valid}")

    def show(self) -> str:
        engine, header = self.loaded.engine, self.loaded.header
        template = header.get(TEMPLATE_KEY)
        style = style_of(template if isinstance(template, str) else None)
        if isinstance(template, str) and template.strip():
            source = f"the GGUF's tokenizer.chat_template ({len(template):,} characters)"
            source += f"; reasoning: {style}" if style else ""
        else:
            source = "none in the GGUF: plain text"
        saved = f"conversation {self.conversation}" if self.conversation else "not saved yet"
        rows = [
            ("model", f"{self.loaded.name} ({self.loaded.path})"),
            ("load", describe_load(self.loaded)),
            ("context", f"{engine.n_cached:,} of {engine.n_ctx:,} tokens used"),
            (
                "turns",
                f"{_users(self.turns)} ({_users(self.turns[: self.first])} no longer sent to the model)",
            ),
            ("system", repr(self.system) if self.system else "none (the template's default, if it has one)"),
            ("sampling", describe_sampling(self.sampling, self.sources)),
            ("max-tokens", str(self.max_tokens) if self.max_tokens else "none (until the model ends)"),
            ("think", {None: "the template's default", True: "on", False: "off"}[self.think]),
            ("template", source),
            ("stored", saved if self.store is not None else "off (--no-save, or the database failed)"),
        ]
        width = max(len(k) for k, _ in rows) + 2
        return "\n".join(f"{k:<{width}}{v}" for k, v in rows)

    def stats(self) -> str:
        if self.last is None:
            return "no answer yet"
        t = self.last.result.timings
        return (
            f"ttft {t.ttft_s:.3f} s · prompt {t.prompt_tokens} tokens, {t.prefill_tokens} evaluated "
            f"(the rest from the KV cache) · prefill {t.prefill_tokens_per_s:.1f} tok/s · "
            f"{t.completion_tokens} tokens at {t.decode_tokens_per_s:.1f} tok/s · "
            f"finish {self.last.result.finish_reason}{describe_speculation(t.speculation)}"
        )

    def history(self) -> str:
        if self.store is None:
            return "the conversation store is off"
        rows = self.store.summaries(limit=10)
        if not rows:
            return "no conversations yet"
        return "\n".join(
            f"{s.id:>5}  {s.model}  {s.turns} turn{'s' if s.turns != 1 else ''}  "
            f"{ui.human_since(s.updated)}  {s.first_words}"
            for s in rows
        )

    def save(self, name: str) -> None:
        if not name:
            raise UsageError("/save FILE")
        path = Path(name).expanduser()
        data = conversation_json(
            StoredConversation(self.conversation or 0, self.loaded.name, self.system, 0, 0, self.turns)
        )
        try:
            path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from exc
        ui.info(f"saved {len(self.turns)} messages to {path}")

    def load(self, name: str) -> None:
        if not name:
            raise UsageError("/load FILE")
        stored = read_conversation(Path(name).expanduser())
        self.adopt(stored, stored_here=False)
        ui.info(f"loaded {len(self.turns)} messages from {name}")


def _number(param: str, value: str, kind: type, *, allow_none: bool) -> Any:
    if allow_none and value.lower() in ("none", "random", "off", ""):
        return None
    try:
        return kind(value)
    except ValueError:
        wanted = "an integer" if kind is int else "a number"
        raise InvalidSetting(f"/set {param} needs {wanted} (got {value!r})") from None


def _users(turns: list[StoredMessage]) -> int:
    return sum(1 for m in turns if m.role == "user")


def _help() -> str:
    width = max(map(len, COMMANDS)) + 2
    lines = [f"{name:<{width}}{text}" for name, text in COMMANDS.items()]
    return "\n".join([*lines, '"""       opens and closes a message of several lines', QUIT_HINT])


def read_conversation(path: Path) -> StoredConversation:
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


def open_store(save: bool) -> Store | None:
    """The conversation store, or None (with a warning when it should have opened)."""
    if not save or saving_disabled():
        return None
    try:
        return Store.open()
    except StoreError as exc:
        ui.warn(f"conversations are not saved: {exc}")
        return None


def _stored(store: Store | None, resume: str) -> StoredConversation:
    if store is None:
        raise UsageError("--resume needs the conversation store (it is off, or could not be opened)")
    if resume == "last":
        latest = store.latest()
        if latest is None:
            raise UsageError("no conversation to resume yet; start one with runner chat")
        found = store.load(latest)
    else:
        if not resume.isdigit():
            raise UsageError(f"--resume takes a conversation id (runner history lists them), not {resume!r}")
        found = store.load(int(resume))
        if found is None:
            raise UsageError(f"no conversation {resume} (runner history lists them)")
    assert found is not None
    return found


def _open(request: ChatRequest, model: str) -> LoadedModel:
    return open_model(
        model,
        ctx=request.ctx,
        threads=request.threads,
        gpu_layers=request.gpu_layers,
        kv_type=request.kv_type,
        flash_attn=flash_attn_setting(request.flash_attn),
        growing=request.flash_attn is None,  # a chat's context fills: the plan may turn it off on the CPU
        force=request.force,
        offline=request.offline,
        debug=request.debug,
        spec=spec_setting(request.spec, request.draft),
        draft=request.draft,
    )


def chat(request: ChatRequest, *, stdin: TextIO, out: TextIO, interactive: bool) -> None:
    """The chat: on a terminal, the REPL; through a pipe, one user turn per line, answers on out."""
    check_answer_limits(request.max_tokens, request.stop)
    flash_attn_setting(request.flash_attn)  # a bad value: one line before anything opens
    spec_setting(request.spec, request.draft)
    store = open_store(request.save)
    try:
        stored, stored_here = None, False
        if request.resume is not None:
            stored, stored_here = _stored(store, request.resume), True
        elif request.load is not None:
            stored = read_conversation(request.load)
        model = request.model or (stored.model if stored is not None and stored.model else None)
        loaded = _open(request, model or load_catalog().default)
        try:
            session = Session(loaded, request, store, out, interactive)
            if stored is not None:
                session.adopt(stored, stored_here=stored_here)
            try:
                _loop(session, interactive, stdin)
            finally:
                with interrupt.deferred():
                    session.keep_state()
        finally:
            loaded.close()
    finally:
        if store is not None:
            store.close()


def _loop(session: Session, interactive: bool, stdin: TextIO) -> None:
    template = session.loaded.header.get(TEMPLATE_KEY)
    if not isinstance(template, str) or not template.strip():
        ui.warn(f"{session.loaded.name} has no chat template; turns go as plain 'User:/Assistant:' text")
    if interactive:
        if session.request.verbose:
            ui.info(describe_load(session.loaded))
        resumed = f", {_users(session.turns)} turns so far" if session.turns else ""
        ui.info(f"chatting with {session.loaded.name}{resumed}; /help for commands, {QUIT_HINT}")
        if session.turns and session.turns[-1].role == "user":
            ui.info("the last message has no answer (the chat stopped mid-answer): /retry answers it")
        history = data_dir() / HISTORY_FILE if session.store is not None else None
        source: Any = TerminalInput(history, list(COMMANDS))
    else:
        source = PipeInput(stdin)
    failed = False
    while True:
        try:
            text = source.read()
            if text is None:
                break
            if not _turn(session, text, source):
                break
        except (UsageError, PromptTooLong) as exc:  # bad input: one line, and the chat goes on
            ui.error(str(exc))
            failed = True
        except RunnerError as exc:
            if not interactive:
                raise
            ui.error(str(exc))
        except KeyboardInterrupt:  # a Ctrl-C between answers (before the prompt is back, in a command)
            if not interactive:
                raise
            ui.info(QUIT_HINT)
    if failed and not interactive:
        raise UsageError("some lines were refused (said above); the others were answered")


def _turn(session: Session, text: str, source: Any) -> bool:
    """One line of input: a slash command or a message. False: quit."""
    with interrupt.deferred():  # Ctrl-C stops an answer; it never lands in a store write
        if COMMAND.fullmatch(text.strip().split(" ", 1)[0]):
            return session.command(text, source)
        session.send(text)
        return True


def continue_last(request: ChatRequest, prompt: str, *, out: TextIO, as_json: bool) -> None:
    """`runner run -c PROMPT`: one more turn of the last conversation, the answer alone on stdout."""
    check_answer_limits(request.max_tokens, request.stop)
    flash_attn_setting(request.flash_attn)
    spec_setting(request.spec, request.draft)
    store = open_store(True)
    if store is None:
        raise UsageError("-c continues the last stored conversation, and the store is off")
    try:
        stored = _stored(store, request.resume or "last")
        loaded = _open(request, request.model or stored.model or load_catalog().default)
        try:
            session = Session(loaded, request, store, out, interactive=False, quiet=as_json)
            session.adopt(stored, stored_here=True)
            if not request.save:  # --no-save: the conversation is read, this turn is not kept
                session.store = None
            with interrupt.deferred():
                session.send(prompt)
                session.keep_state()
            if as_json:
                out.write(json.dumps(to_json(loaded.name, session.last), ensure_ascii=False) + "\n")
        finally:
            loaded.close()
    finally:
        store.close()
