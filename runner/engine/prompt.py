"""From what the user typed or piped to the tokens the model sees."""

from __future__ import annotations

from typing import TYPE_CHECKING, BinaryIO

from runner import ui
from runner.engine.template import TEMPLATE_KEY, build_messages, render
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


def prompt_tokens(
    engine: Engine, header: GGUFHeader, prompt: str, *, system: str | None = None, raw: bool = False
) -> list[int]:
    """Render the chat template (unless raw) and tokenize, as llama.cpp does: specials parsed."""
    if raw:
        if system is not None:
            raise UsageError(
                "--system needs the chat template; drop --raw, or put the system text in the prompt"
            )
        return engine.tokenize(prompt)
    source = header.get(TEMPLATE_KEY)
    if not isinstance(source, str) or not source.strip():
        ui.warn(f"{header.source} has no chat template; sending the prompt as is (as with --raw)")
        if system is not None:
            prompt = f"{system}\n\n{prompt}"
        return engine.tokenize(prompt)
    text = render(
        source, build_messages(prompt, system), bos_token=engine.bos_text, eos_token=engine.eos_text
    )
    if engine.adds_bos and engine.bos_text and text.startswith(engine.bos_text):
        text = text[len(engine.bos_text) :]  # tokenize adds it; a second BOS degrades answers
    return engine.tokenize(text)
