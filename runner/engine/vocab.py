"""A model's vocabulary without its weights (llama.cpp's vocab_only load): what counting tokens, the
token utilities and a chat's rendering need, in milliseconds and a few MB, for a model of any size."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from runner.engine.llamacpp import Placement
from runner.engine.model import Model
from runner.engine.prompt import render_prompt
from runner.engine.text.template import Message

if TYPE_CHECKING:
    from runner.engine.request import Prompt
    from runner.gguf import GGUFHeader


def open_vocab(path: str | Path) -> Model:
    """The GGUF's vocabulary alone (a Model with no weights: tokens only, no context over it)."""
    return Model(path, Placement(use_gpu=False), vocab_only=True)


def render_chat(
    vocab: Model, header: GGUFHeader, messages: list[Message], tools: list[dict[str, Any]] | None = None
) -> Prompt:
    """A chat rendered and tokenized as `runner run`, `chat` and `serve` render it (runner.engine
    .prompt.render_prompt, over the vocabulary alone: no images)."""
    engine: Any = SimpleNamespace(model=vocab, vision=None, path=vocab.path)
    return render_prompt(engine, header, messages, quiet=True, tools=tools)
