"""A fill-in-the-middle request as the prompt the engine evaluates: the model's FIM tokens read from its
vocabulary, the parts tokenized and laid out as llama-server lays them (runner.engine.text.fim), one
`Prompt` for the one `Request` every answer goes through."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.engine.request import Prompt
from runner.engine.text.fim import Infill, infill_tokens
from runner.errors import NoInfill

if TYPE_CHECKING:
    from runner.engine.model import Model


def infill_prompt(model: Model, infill: Infill, n_ctx: int, name: str) -> Prompt:
    """The prompt for `infill` on `model` (`n_ctx`: a sequence's context; `name`: the model as the
    user named it, for NoInfill where its GGUF has no FIM tokens)."""
    fim = model.fim_tokens()
    if fim.missing:
        raise NoInfill(name, fim.missing)

    def plain(text: str) -> list[int]:
        return model.tokenize(text, add_special=False, parse_special=False)

    asked = model.tokenize(infill.prompt, add_special=False, parse_special=True) if infill.prompt else []
    bos = model.bos if model.adds_bos and model.bos >= 0 else None
    tokens = infill_tokens(fim, plain, infill, asked, n_ctx=n_ctx, bos=bos)
    return Prompt(tokens, "")
