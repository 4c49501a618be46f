"""The chat's slash commands: /set, /show, /stats, /history, /save, /load, /edit and the rest, as
functions over a Session, with the table of their names and help.

`command` dispatches one line to its handler; a bad command or value raises UsageError (one line, and
the chat goes on). The conversation itself (sending, /retry, /undo, /clear) is the Session's.
Not a command itself: a helper of chat.py, as output.py and lineinput.py are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from runner import ui
from runner.commands.lineinput import QUIT_HINT
from runner.commands.output import describe_load, describe_sampling, describe_speculation, sampling_for
from runner.commands.session import Session, read_conversation, user_turns
from runner.engine.constrain import constraint
from runner.engine.reasoning import style_of
from runner.engine.template import TEMPLATE_KEY
from runner.errors import InvalidSetting, UsageError
from runner.limits import check_answer_limits
from runner.store import StoredConversation
from runner.store import to_json as conversation_json

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


def is_command(line: str) -> bool:
    """Whether a line is a slash command (its first word, /letters) rather than a message."""
    return COMMAND.fullmatch(line.strip().split(" ", 1)[0]) is not None


def command(session: Session, line: str, source: Any) -> bool:
    """Handle a slash command; False means quit."""
    name, _, rest = line.strip().partition(" ")
    name, rest = name.lower(), rest.strip()
    if name in ("/bye", "/exit"):
        return False
    handlers = {
        "/help": lambda: ui.echo(_help()),
        "/set": lambda: _set(session, rest),
        "/show": lambda: ui.echo(_show(session)),
        "/stats": lambda: ui.echo(_stats(session)),
        "/clear": session.clear,
        "/retry": session.retry,
        "/undo": session.undo,
        "/save": lambda: _save(session, rest),
        "/load": lambda: _load(session, rest),
        "/history": lambda: ui.echo(_history(session)),
        "/edit": lambda: _edit(session, source),
    }
    if name not in handlers:
        raise UsageError(f"unknown command {name}; valid: {', '.join(COMMANDS)}")
    handlers[name]()
    return True


def _edit(session: Session, source: Any) -> None:
    text = source.edit()
    if text:
        session.send(text)


def _set(session: Session, args: str) -> None:
    param, _, value = args.partition(" ")
    param, value = param.strip().lower().replace("_", "-"), value.strip()
    valid = ", ".join([*SAMPLING_PARAMS, "max-tokens", "system", "think", "format", "schema"])
    if not param:
        raise UsageError(f"/set PARAM VALUE; PARAM is one of {valid}")
    if param == "system":
        session.set_system(value or None)
        ui.info(f"system message: {session.system!r}" if session.system else "no system message")
    elif param == "max-tokens":
        max_tokens = _number(param, value, int, allow_none=True)
        check_answer_limits(max_tokens, ())
        session.max_tokens = max_tokens
    elif param == "think":
        choices = {"on": True, "off": False, "default": None}
        if value.lower() not in choices:
            raise UsageError("/set think on|off|default")
        session.think = choices[value.lower()]
    elif param in ("format", "schema"):
        off = value.lower() in ("", "none", "off")
        session.constraint = None if off else constraint(**{param: value})
        ui.info(f"answers constrained: {param} {value}" if session.constraint else "answers unconstrained")
    elif param in SAMPLING_PARAMS:
        name = SAMPLING_PARAMS[param]
        parsed = _number(param, value, int if name in INTEGER_PARAMS else float, allow_none=name == "seed")
        overrides = {**session.overrides, name: parsed}
        if parsed is None:
            overrides.pop(name)
        session.sampling, sources = sampling_for(session.loaded, overrides)  # checks the range
        session.overrides = overrides
        session.set_here = (session.set_here | {name}) if parsed is not None else (session.set_here - {name})
        session.sources = {k: ("/set" if k in session.set_here else v) for k, v in sources.items()}
    else:
        raise UsageError(f"/set {param}: unknown; valid: {valid}")


def _show(session: Session) -> str:
    engine, header = session.loaded.engine, session.loaded.header
    template = header.get(TEMPLATE_KEY)
    style = style_of(template if isinstance(template, str) else None)
    if isinstance(template, str) and template.strip():
        source = f"the GGUF's tokenizer.chat_template ({len(template):,} characters)"
        source += f"; reasoning: {style}" if style else ""
    else:
        source = "none in the GGUF: plain text"
    dropped = user_turns(session.turns[: session.first])
    saved = f"conversation {session.conversation}" if session.conversation else "not saved yet"
    rows = [
        ("model", f"{session.loaded.name} ({session.loaded.path})"),
        ("load", describe_load(session.loaded)),
        ("context", f"{engine.n_cached:,} of {engine.n_ctx:,} tokens used"),
        ("turns", f"{user_turns(session.turns)} ({dropped} no longer sent to the model)"),
        (
            "system",
            repr(session.system) if session.system else "none (the template's default, if it has one)",
        ),
        ("sampling", describe_sampling(session.sampling, session.sources)),
        ("max-tokens", str(session.max_tokens) if session.max_tokens else "none (until the model ends)"),
        ("think", {None: "the template's default", True: "on", False: "off"}[session.think]),
        ("template", source),
        ("stored", saved if session.store is not None else "off (--no-save, or the database failed)"),
    ]
    width = max(len(k) for k, _ in rows) + 2
    return "\n".join(f"{k:<{width}}{v}" for k, v in rows)


def _stats(session: Session) -> str:
    if session.last is None:
        return "no answer yet"
    t = session.last.result.timings
    return (
        f"ttft {t.ttft_s:.3f} s · prompt {t.prompt_tokens} tokens, {t.prefill_tokens} evaluated "
        f"(the rest from the KV cache) · prefill {t.prefill_tokens_per_s:.1f} tok/s · "
        f"{t.completion_tokens} tokens at {t.decode_tokens_per_s:.1f} tok/s · "
        f"finish {session.last.result.finish_reason}{describe_speculation(t.speculation)}"
    )


def _history(session: Session) -> str:
    if session.store is None:
        return "the conversation store is off"
    rows = session.store.summaries(limit=10)
    if not rows:
        return "no conversations yet"
    return "\n".join(
        f"{s.id:>5}  {s.model}  {s.turns} turn{'s' if s.turns != 1 else ''}  "
        f"{ui.human_since(s.updated)}  {s.first_words}"
        for s in rows
    )


def _save(session: Session, name: str) -> None:
    if not name:
        raise UsageError("/save FILE")
    path = Path(name).expanduser()
    data = conversation_json(
        StoredConversation(
            session.conversation or 0, session.loaded.name, session.system, 0, 0, session.turns
        )
    )
    try:
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from exc
    ui.info(f"saved {len(session.turns)} messages to {path}")


def _load(session: Session, name: str) -> None:
    if not name:
        raise UsageError("/load FILE")
    stored = read_conversation(Path(name).expanduser())
    session.adopt(stored, stored_here=False)
    ui.info(f"loaded {len(session.turns)} messages from {name}")


def _number(param: str, value: str, kind: type, *, allow_none: bool) -> Any:
    if allow_none and value.lower() in ("none", "random", "off", ""):
        return None
    try:
        return kind(value)
    except ValueError:
        wanted = "an integer" if kind is int else "a number"
        raise InvalidSetting(f"/set {param} needs {wanted} (got {value!r})") from None


def _help() -> str:
    width = max(map(len, COMMANDS)) + 2
    lines = [f"{name:<{width}}{text}" for name, text in COMMANDS.items()]
    return "\n".join([*lines, '"""       opens and closes a message of several lines', QUIT_HINT])
