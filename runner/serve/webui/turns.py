"""A turn posted from the page, answered through the server's one backend (the same path the OpenAI API
takes: an Ask submitted, its Generation read) and kept in the store by the server, not the page.

The turn holds its conversation (runner.store.turns.holding) from the question to the answer, so a
`runner chat` or a second tab continuing it meanwhile waits for it. The answer goes on when the page
goes away (a closed tab loses nothing: it is stored when it ends, and a page that comes back follows
it from its start); only the stop button (Turn.stop) ends it early, and what came is then stored
marked interrupted, as a Ctrl-C in the terminal keeps it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from runner import ui
from runner.engine.answer import FINISH_INTERRUPTED, result_json
from runner.errors import ImageError
from runner.images import Image, ImageRef, load_image
from runner.serve.backend import Generation, Outcome
from runner.serve.shared.translate import past_call
from runner.serve.webui.conversations import Conversations, Held, as_json
from runner.store import Store, StoredConversation, StoredMessage, StoreError

# what a stored answer's stats keep of runner.engine.answer.TIMINGS: the names runner chat keeps
STORED_TIMINGS = (
    "prompt_tokens",
    "prefill_tokens",
    "completion_tokens",
    "ttft_s",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
)


class Turn:
    """One answer in progress for one conversation: its events kept (a page that comes back replays
    them) and sent to every page that follows it; the answer stored when it ends, however it ends."""

    def __init__(
        self,
        conversation: int,
        generation: Generation,
        held: Held,
        store: Conversations,
        model: str,
        asked: Callable[[Store], object] = lambda store: None,
    ) -> None:
        self.conversation = conversation
        self.generation = generation
        self.events: list[dict[str, Any]] = []
        self.done = False
        self._held = held
        self._store = store
        self._model = model  # as the store names it: what `runner run -c` opens again
        self._asked = asked  # the question's writes: done beside the answer's first tokens, not before
        self._more = asyncio.Event()

    def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._more.set()
        self._more = asyncio.Event()

    def stop(self) -> None:
        """The stop button: the sequence is freed at the engine's next step."""
        self.generation.cancel()

    async def run(self) -> None:
        """The question written while the answer comes (it fits: it was submitted), the answer's
        pieces sent on, then the answer kept, after the question; the conversation given back."""
        asked = asyncio.ensure_future(self._store.call(self._asked))
        try:
            async for kind, text in self.generation:
                if kind in ("answer", "reasoning") and text:
                    self.emit({"type": kind, "text": text})
            await asked
            await self._keep(self.generation.outcome)
        except Exception as exc:  # an answer that failed its check; the store failing
            ui.warn(f"conversation {self.conversation}: the answer failed: {exc}")
            self.generation.cancel()
            await self.generation.wait()
            self.emit({"type": "error", "message": str(exc) or type(exc).__name__})
            if not asked.cancelled() and asked.done() and asked.exception() is None:
                await self._keep(self.generation.outcome, failed=True)
        finally:
            self._held.release()
            self.done = True
            self.emit({"type": "end"})

    async def _keep(self, outcome: Outcome, failed: bool = False) -> None:
        message = answer_message(outcome, self._model)
        if failed and outcome.result.text == "" and outcome.result.reasoning == "":
            return  # nothing came: the question stays unanswered, as an error leaves it in the terminal
        try:
            await self._store.add(self.conversation, message)
        except StoreError as exc:  # deleted meanwhile, or the database failing: said, never raised
            ui.warn(f"conversation {self.conversation}: the answer was not kept: {exc}")
            self.emit({"type": "error", "message": f"the answer was not kept: {exc}"})
            return
        self.emit({"type": "done", "message": as_json(message)})

    async def follow(self) -> AsyncIterator[dict[str, Any]]:
        """Every event from the first, then each as it comes, until the turn ends."""
        seen = 0
        while True:
            more = self._more
            while seen < len(self.events):
                seen += 1
                yield self.events[seen - 1]
            if self.done and seen >= len(self.events):
                return
            await more.wait()


def answer_message(outcome: Outcome, model: str) -> StoredMessage:
    """An answer as the store keeps it, as runner chat keeps one (its stats the answer's JSON laid flat)."""
    result = outcome.result
    data = result_json(result, STORED_TIMINGS, usage=())
    stats = {"finish_reason": outcome.finish_reason, **data["timings"]}
    stats.update({name: data[name] for name in ("speculation", "error") if name in data})
    interrupted = result.finish_reason == FINISH_INTERRUPTED
    calls = tuple(
        {"id": str(c.get("id") or f"call_{n}"), "name": c["name"], "arguments": c.get("arguments") or {}}
        for n, c in enumerate(result.tool_calls)
    )
    return StoredMessage(
        "assistant",
        result.text,
        result.reasoning.strip() or None,
        interrupted,
        stats=stats,
        model=model,
        tool_calls=calls,
    )


def ask_messages(
    conversation: StoredConversation, messages: Sequence[StoredMessage], pixels: dict[str, Image]
) -> list[dict[str, Any]]:
    """The conversation as Ask.messages carries it: the system message, each turn as the template
    reads it (an assistant's calls, a tool's result with the call it answers), a user turn's images
    first and its text after (as `runner run --image` sends them), where their pixels are at hand."""
    out: list[dict[str, Any]] = []
    if conversation.system:
        out.append({"role": "system", "content": conversation.system})
    for m in messages:
        seen = [pixels[i.sha256] for i in m.images if i.sha256 in pixels]
        message: dict[str, Any] = {"role": m.role, "content": [*seen, m.content] if seen else m.content}
        if m.tool_calls:
            message["tool_calls"] = [past_call(c["id"], c["name"], c["arguments"]) for c in m.tool_calls]
        if m.role == "tool":
            message["tool_call_id"] = m.call_id or ""
            message["name"] = m.tool or ""
        out.append(message)
    return out


def read_images(messages: Sequence[StoredMessage], at_most: int, max_bytes: int) -> dict[str, Image]:
    """The latest `at_most` images the turns refer to, each read again from its file and decoded
    where it is still the same image (its sha256); the others are left out, as a resumed chat leaves
    them (runs in a worker thread: Pillow's work)."""
    refs = list({i.sha256: i for m in messages for i in m.images}.values())
    found: dict[str, Image] = {}
    for ref in refs[::-1][:at_most] if at_most > 0 else []:
        try:
            data = Path(ref.path).read_bytes()
            image = load_image(data, name=f"image {ref.sha256[:12]}", max_bytes=max_bytes)
        except (OSError, ImageError):
            continue
        if image.sha256 == ref.sha256:
            found[ref.sha256] = image
    return found


def keep_image(folder: Path, data: bytes, image: Image) -> ImageRef:
    """An image sent from the page, kept as a file of runner's data folder named by its digest (what
    the store refers to, and what `runner chat --resume` reads again)."""
    path = folder / f"{image.sha256}.{image.format.lower()}"
    folder.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.write_bytes(data)
    return ImageRef(image.sha256, image.size, str(path))
