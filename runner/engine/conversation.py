"""A conversation as the model sees it: which turns are sent, and how they fit the context.

Each turn re-renders the whole conversation with the model's template; the engine then evaluates only
what differs from its KV cache (Context.prefill keeps the common prefix), which for a template that
renders earlier turns the same way every time is the new message and the template's wrapper.

When the next turn would not leave room to answer, the oldest exchanges (a user message and its
answers; never the system message) are dropped, with some headroom (down to FILL_AFTER_DROP of the
context) so the turns after it reuse the cache again instead of dropping one exchange per turn.
A single message that cannot fit even alone is refused (PromptTooLong), never cut.

A turn may carry images (a chat's /image): they go before its text, as `run --image` puts them, and
leave with it when it is dropped. Each turn re-sends them; prefix reuse compares images by their hash
(runner.engine.vision), so an image already in the KV cache is not evaluated again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from runner.engine.engine import CTX_STEP, Engine
from runner.engine.prompt import Prompt, render_prompt
from runner.engine.text.template import Message
from runner.errors import PromptTooLong

if TYPE_CHECKING:
    from runner.gguf import GGUFHeader

ANSWER_ROOM = 512  # tokens kept free to answer in, at most a quarter of the context (or --max-tokens)
FILL_AFTER_DROP = 0.75  # after dropping, the prompt and the answer room fill at most this much


@dataclass(frozen=True)
class Fitted:
    prompt: Prompt
    first: int  # index of the first turn sent (0: all of them)
    dropped_exchanges: int  # exchanges before `first`


def answer_room(n_ctx: int, max_tokens: int | None) -> int:
    return max_tokens if max_tokens is not None else min(ANSWER_ROOM, n_ctx // 4)


def sendable(turns: Sequence[Message]) -> list[int]:
    """Indexes of the turns sent to the model: every one, except a user message left without an answer
    (a kill or an error mid-answer) when another user message follows it: roles must alternate."""
    keep = []
    for i, turn in enumerate(turns):
        if turn.role == "user" and i + 1 < len(turns) and turns[i + 1].role == "user":
            continue
        keep.append(i)
    return keep


def fit(
    engine: Engine,
    header: GGUFHeader,
    system: str | None,
    turns: Sequence[Message],
    *,
    first: int = 0,
    max_tokens: int | None = None,
    enable_thinking: bool | str | None = None,
    images: Sequence[Sequence[Any]] = (),
    tools: Sequence[dict[str, Any]] = (),
) -> Fitted:
    """The prompt for the next answer (turns end with the user's message, or a tool's result), from
    turn `first` on, dropping older exchanges when the context would not leave room to answer (an
    exchange: a user message and what answered it, tool steps included). `images`: each turn's
    (runner.images.Image, decoded), by the turns' index; none for a turn past its end. `tools`: the
    OpenAI-shaped tools the model may call (chat --mcp)."""
    room = answer_room(engine.context.n_ctx, max_tokens)
    starts = [i for i, t in enumerate(turns) if t.role == "user" and i >= first] or [len(turns) - 1]
    shown = _Shown(system, enable_thinking, images, tools)
    prompt = _render(engine, header, turns, starts[0], shown)
    if len(prompt.tokens) + room <= engine.context.n_ctx:
        return Fitted(prompt, starts[0], _exchanges(turns, starts[0]))
    target = int(engine.context.n_ctx * FILL_AFTER_DROP)
    for start in starts[1:]:
        prompt = _render(engine, header, turns, start, shown)
        if len(prompt.tokens) + room <= target:
            return Fitted(prompt, start, _exchanges(turns, start))
    last = starts[-1]
    if len(prompt.tokens) >= engine.context.n_ctx:  # the last message alone (with the system message)
        n = len(prompt.tokens)
        needed = -(-(n + room) // CTX_STEP) * CTX_STEP
        raise PromptTooLong(
            f"this message makes a {n:,}-token prompt, more than the {engine.context.n_ctx:,}-token "
            f"context holds even alone; shorten it, or start with --ctx {needed}"
        )
    return Fitted(prompt, last, _exchanges(turns, last))


@dataclass(frozen=True)
class _Shown:
    """What every rendering of the turns shows beside them."""

    system: str | None
    enable_thinking: bool | str | None
    images: Sequence[Sequence[Any]]
    tools: Sequence[dict[str, Any]]


def _render(
    engine: Engine, header: GGUFHeader, turns: Sequence[Message], start: int, shown: _Shown
) -> Prompt:
    kept = [i for i in sendable(turns) if i >= start]
    carried = {i: shown.images[i] for i in kept if i < len(shown.images) and shown.images[i]}
    marker = engine.vision.marker if carried and engine.vision is not None else ""
    sent = [replace(turns[i], content=marker * len(carried.get(i, ())) + turns[i].content) for i in kept]
    messages = ([Message("system", shown.system)] if shown.system is not None else []) + sent
    pictures = [image for i in kept for image in carried.get(i, ())]
    tools = list(shown.tools) or None
    return render_prompt(
        engine,
        header,
        messages,
        enable_thinking=shown.enable_thinking,
        quiet=True,
        images=pictures,
        tools=tools,
    )


def _exchanges(turns: Sequence[Message], start: int) -> int:
    return sum(1 for t in turns[:start] if t.role == "user")
