"""A conversation as a file holds it: `/save`, `--load`, `runner history show --json` and `history
export --json` write it, `/load` and `--load` read it back, checked (a file is untrusted input)."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from runner.errors import UsageError
from runner.images import ImageRef
from runner.store import Compaction, StoredConversation, StoredMessage
from runner.store.conversations import tool_step

FORMAT = "runner-conversation"


def to_json(conversation: StoredConversation, compaction: Compaction | None = None) -> dict[str, Any]:
    """A conversation as a file holds it (/save, --load, history show --json, history export --json);
    with its latest summary, if it has one: each message it stands for marked "compacted"."""
    data: dict[str, Any] = {
        "format": FORMAT,
        "version": 1,
        "id": conversation.id,
        "model": conversation.model,
        "system": conversation.system,
        "created": iso_time(conversation.created),
        "updated": iso_time(conversation.updated),
        "settings": conversation.settings,
        "messages": [m.to_json() for m in conversation.messages],
    } | ({"title": conversation.title} if conversation.title else {})
    if compaction is not None:
        for message in data["messages"][: compaction.turns]:
            message["compacted"] = True
        data["summary"] = {
            "text": compaction.summary,
            "messages": compaction.turns,
            "model": compaction.model,
        }
    return data


def transcript(conversation: StoredConversation, compaction: Compaction | None = None) -> str:
    """The conversation as text; where more than one model answered it, each answer names its own;
    the messages a summary stands for marked compacted, the summary after them."""
    when = iso_time(conversation.updated)
    lines = [f"# conversation {conversation.id} · {conversation.model} · {when}", ""]
    if conversation.system:
        lines += [f"system: {conversation.system}", ""]
    models = {m.model or conversation.model for m in conversation.messages if m.role == "assistant"}
    named = len(models | {conversation.model}) > 1
    compacted = compaction.turns if compaction is not None else 0
    for n, m in enumerate(conversation.messages):
        notes = [m.model or conversation.model] if named and m.role == "assistant" else []
        notes += ["interrupted"] if m.interrupted else []
        notes += ["compacted"] if n < compacted else []
        mark = f" ({', '.join(notes)})" if notes else ""
        images = "".join(f"[image {i.path}] " for i in m.images)  # the path: history shows it whole
        role = f"tool {m.tool}" if m.role == "tool" and m.tool else m.role
        lines += [f"{role}{mark}: {images}{m.content}".rstrip()]
        for call in m.tool_calls:
            lines.append(f"  call {call['name']} {json.dumps(call['arguments'], ensure_ascii=False)}")
        lines.append("")
        if compaction is not None and n == compacted - 1:
            lines += [
                f"summary of the {compacted} messages above (what the model is sent): {compaction.summary}",
                "",
            ]
    return "\n".join(lines)


def iso_time(moment: float) -> str:
    """A Unix time as files and --json show it: ISO 8601, UTC, to the second."""
    return datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def from_json(data: Any, source: str) -> StoredConversation:
    """A conversation read from a file, checked: anything malformed is one UsageError naming source."""

    def bad(why: str) -> UsageError:
        return UsageError(f"{source} is not a runner conversation: {why}")

    if not isinstance(data, dict):
        raise bad("expected a JSON object")
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise bad('no "messages" list')
    system = data.get("system")
    if system is not None and not isinstance(system, str):
        raise bad('"system" must be text')
    settings = data.get("settings") or {}
    if not isinstance(settings, dict):
        raise bad('"settings" must be an object')
    out = []
    for n, m in enumerate(messages, start=1):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system", "tool"):
            raise bad(f'message {n} needs a "role" of user, assistant or tool')
        if not isinstance(m.get("content"), str):
            raise bad(f'message {n} needs its "content" as text')
        if m["role"] == "system":  # as other tools write it: the first message
            system = m["content"]
            continue
        reasoning, model = m.get("reasoning"), m.get("model")
        listed = m.get("images") or []
        images = [ImageRef.from_json(i) for i in listed] if isinstance(listed, list) else [None]
        if not all(images):
            raise bad(f'message {n}: "images" must be a list of {{"sha256", "size", "path"}} objects')
        out.append(
            StoredMessage(
                role=m["role"],
                content=m["content"],
                reasoning=reasoning if isinstance(reasoning, str) else None,
                interrupted=bool(m.get("interrupted", False)),
                model=model if isinstance(model, str) and m["role"] == "assistant" else None,
                images=tuple(i for i in images if i is not None) if m["role"] == "user" else (),
                **tool_step(m),
            )
        )
    model = data.get("model")
    now = time.time()
    return StoredConversation(0, model if isinstance(model, str) else "", system, now, now, out, settings)


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
