"""`truncation` of the Responses API, as OpenAI documents it: "disabled" (the default), a conversation
too long for the context is a 400; "auto", its oldest items are dropped until it fits.

Items go from the beginning of the conversation (the stored chain before this request, then its
input), whole turns at a time: from the first one that is not an instruction (system, developer) up
to the next user message, so that no tool result is left without its call and the turns still begin
with the user's. The instructions stay, and so does the last user message: a request whose last turn
alone does not fit is still a 400. The stored chain keeps every item; only what the model is sent is cut.
"""

from __future__ import annotations

from collections.abc import Callable

from runner.serve.backend import Ask, Backend, Generation, TooLong
from runner.serve.responses.input import Item, MessageItem
from runner.serve.shared.http import ApiError
from runner.serve.shared.images import with_pixels

INSTRUCTIONS = ("system", "developer")


def _is_user(item: Item) -> bool:
    return isinstance(item, MessageItem) and item.role == "user"


def _instruction(item: Item) -> bool:
    return isinstance(item, MessageItem) and item.role in INSTRUCTIONS


def without_oldest_turn(items: list[Item]) -> list[Item] | None:
    """The items less their oldest turn (the instructions before it kept); None where the oldest turn
    is the last one (from the last user message on, nothing more goes)."""
    head = 0
    while head < len(items) and _instruction(items[head]):
        head += 1
    later_users = [i for i in range(head + 1, len(items)) if _is_user(items[i])]
    if not later_users:
        return None
    return items[:head] + items[later_users[0] :]


async def submit_fitted(
    backend: Backend, ask_for: Callable[[list[Item]], Ask], items: list[Item], *, auto: bool
) -> Generation:
    """The generation for these items, the oldest turns dropped until they fit where `auto`; a 400
    naming `input` where they do not fit and nothing (more) may go."""
    kept = items
    while True:
        ask = await with_pixels(backend, ask_for(kept))  # decoded off the event loop
        try:
            return await backend.submit(ask)
        except TooLong as exc:
            fewer = without_oldest_turn(kept) if auto else None
            if fewer is None:
                raise ApiError(400, str(exc), param="input", code="context_length_exceeded") from None
            kept = fewer
