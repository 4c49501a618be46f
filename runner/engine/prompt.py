"""From what the user typed or piped to the tokens the model sees."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from runner import ui
from runner.engine.request import Prompt
from runner.engine.text.reasoning import opens_reasoning, style_of, think_settings
from runner.engine.text.template import TEMPLATE_KEY, Message, render
from runner.engine.text.toolcalls import GENERIC, format_of
from runner.engine.text.tools import tools_as_system
from runner.errors import UsageError

if TYPE_CHECKING:
    from runner.engine.engine import Engine
    from runner.gguf import GGUFHeader


def read_prompt(argument: str | None, stdin: BinaryIO | None) -> str:
    """The prompt: piped text first, then the argument. stdin is None when it is a terminal."""
    piped = None
    if stdin is not None:
        data = stdin.read()
        try:
            piped = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"stdin is not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r})"
            ) from exc
    if argument is None and stdin is None:
        raise UsageError("no prompt: give PROMPT, or pipe text in (echo hi | runner run MODEL)")
    prompt = "\n\n".join(part for part in (piped.rstrip("\n") if piped else "", argument or "") if part)
    if not prompt.strip():
        raise UsageError("the prompt is empty")
    return prompt


_TOLD: set[str] = set()  # the models already said not to think, once a process each


def _cannot_think(name: str, quiet: bool) -> None:
    """Thinking asked of a model whose template has none (no <think>, no channels, no switch): said
    once, never an error (a client's reasoning_effort, a script's --think stay valid)."""
    if not quiet and name not in _TOLD:
        _TOLD.add(name)
        ui.warn(f"{name} does not think (its chat template has no thinking): asked to, it answers as ever")


def render_prompt(
    engine: Engine,
    header: GGUFHeader,
    messages: list[Message],
    *,
    raw: bool = False,
    enable_thinking: bool | str | None = None,
    quiet: bool = False,
    tools: list[dict[str, Any]] | None = None,
    images: Sequence[Any] = (),
) -> Prompt:
    """A conversation (system first, if any, then alternating turns ending with the user's) as tokens.

    Without a template the text goes as it is, with a warning (unless quiet): one message alone is
    the prompt itself; a conversation is written as "User: … / Assistant: …" lines. `images`
    (runner.images.Image, decoded), in the order of the media markers (engine.vision.marker) the
    messages hold: tokenized by the projector's tokenizer, as llama-server does. A template also says
    how its model writes a tool call (Prompt.tool_format); without one, calls are read as generic.
    `enable_thinking`: --think/--no-think, or a level (runner.engine.text.reasoning.think_settings):
    the template's own switch, else a reasoning budget the prompt carries (Prompt.think_budget).
    `tools` go to a template that reads them; any other gets them described in the system message.
    """

    def tokenized(text: str, style: str | None = None, opens: bool = False, calls: str = GENERIC) -> Prompt:
        if not images:
            return Prompt(engine.model.tokenize(text), text, style, opens, tool_format=calls)
        if engine.vision is None:
            raise UsageError(f"{engine.path.name} takes no images without its projector: give --mmproj")
        media = engine.vision.tokenize(text, images)
        return Prompt(media.tokens, text, style, opens, media, calls)

    source = header.get(TEMPLATE_KEY)
    if tools and not raw and not (isinstance(source, str) and "tools" in source):
        messages, tools = tools_as_system(messages, tools), None  # the template would not show them
    system = messages[0].content if messages and messages[0].role == "system" else None
    turns = messages[1:] if system is not None else messages
    if raw:
        if system is not None:
            raise UsageError(
                "--system needs the chat template; drop --raw, or put the system text in the prompt"
            )
        text = "\n\n".join(m.content for m in turns)
        return tokenized(text)
    if not isinstance(source, str) or not source.strip():
        if not quiet:
            ui.warn(f"{header.source} has no chat template; sending the prompt as is (as with --raw)")
        if len(turns) == 1:
            text = turns[0].content
        else:
            names = {"user": "User", "assistant": "Assistant"}
            text = "\n".join(f"{names.get(m.role, m.role)}: {m.content}" for m in turns) + "\nAssistant:"
        if system is not None:
            text = f"{system}\n\n{text}"
        return tokenized(text)
    switches, budget = think_settings(enable_thinking, source)
    text = render(
        source,
        messages,
        bos_token=engine.model.bos_text,
        eos_token=engine.model.eos_text,
        enable_thinking=switches.get("enable_thinking"),  # type: ignore[arg-type]
        reasoning_effort=switches.get("reasoning_effort"),  # type: ignore[arg-type]
        tools=tools,
    )
    if engine.model.adds_bos and engine.model.bos_text and text.startswith(engine.model.bos_text):
        text = text[len(engine.model.bos_text) :]  # tokenize adds it; a second BOS degrades answers
    style = style_of(source)
    if enable_thinking not in (None, False, "off") and style is None and not switches:
        _cannot_think(Path(str(header.source)).name, quiet)
    prompt = tokenized(text, style, style == "think" and opens_reasoning(text), format_of(source))
    return replace(prompt, think_budget=budget) if budget is not None and style is not None else prompt
