"""The chat's slash commands: /set, /show, /stats, /history, /save, /load, /edit and the rest, as
functions over a Session, with the table of their names and help.

`command` dispatches one line to its handler; a bad command or value raises UsageError (one line, and
the chat goes on). The conversation itself (sending, /retry, /undo, /clear) is the Session's; how its
turns are shown again (/history, a resumed chat's recap) is here.
Not a command itself: a helper of chat.py, as output.py and lineinput.py are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from runner import ui
from runner.commands.lineinput import MORE, PROMPT, QUIT_HINT
from runner.commands.output import (
    describe_load,
    describe_model,
    describe_sampling,
    describe_speculation,
    describe_threads,
)
from runner.commands.session import Session
from runner.engine.text.reasoning import THINK_LEVELS, style_of
from runner.engine.text.template import TEMPLATE_KEY
from runner.errors import InvalidSetting, UsageError
from runner.store import StoredConversation, StoredMessage, user_turns
from runner.store.file import read_conversation
from runner.store.file import to_json as conversation_json

COMMANDS = {
    "/help": "this list",
    "/set": "/set PARAM VALUE: "
    + ", ".join(
        ["temperature", "top-k", "top-p", "min-p", "repeat-penalty", "presence-penalty"]
        + ["frequency-penalty", "seed", "max-tokens", "system", "think LEVEL"]
        + ["format json|none", "schema S|none"]
    ),
    "/think": "/think off|low|medium|high|on|default: how long the model thinks (as /set think)",
    "/show": "model, file, parameters and where they came from, template, context used",
    "/stats": "the last answer's timings and the tokens it evaluated",
    "/clear": "start a new conversation",
    "/retry": "answer the last message again",
    "/undo": "drop the last exchange",
    "/compact": "summarise the older turns into one message (the recent ones kept; all stay stored)",
    "/save": "/save FILE: the conversation as JSON",
    "/load": "/load FILE: continue a conversation saved as JSON",
    "/history": "this conversation so far; /history list: recent ones (runner chat --resume ID opens one)",
    "/edit": "write the next message in $EDITOR",
    "/image": "/image PATH: attach an image to the next message (--mmproj); /image: what is attached; "
    "/image none: drop them",
    "/audio": "/audio PATH: attach an audio clip (WAV, MP3, FLAC, Ogg) to the next message (audio --mmproj)",
    "/tools": "the MCP servers, their tools and state; /tools off NAME|SERVER, /tools on NAME|SERVER",
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
RECAP_EXCHANGES = 3  # a resumed chat shows its last exchanges, each message cut to RECAP_LINES lines
RECAP_LINES = 8
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
        "/think": lambda: _set(session, f"think {rest}"),
        "/show": lambda: ui.echo(_show(session)),
        "/stats": lambda: ui.echo(_stats(session)),
        "/clear": session.clear,
        "/retry": session.retry,
        "/undo": session.undo,
        "/compact": session.compact,
        "/save": lambda: _save(session, rest),
        "/load": lambda: _load(session, rest),
        "/history": lambda: _history(session, rest),
        "/edit": lambda: _edit(session, source),
        "/image": lambda: _image(session, rest),
        "/audio": lambda: _image(session, rest),  # Attachments.attach reads a clip as a clip
        "/tools": lambda: _tools(session, rest),
    }
    if name not in handlers:
        raise UsageError(f"unknown command {name}; valid: {', '.join(COMMANDS)}")
    handlers[name]()
    return True


def _tools(session: Session, args: str) -> None:
    """/tools: each server, its state and tools (those off marked), resources and prompts;
    /tools on|off NAME: a tool, or every tool of a server, shown to the model again or not."""
    host = session.host
    if host is None:
        raise UsageError("no tools in this chat: start it with --mcp FILE (an mcpServers JSON file)")
    word, _, target = args.partition(" ")
    if word in ("on", "off"):
        if not target.strip():
            raise UsageError(f"/tools {word} NAME: a tool's name, or a server's")
        changed = host.enable(target.strip(), word == "on")
        ui.info(f"{word}: {', '.join(changed)}")
        return
    if word:
        raise UsageError("/tools, /tools on NAME or /tools off NAME")
    lines = []
    for server in host.servers():
        lines.append(f"{server.name} ({server.transport}: {server.where}): {server.state}")
        tools = [name if on else f"{name} (off)" for name, on in server.tools]
        lines += [f"  tools: {', '.join(tools)}"] if tools else []
        lines += [f"  resources: {', '.join(server.resources)}"] if server.resources else []
        lines += [f"  prompts: {', '.join(server.prompts)}"] if server.prompts else []
    ui.echo("\n".join(lines) or "no servers")


def _think_shown(think: bool | str | None) -> str:
    if think is None:
        return "the template's default"
    return ("on" if think else "off") if isinstance(think, bool) else think


def _edit(session: Session, source: Any) -> None:
    text = source.edit()
    if text:
        session.send(text)


def _image(session: Session, arg: str) -> None:
    if not arg and session.attached.vision:
        ui.info(session.attached.show())
    elif arg.lower() == "none" and session.attached.vision:
        session.attached.drop()
    else:
        session.attached.attach(_unquoted(arg))


def _unquoted(arg: str) -> str:
    """A path as typed after /image, or in the quotes a terminal puts around a dragged file's path."""
    quoted = len(arg) > 1 and arg[0] == arg[-1] and arg[0] in "'\""
    return arg[1:-1] if quoted else arg


def _set(session: Session, args: str) -> None:
    param = args.partition(" ")[0].strip().lower().replace("_", "-")
    try:
        _setting(session, args)
    except InvalidSetting as exc:  # the check's words name the flag (--temperature): here it is /set's
        flag, said = f"--{param}", f"/set {param}"
        problem = exc.problem.replace(flag, said) if exc.problem else exc.problem
        raise InvalidSetting(str(exc).replace(flag, said), field=exc.field, problem=problem) from None


def _setting(session: Session, args: str) -> None:
    param, _, value = args.partition(" ")
    param, value = param.strip().lower().replace("_", "-"), value.strip()
    valid = ", ".join([*SAMPLING_PARAMS, "max-tokens", "system", "think", "format", "schema"])
    if not param:
        raise UsageError(f"/set PARAM VALUE; PARAM is one of {valid}")
    if param == "system":
        session.set_system(value or None)
        ui.info(f"system message: {session.system!r}" if session.system else "no system message")
    elif param == "max-tokens":
        session.set_max_tokens(_number(param, value, int, allow_none=True))
        limit = session.max_tokens
        ui.info(f"max-tokens {limit}" if limit else "max-tokens: none (answers run until the model ends)")
    elif param == "think":
        levels = {v: v for v in THINK_LEVELS if v != "off"}  # off: the template's switch, as ever
        choices: dict[str, bool | str | None] = {"on": True, "off": False, "default": None, **levels}
        if value.lower() not in choices:
            raise UsageError("/set think on|off|low|medium|high|default")
        session.set_think(choices[value.lower()])
        ui.info(f"think {value.lower()}" + (" (the template's)" if session.think is None else ""))
    elif param in ("format", "schema"):
        off = value.lower() in ("", "none", "off")
        session.set_constraint(param, None if off else value)
        ui.info(f"answers constrained: {param} {value}" if session.constraint else "answers unconstrained")
    elif param in SAMPLING_PARAMS:
        name = SAMPLING_PARAMS[param]
        parsed = _number(param, value, int if name in INTEGER_PARAMS else float, allow_none=name == "seed")
        session.set_sampling(name, parsed)  # checks the range
        now = getattr(session.sampling, name)
        ui.info(f"{param} {'random' if now is None else now} ({session.sources[name]})")
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
    compacted = user_turns(session.turns[: session.compaction.turns]) if session.compaction else 0
    dropped -= compacted
    saved = f"conversation {session.conversation}" if session.conversation else "not saved yet"
    rows = [
        ("model", describe_model(session.loaded)),
        ("load", describe_load(session.loaded, model=False)),
        ("context", f"{session.context_used():,} of {engine.context.n_ctx:,} tokens used"),
        (
            "turns",
            f"{user_turns(session.turns)} ({compacted} in a summary, {dropped} no longer sent to the model)",
        ),
        (
            "system",
            repr(session.system) if session.system else "none (the template's default, if it has one)",
        ),
        ("sampling", describe_sampling(session.sampling, session.sources)),
        ("max-tokens", str(session.max_tokens) if session.max_tokens else "none (until the model ends)"),
        ("think", _think_shown(session.think)),
        ("template", source),
        ("stored", saved if session.store is not None else "off (--no-save, or the database failed)"),
    ]
    vision = session.loaded.engine.vision
    if session.attached.vision and vision is not None:
        projector = vision.projector
        rows.insert(2, ("images", f"projector {projector}; {session.attached.show()}"))
    width = max(len(k) for k, _ in rows) + 2
    return "\n".join(f"{k:<{width}}{v}" for k, v in rows)


def prompt_tokens(t: Any) -> str:
    """A prompt's tokens, and how many came from the KV cache (said only when some did)."""
    reused = t.prompt_tokens - t.prefill_tokens
    if reused <= 0:
        return f"{ui.count(t.prompt_tokens, 'token')}, all evaluated"
    return f"{ui.count(t.prompt_tokens, 'token')}: {t.prefill_tokens} evaluated, {reused} from the KV cache"


def _stats(session: Session) -> str:
    if session.last is None:
        return "no answer yet"
    t = session.last.timings
    return (
        f"ttft {t.ttft_s:.3f} s · prompt {prompt_tokens(t)} · prefill {t.prefill_tokens_per_s:.1f} tok/s · "
        f"{t.completion_tokens} tokens at {t.decode_tokens_per_s:.1f} tok/s{describe_threads(t)} · "
        f"finish {session.last.finish_reason}{describe_speculation(t.speculation)}"
    )


def _history(session: Session, what: str) -> None:
    if what.lower() == "list":
        ui.echo(_conversations(session))
    elif what:
        raise UsageError("/history shows this conversation; /history list the recent ones")
    elif not session.turns:
        ui.echo("nothing said yet in this conversation")
    else:
        ui.echo(transcript(session.turns))


def _conversations(session: Session) -> str:
    if session.store is None:
        return "the conversation store is off"
    rows = session.store.summaries(limit=10)
    if not rows:
        return "no conversations yet"
    return "\n".join(
        f"{s.id:>5}  {s.model}  {s.turns} turn{'s' if s.turns != 1 else ''}  "
        f"{ui.human_when(s.updated)}  {s.first_words}"
        for s in rows
    )


def transcript(turns: list[StoredMessage], *, lines: int | None = None) -> str:
    """Turns as the chat showed them: a user's message after the prompt, the answer below it, a blank
    line after each exchange; lines: each message cut to its first lines (a resumed chat's recap)."""

    def shown(text: str) -> list[str]:
        rows = text.strip("\n").split("\n")
        if lines is not None and len(rows) > lines:
            rows = [*rows[:lines], f"… ({len(rows) - lines} more lines: /history shows them)"]
        return rows

    out: list[str] = []
    for message in turns:
        if message.role == "user":
            first, *more = shown(message.content)
            first = "".join(f"[image {Path(i.path).name}] " for i in message.images) + first
            out += [PROMPT + first, *(MORE + line for line in more)]
        else:
            out += [*shown(message.content), *(["(interrupted)"] if message.interrupted else []), ""]
    return "\n".join(out).rstrip("\n")


def recap(session: Session) -> None:
    """A resumed chat's last exchanges, dimmed, so the user sees where they were."""
    if not session.turns:
        return
    starts = [i for i, m in enumerate(session.turns) if m.role == "user"]
    first = starts[-RECAP_EXCHANGES] if len(starts) >= RECAP_EXCHANGES else 0
    if first:
        earlier = user_turns(session.turns[:first])
        ui.info(f"{earlier} earlier turn{'s' if earlier > 1 else ''}: /history shows the whole conversation")
    ui.faint(transcript(session.turns[first:], lines=RECAP_LINES))


def _save(session: Session, name: str) -> None:
    if not name:
        raise UsageError("/save FILE")
    path = Path(name).expanduser()
    created, updated = session.times()
    data = conversation_json(
        StoredConversation(
            session.conversation or 0,
            session.loaded.name,
            session.system,
            created,
            updated,
            session.turns,
            session.settings(),
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
