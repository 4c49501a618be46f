"""`runner chat`: a conversation in a terminal, or scripted through a pipe, kept as it happens.

A loop that is only a loop (mlx-lm's chat.py): read a message, handle the few slash commands
(slash.py), send it, stream the answer, repeat (session.py). Keys, history and paste are
prompt_toolkit's (lineinput.py); the template, the context and the generation are the engine's; the
store keeps every turn.

Ctrl-C while the model answers stops that answer within one token (runner.interrupt): what came of it
stays in the conversation, marked interrupted, and the prompt returns (a piped chat exits 130 instead).
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import replace
from typing import Any, TextIO

from runner import interrupt, ui
from runner.commands.agent import Servers
from runner.commands.attach import NO_PROJECTOR_C, pasted_path, read_attachments
from runner.commands.lineinput import QUIT_HINT, PipeInput, TerminalInput
from runner.commands.output import describe_load, shape_problem, shaped, to_json
from runner.commands.session import ChatRequest, Session
from runner.commands.slash import COMMANDS, command, is_command, recap
from runner.engine import rpc
from runner.engine.answer import FINISH_INTERRUPTED
from runner.engine.text.constrain import constraint
from runner.engine.text.template import TEMPLATE_KEY
from runner.errors import PromptTooLong, RunnerError, UsageError
from runner.hub.catalog import load_catalog
from runner.limits import check_answer_limits
from runner.loader import LoadedModel, open_model
from runner.paths import data_dir
from runner.store import Store, StoredConversation, StoreError, saving_disabled, user_turns
from runner.store.file import read_conversation

HISTORY_FILE = "chat_input_history"


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
    # a chat's context fills: unless --flash-attn was given, the plan may turn it off on the CPU;
    # without --mmproj, the projector pulled with the model (runner.projector.find)
    growing = request.settings.flash_attn is None
    return open_model(model, replace(request.settings, growing=growing, vision=True))


def chat(request: ChatRequest, *, stdin: TextIO, out: TextIO, interactive: bool) -> None:
    """The chat: on a terminal, the REPL; through a pipe, one user turn per line, answers on out."""
    check_answer_limits(request.max_tokens, request.stop)
    store = open_store(request.save)
    try:
        stored, stored_here = None, False
        if request.resume is not None:
            stored, stored_here = _stored(store, request.resume), True
        elif request.load is not None:
            stored = read_conversation(request.load)
        model = request.model or (stored.model if stored is not None and stored.model else None)
        servers = _servers(request, default=True)  # started beside the load
        try:
            loaded = _open(request, model or load_catalog().default)
            try:
                session = Session(loaded, request, store, out, interactive)
                # the prompt made (prompt_toolkit's import, ~0.2 s) while the servers start
                source = _terminal(session) if interactive else PipeInput(stdin)
                session.host = servers.ready() if servers is not None else None
                if stored is not None:
                    session.adopt(stored, stored_here=stored_here)
                try:
                    _loop(session, interactive, source)
                finally:
                    with interrupt.deferred():
                        session.keep_state()
            finally:
                loaded.close()
        finally:
            if servers is not None:
                servers.close()
    finally:
        if store is not None:
            store.close()


def _servers(request: ChatRequest, *, default: bool) -> Servers | None:
    """The MCP servers of --mcp and mcp.json, starting while the model loads (None: no tools)."""
    if request.tools is None:
        return None
    request.tools.check()
    return Servers(request.tools, default=default, verbose=request.verbose)


def _terminal(session: Session) -> TerminalInput:
    history = data_dir() / HISTORY_FILE if session.store is not None else None
    return TerminalInput(history, list(COMMANDS))


def _loop(session: Session, interactive: bool, source: Any) -> None:
    template = session.loaded.header.get(TEMPLATE_KEY)
    if not isinstance(template, str) or not template.strip():
        ui.warn(f"{session.loaded.name} has no chat template; turns go as plain 'User:/Assistant:' text")
    if interactive:
        if session.request.verbose:
            ui.info(describe_load(session.loaded))
        resumed = f", {user_turns(session.turns)} turns so far" if session.turns else ""
        images = ", /image PATH to attach an image" if session.attached.vision else ""
        ui.info(f"chatting with {session.loaded.name}{resumed}; /help for commands{images}, {QUIT_HINT}")
        recap(session)
        if session.turns and session.turns[-1].role == "user":
            ui.info("the last message has no answer (the chat stopped mid-answer): /retry answers it")
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
    """One line of input: a slash command, an image file's path (on a terminal, attached if the user
    says so), or a message. False: quit."""
    pasted = pasted_path(text) if session.attached.vision and not is_command(text) else None
    attach = source.confirm(f"attach {pasted.name} to your next message? [Y/n] ") if pasted else False
    if attach is None:  # Ctrl-C or Ctrl-D at the question: neither attached nor sent
        return True
    if attach and pasted is not None:
        session.attached.attach(str(pasted))
        return True
    with interrupt.deferred():  # Ctrl-C stops an answer; it never lands in a store write
        if is_command(text):
            return command(session, text, source)
        session.send(text)
        return True


def continue_last(
    request: ChatRequest,
    prompt: str,
    *,
    out: TextIO,
    as_json: bool,
    shape: tuple[str, str] | None = None,
    images: tuple[str, ...] = (),
) -> None:
    """`runner run -c PROMPT`: one more turn of the last conversation, the answer alone on stdout.
    `shape`: --format json or --schema S, kept with the conversation as /set keeps it; `images`:
    --image files, carried by this turn's message as /image attaches them. An answer held to a shape
    (by the flag, or by the conversation's /set) is written once checked, as `run --format json`
    writes it: one cut short or invalid is kept in the conversation and exits 1 with nothing on stdout."""
    check_answer_limits(request.max_tokens, request.stop)
    if shape is not None:
        constraint(**{shape[0]: shape[1]})  # checked before anything loads
    attached = read_attachments(images)
    store = open_store(True)
    if store is None:
        raise UsageError("-c continues the last stored conversation, and the store is off")
    try:
        stored = _stored(store, request.resume or "last")
        with ExitStack() as stack:
            servers = _servers(request, default=True)
            if servers is not None:
                stack.callback(servers.close)
            loaded = _open(request, request.model or stored.model or load_catalog().default)
            stack.callback(loaded.close)
            kept = store if request.save else None  # --no-save: the conversation is read, nothing is kept
            session = Session(loaded, request, kept, out, interactive=False, quiet=as_json)
            session.host = servers.ready() if servers is not None else None
            session.adopt(stored, stored_here=True)
            if shape is not None:
                session.set_constraint(*shape)
            if attached and not session.attached.vision:
                raise UsageError(NO_PROJECTOR_C)
            for path, image in attached:
                session.attached.add(path, image)
            held = session.constraint is not None and session.constraint.is_json
            session.quiet = as_json or held  # a shaped answer is written once checked
            _continue(session, prompt, as_json=as_json, held=held)
    finally:
        store.close()


def _continue(session: Session, prompt: str, *, as_json: bool, held: bool) -> None:
    """run -c's turn: sent, kept, and its answer written (whole, or as one JSON object)."""
    out, name = session.out, session.loaded.name

    def printed() -> None:  # the answer, whole or partial (a worker gone); a shaped one only if it holds
        last = session.last
        if last is None:
            return
        if held and last.finish_reason != FINISH_INTERRUPTED:
            if shape_problem(last) is not None:
                return  # said below: exit 1, nothing on stdout
            last = replace(last, text=last.text.strip())
            if not as_json:
                out.write(last.text + "\n")
        if as_json:
            data = to_json(name, last)
            if session.host is not None:
                data["steps"] = [step.to_json() for step in session.steps]
            out.write(json.dumps(data, ensure_ascii=False) + "\n")
        out.flush()

    try:
        with interrupt.deferred(), rpc.if_lost(lambda _why: printed()):  # after the session kept it
            session.send(prompt)
            session.keep_state()
    finally:
        printed()  # an answer came, whole or interrupted
    if held and session.last is not None and session.last.finish_reason != FINISH_INTERRUPTED:
        shaped(session.last)  # ConstraintError (exit 1) where it is not the shape asked for
