"""Reasoning apart from the answer: a streaming splitter for models that think before they answer.

Two styles, told apart by the model's chat template:
  "think"     <think> … </think> before the answer (Qwen3, DeepSeek-R1 distills, SmolLM3). A template
              may open the block itself at the end of the generation prompt (R1 distills do), so the
              model's first token is already reasoning: `start_in_reasoning`.
  "channels"  gpt-oss's harmony format: <|channel|>analysis<|message|> … <|end|> then
              <|start|>assistant<|channel|>final<|message|> …; analysis (and commentary) is
              reasoning, final is the answer. Its markers are control tokens, so the loop renders
              special tokens for these models (runner.engine.sequence.Job.special). A request with
              tools (`calls`): a message to a functions.NAME recipient ("<|channel|>commentary
              to=functions.NAME <|constrain|>json<|message|>{...}<|call|>", the recipient in the
              channel's header or the role's, " to=..." first when the generation prompt wrote
              "<|start|>assistant") is a call, kept in the answer as
              "<|channel|>commentary to=functions.NAME<|message|>{...}<|call|>" for
              runner.engine.text.toolcalls to read; neither reasoning nor answer text once read.
The splitter takes text in any pieces (a tag may arrive split at any byte) and returns
("reasoning" | "answer", text) parts as soon as they cannot be part of a marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

REASONING = "reasoning"
ANSWER = "answer"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CHANNEL, MESSAGE, END, START = "<|channel|>", "<|message|>", "<|end|>", "<|start|>"
CALL = "<|call|>"
_CHANNEL_MARKERS = (CHANNEL, MESSAGE, END, START, "<|return|>", CALL, "<|constrain|>")
_RECIPIENT = re.compile(r"\bto=functions\.([^\s\x00]+)")
_LEAD = (" to=", "to=")  # the role header's recipient, first when the prompt ended "<|start|>assistant"


def style_of(template: str | None) -> str | None:
    """The reasoning style a chat template speaks, or None (no reasoning to split)."""
    if not template:
        return None
    if CHANNEL in template and MESSAGE in template:
        return "channels"
    if THINK_OPEN in template or THINK_CLOSE in template:
        return "think"
    return None


THINK_LEVELS = ("off", "low", "medium", "high")  # --think LEVEL, Ollama's think, OpenAI's reasoning_effort
# thinking tokens at most, for a model whose template has no switch of its own for the level asked
LEVEL_BUDGETS = {"off": 0, "low": 256, "medium": 1024}


def think_settings(think: bool | str | None, template: str) -> tuple[dict[str, bool | str], int | None]:
    """What --think asks of a chat template, and the reasoning budget where the template cannot do it
    itself. True/False: `enable_thinking` as before. A level (THINK_LEVELS): the template's own switch
    where it has one (`enable_thinking`: Qwen3, SmolLM3, off or on; `reasoning_effort`: gpt-oss, its
    levels, "low" for off); else, and for a level the switch cannot say, a budget (LEVEL_BUDGETS;
    "high": none). None: the template's defaults."""
    if think is None:
        return {}, None
    if isinstance(think, bool):
        return {"enable_thinking": think}, None
    kwargs: dict[str, bool | str] = {}
    switch, effort = "enable_thinking" in template, "reasoning_effort" in template
    if switch:
        kwargs["enable_thinking"] = think != "off"
    if effort:
        kwargs["reasoning_effort"] = "low" if think == "off" else think
    handled = (switch and think == "off") or (effort and think != "off") or think == "high"
    return kwargs, None if handled else LEVEL_BUDGETS[think]


BUDGET_NOTE = "\n\nI have used my thinking budget; I must answer now.\n"  # what the model reads, forced


def closing(style: str | None, note: str = BUDGET_NOTE) -> str | None:
    """What ends a model's thinking in its own format, `note` first (the reasoning budget's: the
    model reads it, then the end of its thinking, and answers): </think> for "think", the end of
    the analysis message and the start of the final one for gpt-oss's channels. None: no style."""
    if style == "think":
        return f"{note}{THINK_CLOSE}\n\n"
    if style == "channels":
        return f"{note}{END}{START}assistant{CHANNEL}final{MESSAGE}"
    return None


def opens_reasoning(prompt_text: str) -> bool:
    """Whether a rendered prompt ends inside an open <think> block (the template opened it)."""
    at = prompt_text.rfind(THINK_OPEN)
    return at >= 0 and THINK_CLOSE not in prompt_text[at:]


@dataclass
class Splitter:
    style: str | None
    start_in_reasoning: bool = False
    calls: bool = False  # channels: the request has tools; a message to functions.NAME is a call
    _held: str = ""
    _where: str = field(init=False)
    _header: bool = False  # channels: between <|start|> or <|channel|> and <|message|> (the header)
    _channel: str = ""  # the header's text, each <|channel|> in it a NUL
    _call: bool = False  # channels: inside a call's message (its arguments)
    _fresh: bool = field(init=False)  # channels, calls: nothing read yet (the role's recipient may come)
    _after_think: bool = False  # think: strip the blank lines between </think> and the answer

    def __post_init__(self) -> None:
        self._where = REASONING if self.start_in_reasoning else ANSWER
        self._fresh = self.calls and self.style == "channels"

    def in_header(self) -> bool:
        """Channels: inside a message's header (its channel's name), which is neither reasoning nor
        answer: a reasoning budget does not count it."""
        return self._header

    def answering(self, *, settled: bool = False) -> bool:
        """Whether text pushed now is the answer's (`settled`: and the blank lines after </think> are
        behind): a token is the answer's when this held before its text and, settled, after."""
        return self._where == ANSWER and not self._header and not (settled and self._after_think)

    def push(self, text: str) -> list[tuple[str, str]]:
        if self.style is None:
            return [(ANSWER, text)] if text else []
        self._held += text
        return self._drain(final=False)

    def flush(self) -> list[tuple[str, str]]:
        return self._drain(final=True) if self.style is not None else []

    def _drain(self, *, final: bool) -> list[tuple[str, str]]:
        parts: list[tuple[str, str]] = []
        markers = (THINK_OPEN, THINK_CLOSE) if self.style == "think" else _CHANNEL_MARKERS
        if self._fresh and self._held:  # " to=functions.x<|channel|>...": the role's header goes on
            if self._held.startswith(_LEAD):
                self._header, self._fresh = True, False
            elif final or not any(lead.startswith(self._held) for lead in _LEAD):
                self._fresh = False
            else:
                return []
        while self._held:
            hits = [(self._held.find(m), m) for m in markers if m in self._held]
            if hits:
                at, marker = min(hits)
                self._emit(parts, self._held[:at])
                self._held = self._held[at + len(marker) :]
                self._marker(marker, parts)
                continue
            keep = 0 if final else _partial_marker(self._held, markers)
            self._emit(parts, self._held[: len(self._held) - keep])
            self._held = self._held[len(self._held) - keep :]
            break
        if final and self._header:  # a channel name never closed: nothing more to say
            self._header = False
        if final and self._call:  # <|call|> ends generation: the loop never renders it
            self._end_call(parts)
        return _merge(parts)

    def _emit(self, parts: list[tuple[str, str]], text: str) -> None:
        if not text:
            return
        if self._header:  # the channel's name, not text
            self._channel += text
            return
        if self._after_think:
            text = text.lstrip("\n")
            if not text:
                return
            self._after_think = False
        parts.append((self._where, text))

    def _marker(self, marker: str, parts: list[tuple[str, str]]) -> None:
        self._fresh = False
        if marker == THINK_OPEN:
            self._where = REASONING
        elif marker == THINK_CLOSE:
            self._where, self._after_think = ANSWER, True
        elif marker == CHANNEL:  # after "<|start|>assistant to=...", the same header goes on
            self._channel = f"{self._channel if self._header else ''}\x00"
            self._header = True
        elif marker == MESSAGE:
            if self._header:
                self._message(parts)
            self._header = False
        elif marker == START:  # "<|start|>assistant" heads the next message: its role is no text
            self._end_call(parts)
            self._header, self._channel = True, ""
        elif marker != "<|constrain|>":  # <|end|>, <|return|>, <|call|>: a message ends
            self._end_call(parts)

    def _message(self, parts: list[tuple[str, str]]) -> None:
        """A message's header read: where its text goes (a call: the answer, marked as one)."""
        recipient = _RECIPIENT.search(self._channel) if self.calls else None
        if recipient is not None:
            self._where, self._call = ANSWER, True
            parts.append((ANSWER, f"{CHANNEL}commentary to=functions.{recipient.group(1)}{MESSAGE}"))
            return
        words = self._channel.rsplit("\x00", 1)[-1].split()
        self._where = ANSWER if words[:1] == ["final"] else REASONING

    def _end_call(self, parts: list[tuple[str, str]]) -> None:
        if self._call:
            parts.append((ANSWER, CALL))
            self._call = False


def _partial_marker(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a marker (held back)."""
    best = 0
    for marker in markers:
        for n in range(min(len(text), len(marker) - 1), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


def _merge(parts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for kind, text in parts:
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        else:
            out.append((kind, text))
    return out
