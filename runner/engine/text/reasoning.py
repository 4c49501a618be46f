"""Reasoning apart from the answer: a streaming splitter for models that think before they answer.

Two styles, told apart by the model's chat template:
  "think"     <think> … </think> before the answer (Qwen3, DeepSeek-R1 distills, SmolLM3). A template
              may open the block itself at the end of the generation prompt (R1 distills do), so the
              model's first token is already reasoning: `start_in_reasoning`.
  "channels"  gpt-oss's harmony format: <|channel|>analysis<|message|> … <|end|> then
              <|start|>assistant<|channel|>final<|message|> …; analysis (and commentary) is
              reasoning, final is the answer. Its markers are control tokens, so the loop renders
              special tokens for these models (runner.engine.sequence.Job.special).
The splitter takes text in any pieces (a tag may arrive split at any byte) and returns
("reasoning" | "answer", text) parts as soon as they cannot be part of a marker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REASONING = "reasoning"
ANSWER = "answer"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CHANNEL, MESSAGE, END, START = "<|channel|>", "<|message|>", "<|end|>", "<|start|>"
_CHANNEL_MARKERS = (CHANNEL, MESSAGE, END, START, "<|return|>", "<|call|>", "<|constrain|>")


def style_of(template: str | None) -> str | None:
    """The reasoning style a chat template speaks, or None (no reasoning to split)."""
    if not template:
        return None
    if CHANNEL in template and MESSAGE in template:
        return "channels"
    if THINK_OPEN in template or THINK_CLOSE in template:
        return "think"
    return None


def opens_reasoning(prompt_text: str) -> bool:
    """Whether a rendered prompt ends inside an open <think> block (the template opened it)."""
    at = prompt_text.rfind(THINK_OPEN)
    return at >= 0 and THINK_CLOSE not in prompt_text[at:]


@dataclass
class Splitter:
    style: str | None
    start_in_reasoning: bool = False
    _held: str = ""
    _where: str = field(init=False)
    _header: bool = False  # channels: between <|channel|> and <|message|> (the channel's name)
    _channel: str = ""
    _after_think: bool = False  # think: strip the blank lines between </think> and the answer

    def __post_init__(self) -> None:
        self._where = REASONING if self.start_in_reasoning else ANSWER

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
        while self._held:
            hits = [(self._held.find(m), m) for m in markers if m in self._held]
            if hits:
                at, marker = min(hits)
                self._emit(parts, self._held[:at])
                self._held = self._held[at + len(marker) :]
                self._marker(marker)
                continue
            keep = 0 if final else _partial_marker(self._held, markers)
            self._emit(parts, self._held[: len(self._held) - keep])
            self._held = self._held[len(self._held) - keep :]
            break
        if final and self._header:  # a channel name never closed: nothing more to say
            self._header = False
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

    def _marker(self, marker: str) -> None:
        if marker == THINK_OPEN:
            self._where = REASONING
        elif marker == THINK_CLOSE:
            self._where, self._after_think = ANSWER, True
        elif marker == CHANNEL:
            self._header, self._channel = True, ""
        elif marker == MESSAGE:
            if self._header:
                name = self._channel.strip().split()[0] if self._channel.strip() else ""
                self._where = ANSWER if name == "final" else REASONING
            self._header = False
        elif marker == START:  # "<|start|>assistant" heads the next message: its role is no text
            self._header, self._channel = True, ""
        # <|end|>, <|return|>, <|call|>, <|constrain|>: markers only


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
