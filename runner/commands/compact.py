"""A chat that outgrows its context: its older turns summarised by the model itself (compaction), or
dropped, and how the conversation is fitted to the context either way.

When the next turn would not leave room to answer (runner.engine.conversation.fit), a chat compacts:
the turns before the most recent ones (`keep` tokens of them, whole exchanges, the last exchange always)
are summarised by the model into one text, through the one engine (a Request like any answer); that
summary goes to the model at the end of the system message, in their place, and the recent turns go
as they are. Each compaction summarises the one before with the turns after it. The turns themselves
stay stored as they were (history shows them, marked compacted); the summary is stored as its own
record (runner.store Compaction), in one transaction, after it is whole: an interrupt during a
compaction (Ctrl-C, SIGTERM) changes nothing.

Where it happens by itself: without a terminal (a piped chat, `run -c`), in a tool loop, and with
`--compact auto`. On a terminal (`--compact ask`, its default there) the oldest exchanges give way as
before and the chat says that /compact would summarise them; `--compact off` never compacts.
Not a command itself: the session's (session.py) way of fitting its turns, and /compact.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from runner import ui
from runner.commands.agent import template_message
from runner.engine.answer import FINISH_INTERRUPTED
from runner.engine.conversation import Fitted, answer_room, fit
from runner.engine.prompt import render_prompt
from runner.engine.promptcache import text_head
from runner.engine.request import Request
from runner.engine.text.template import Message
from runner.errors import PromptTooLong, UsageError
from runner.store import (
    Compaction,
    Store,
    StoredMessage,
    StoreError,
    latest_compaction,
    save_compaction,
    user_turns,
)

if TYPE_CHECKING:
    from runner.commands.session import Session

MODES = ("auto", "ask", "off")
SUMMARY_PROMPT = (
    "You summarise a conversation so that it can go on without it. Write what the rest of it needs: "
    "the user's task and requests, facts, names and numbers given, decisions made, what tools returned "
    "that matters, and what is still open. Short plain sentences; no preamble."
)
SUMMARY_HEAD = "Summary of the conversation so far (its earlier turns are no longer shown):"
SUMMARY_TOKENS = 1024  # a summary's length at most, and an eighth of the context at most
KEEP_SHARE = 4  # the recent turns kept verbatim: a quarter of the context unless --compact-keep says
AHEAD_SHARE = 8  # after an answer, compact where the next turn would have less than this share to spare
MESSAGE_SHARE = 4  # one message in the text to summarise: a quarter of what a summarising prompt holds
CHARS_PER_TOKEN = 4  # where a message is cut to fit, before it is tokenized


@dataclass(frozen=True)
class CompactSettings:
    """--compact, --compact-keep and --compact-prompt, as typed."""

    mode: str | None = None  # auto | ask | off; None: ask on a terminal, auto without one
    keep: int | None = None  # recent tokens kept verbatim; None: a quarter of the context
    prompt: str | None = None  # the summarising instruction; None: SUMMARY_PROMPT

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise UsageError(f"--compact takes {', '.join(MODES)} (got {self.mode!r})")
        if self.keep is not None and self.keep < 0:
            raise UsageError(f"--compact-keep takes a number of tokens, 0 or more (got {self.keep})")
        if self.prompt is not None and not self.prompt.strip():
            raise UsageError("--compact-prompt needs the text of an instruction")


def stored(store: Store | None, conversation: int | None) -> Compaction | None:
    """A stored conversation's latest summary (None: none, or the store cannot say)."""
    if store is None or conversation is None:
        return None
    try:
        return latest_compaction(store, conversation)
    except StoreError:
        return None


def system_with(system: str | None, compaction: Compaction | None) -> str | None:
    """The system message the model is sent: the chat's own, then the summary of what came before."""
    if compaction is None:
        return system
    summary = f"{SUMMARY_HEAD}\n{compaction.summary}"
    return f"{system}\n\n{summary}" if system else summary


def _current(session: Session, turns: list[StoredMessage]) -> Compaction | None:
    """The session's summary, where it still stands for turns the conversation has (/undo may have
    taken them: then none)."""
    compaction = session.compaction
    return compaction if compaction is not None and compaction.turns < len(turns) else None


def fitted(session: Session, turns: list[StoredMessage], tools: list[dict[str, Any]] | None = None) -> Fitted:
    """What the model would be sent for these turns: the summary (if any) in the system message and
    the turns after it, older exchanges dropped where they still do not fit (nothing changes here).
    A summary that ends inside a tool loop's exchange is followed by the loop's task, sent again."""
    compaction = _current(session, turns)
    kept = compaction.turns if compaction is not None else 0
    task = _task(turns, kept)
    sent = [task, *turns[kept:]] if task is not None else turns[kept:]
    offset = kept - (1 if task is not None else 0)  # a sent turn's index in `turns`, less its own
    result = fit(
        session.loaded.engine,
        session.loaded.header,
        system_with(session.system, compaction),
        [template_message(t) for t in sent],
        first=max(session.first - offset, 0) if session.first > kept else 0,
        max_tokens=session.max_tokens,
        enable_thinking=session.think,
        images=session.attached.images_for(sent),
        tools=session.tool_defs() if tools is None else tools,
    )
    return replace(result, first=max(result.first + offset, kept)) if kept else result


def _task(turns: list[StoredMessage], kept: int) -> StoredMessage | None:
    """The user message whose exchange the first kept turn is part of, where that turn is not it (a
    summary that ends inside a tool loop): what the model must still see to go on with its task."""
    if not 0 < kept < len(turns) or turns[kept].role == "user":
        return None
    return next((t for t in reversed(turns[:kept]) if t.role == "user"), None)


def fit_turns(
    session: Session, turns: list[StoredMessage], tools: list[dict[str, Any]] | None = None
) -> Fitted:
    """The prompt for the next answer. Where older turns would give way, they are compacted instead
    (where that happens by itself: see the module), else dropped; either is said on stderr. A tool
    loop's step whose exchange alone outgrows the context compacts the loop's earlier steps."""
    loop = tools is not None
    try:
        result = fitted(session, turns, tools)
    except PromptTooLong:
        if not (
            loop
            and _automatic(session, loop)
            and compact(session, turns, why="the context is full", inside=True)
        ):
            raise
        result = fitted(session, turns, tools)
    n_ctx = session.loaded.engine.context.n_ctx
    over = loop and len(result.prompt.tokens) + answer_room(n_ctx, session.max_tokens) > n_ctx
    automatic = (result.first > session.first or over) and _automatic(session, loop)
    if automatic and compact(session, turns, why="the context is full", inside=loop):
        result = fitted(session, turns, tools)
    if result.first > session.first:
        dropped = result.dropped_exchanges
        offer = "; /compact summarises them instead" if _mode(session) == "ask" else ""
        ui.info(
            f"the context is full: the {dropped} oldest exchange{'s' if dropped > 1 else ''} no longer "
            f"reach the model (the system message stays; /show says how full it is{offer})"
        )
    session.first = result.first
    return result


def _mode(session: Session) -> str:
    mode = session.request.compact.mode if session.request.compact is not None else None
    return mode or ("ask" if session.interactive else "auto")


def _automatic(session: Session, tool_loop: bool) -> bool:
    """Whether this turn compacts by itself: auto, or a tool loop's step (a loop would lose its task
    to a dropped exchange) unless compaction is off."""
    mode = _mode(session)
    return mode == "auto" or (tool_loop and mode != "off")


def ahead(session: Session) -> None:
    """After an answer, where compaction happens by itself: when the next turn would come within an
    AHEAD_SHARE of the context of not fitting, compact now, and evaluate what the next prompt begins
    with (the summary and the recent turns) into the KV cache, so that the next turn's TTFT is what
    it was before: its message alone is evaluated then."""
    if _mode(session) != "auto" or not session.turns:
        return
    engine = session.loaded.engine
    n_ctx = engine.context.n_ctx
    try:
        upcoming = fitted(session, [*session.turns, StoredMessage("user", "\x00")])
    except PromptTooLong:  # an answer that filled the context: the next turn compacts or says why not
        return
    room = answer_room(n_ctx, session.max_tokens) + n_ctx // AHEAD_SHARE
    if upcoming.first == session.first and len(upcoming.prompt.tokens) + room <= n_ctx:
        return
    if not compact(session, session.turns, why="the context is nearly full"):
        return
    try:
        warm(session)
    except (
        PromptTooLong
    ):  # the recent turns alone fill it (an answer that ran to the end): the next turn says so
        return


def warm(session: Session) -> None:
    """Evaluate the head every next prompt shares (up to the next user message's text, its images
    apart) into the KV cache: a prompt evaluated, nothing generated (max_tokens 0)."""
    turns = session.turns
    one, other = (fitted(session, [*turns, StoredMessage("user", c)]).prompt for c in ("\x00", "\x01"))
    head = next(
        (i for i, (a, b) in enumerate(zip(one.tokens, other.tokens, strict=False)) if a != b), len(one.tokens)
    )
    head = min(head, text_head(one.tokens))
    if head == 0:
        return
    prompt = replace(one, tokens=one.tokens[:head], media=None)
    result = session.loaded.engine.answer(Request(prompt, session.sampling, max_tokens=0))
    if result.finish_reason == FINISH_INTERRUPTED:
        raise KeyboardInterrupt


def on_demand(session: Session) -> None:
    """/compact: the older turns summarised now (the recent ones, and the last exchange, kept)."""
    if not compact(session, session.turns, why="asked"):
        raise UsageError(
            "nothing to compact yet: every turn is a recent one (--compact-keep), or the last exchange"
        )


def compact(session: Session, turns: list[StoredMessage], *, why: str, inside: bool = False) -> bool:
    """Summarise the turns before the recent ones into the session's compaction (stored, if the
    conversation is); False where there is nothing to summarise (all of them are recent).
    Interrupted: KeyboardInterrupt, and nothing changed."""
    settings = session.request.compact or CompactSettings()
    engine = session.loaded.engine
    n_ctx = engine.context.n_ctx
    before = _current(session, turns)
    start = before.turns if before is not None else 0
    keep = settings.keep if settings.keep is not None else n_ctx // KEEP_SHARE
    split = split_at(engine, turns, start, keep, inside=inside)
    if split <= start:
        return False
    exchanges = user_turns(turns[start:split])
    older = (
        ui.count(exchanges, "oldest exchange") if exchanges else f"tool loop's {split - start} first steps"
    )
    ui.info(
        f"{why}: compacting the {older} into a summary the model writes "
        "(the turns stay stored; --compact off drops them instead)"
    )
    began = time.perf_counter()
    summary, stats = summarise(session, before.summary if before else None, turns[start:split], settings)
    if not summary.strip():  # the model wrote nothing (all of it thinking, or an end at once)
        ui.warn("the model wrote an empty summary: nothing is compacted or saved")
        return False
    stats["seconds"] = round(time.perf_counter() - began, 3)
    record = Compaction(summary, split, session.loaded.name, stats=stats, through=turns[split - 1].id)
    session.compaction = record
    session.first = max(session.first, split)
    if record.through is not None and session.store is not None and session.conversation is not None:
        try:
            save_compaction(session.store, session.conversation, record)
        except StoreError as exc:
            ui.warn(f"the summary is not saved: {exc}")
    ui.info(
        f"compacted: {ui.count(user_turns(turns[:split]), 'turn')} in a {_tokens(engine, summary)}-token "
        f"summary, {ui.count(user_turns(turns[split:]), 'recent turn')} kept as they were "
        f"({stats['seconds']:.1f} s)"
    )
    return True


def split_at(engine: Any, turns: list[StoredMessage], start: int, keep: int, *, inside: bool = False) -> int:
    """The first turn kept verbatim: the earliest user message after `start` from which the turns
    take at most `keep` tokens, and the last user message at the latest (a tool loop's task, and what
    answers it so far, stay whole). `start` (nothing to compact) where the turns from it take no more.
    `inside` (a tool loop whose exchange alone outgrows the context): its steps are split points too,
    its last step at the latest (the task is sent again after the summary: `fitted`)."""
    starts = [i for i, t in enumerate(turns) if t.role == "user" and i >= start]
    if inside:
        last = max((i for i, t in enumerate(turns) if t.role == "user"), default=len(turns))
        starts += [i for i in range(max(last + 1, start), len(turns)) if turns[i].tool_calls]
    if not starts:
        return start
    sizes = [len(engine.model.tokenize(_line(t), add_special=False)) for t in turns]
    for i in starts:
        if sum(sizes[i:]) <= keep:
            return i
    return starts[-1]


def summarise(
    session: Session, prior: str | None, turns: list[StoredMessage], settings: CompactSettings
) -> tuple[str, dict[str, Any]]:
    """The summary of `prior` (the summary before, if any) and these turns, written by the model; the
    turns go in parts where they do not fit one prompt, each part's summary carried into the next."""
    engine = session.loaded.engine
    n_ctx = engine.context.n_ctx
    limit = min(SUMMARY_TOKENS, n_ctx // 8)
    instruction = settings.prompt or SUMMARY_PROMPT
    room = n_ctx - limit - _tokens(engine, instruction) - 64  # the answer, the instruction, the template
    stats = {"ttft_s": 0.0, "prompt_tokens": 0, "completion_tokens": 0, "parts": 0}
    summary = prior
    for part in _parts(engine, [_line(t, room // MESSAGE_SHARE) for t in turns], room - limit):
        text = (f"Summary so far:\n{summary}\n\n" if summary else "") + "Conversation:\n" + part
        messages = [Message("system", instruction), Message("user", text)]
        prompt = render_prompt(engine, session.loaded.header, messages, enable_thinking=False, quiet=True)
        result = engine.answer(Request(prompt, session.sampling, max_tokens=limit))
        if result.finish_reason == FINISH_INTERRUPTED:
            ui.info("interrupted: the compaction stopped; the conversation is as it was")
            raise KeyboardInterrupt
        summary = result.text.strip() or summary
        stats["ttft_s"] += result.timings.ttft_s
        stats["prompt_tokens"] += result.timings.prompt_tokens
        stats["completion_tokens"] += result.timings.completion_tokens
        stats["parts"] += 1
    stats["ttft_s"] = round(stats["ttft_s"], 4)
    return summary or "", stats


def _tokens(engine: Any, text: str) -> int:
    return len(engine.model.tokenize(text, add_special=False))


def _parts(engine: Any, lines: list[str], room: int) -> list[str]:
    """The lines as parts of at most `room` tokens each (a line longer than that is a part alone)."""
    parts: list[list[str]] = [[]]
    used = 0
    for line in lines:
        size = _tokens(engine, line) + 1
        if parts[-1] and used + size > room:
            parts.append([])
            used = 0
        parts[-1].append(line)
        used += size
    return ["\n".join(part) for part in parts if part]


def _line(message: StoredMessage, cap: int | None = None) -> str:
    """A turn as the text to summarise shows it: who said it, then what (a tool step its call or its
    result); `cap`: tokens at most, roughly, the rest cut."""
    if message.role == "user":
        text = f"User: {message.content}"
    elif message.role == "tool":
        text = f"Tool {message.tool or ''} returned: {message.content}"
    else:
        calls = "; ".join(
            f"{c['name']}({json.dumps(c['arguments'], ensure_ascii=False)})" for c in message.tool_calls
        )
        text = f"Assistant: {message.content}" + (f" [called {calls}]" if calls else "")
    if cap is not None and len(text) > cap * CHARS_PER_TOKEN:
        text = text[: cap * CHARS_PER_TOKEN] + " […]"
    return text
