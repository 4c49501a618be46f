"""What a model's thread hands to the event loop: a step's parts in one call, and a stream's pieces
gathered over a few milliseconds into one chunk.

Every hand-off costs twice. The model's thread wakes the event loop (uvloop's call_soon_threadsafe:
~50 µs of its time between two decodes, the next token's decode waiting). The event loop then writes
a chunk for each piece through a chain of async generators, as JSON, with one socket send. That is
~200 µs of CPU a piece, taken from the decode's own threads on a machine whose cores all decode,
and it holds the GIL that the model's thread needs. On a GPU, where a 135M model's token costs ~1 ms,
those ~250 µs would be a quarter of every token.

So an answer's consecutive pieces of one kind (its answer text, or its reasoning) are joined while
they wait, and the parts are held back over a short `interval`: as long as the oldest held piece
would not wait longer than that by the end of the next step (each step's time measured as the gap
between two calls), they wait. Nothing else waits:
  - an answer's first part and its end go out at once (the time to the first token is the same);
  - a step that will take a new prompt (or an embedding's batch), which can run long, is preceded
    by a flush (`take(force=True)`);
  - `interval` 0 hands every step's parts over as they come, one chunk a piece (`--stream-interval 0`).
Scored tokens (logprobs) are never joined, so a stream that asked for them has a chunk a token, as
llama-server's, each with its tokens' entries.
"""

from __future__ import annotations

import weakref
from typing import Any

from runner.engine.text.reasoning import ANSWER, REASONING

JOINED = (ANSWER, REASONING)  # the kinds of parts whose text is joined while held
STREAM_INTERVAL_MS = 16  # the longest a piece is held for the ones after it: one frame at 60 Hz


class Outbox:
    """The parts of a model's answers on their way out, filled and emptied in the model's thread."""

    def __init__(self, interval: float = STREAM_INTERVAL_MS / 1000) -> None:
        self.interval = interval  # seconds
        self._items: list[tuple[Any, Any]] = []  # (generation, part); None as a part: its end
        self._last: dict[Any, int] = {}  # each generation's latest item, by its index in _items
        self._open: weakref.WeakSet[Any] = weakref.WeakSet()  # generations with a part out already
        self._urgent = False  # a first part or an end is held: out at the next take
        self._held_at: float | None = None  # when the items now held began to wait
        self._checked: float | None = None  # the last take: the gap to the next is a step's time

    def __len__(self) -> int:
        return len(self._items)

    def post(self, generation: Any, part: tuple[str, Any] | None) -> None:
        items, at = self._items, self._last.get(generation)
        if part is None or generation not in self._open:
            self._urgent = True
        elif at is not None and part[0] in JOINED:
            kind, text = items[at][1] or (None, None)
            if kind == part[0]:  # the same kind as its latest part: one piece
                items[at] = (generation, (kind, text + part[1]))
                return
        self._last[generation] = len(items)
        items.append((generation, part))

    def take(self, now: float, *, force: bool = False) -> list[tuple[Any, Any]]:
        """The items to hand over now (the event loop's one call), or [] while they may wait."""
        step = now - self._checked if self._checked is not None else None
        self._checked = now
        if not self._items:
            return []
        if not (force or self._urgent or self.interval <= 0 or step is None):
            if self._held_at is None:
                self._held_at = now
            if now - self._held_at + step <= self.interval:  # still within it after the next step
                return []
        sent, self._items = self._items, []
        self._last.clear()
        self._urgent = False
        self._held_at = None
        for generation, part in sent:
            if part is None:
                self._open.discard(generation)
            else:
                self._open.add(generation)
        return sent
