"""Fill-in-the-middle: the prompt a code model completes between a prefix and a suffix, laid out token
for token as the pinned llama-server's `format_prompt_infill` lays it out (tools/server/server-common.cpp).

The model's own FIM tokens come from its GGUF (`tokenizer.ggml.fim_pre/suf/mid/rep/sep_token_id`): a
model without the first three cannot fill in, and is refused, never given a made-up format. The
repo-level layout (Qwen2.5-Coder's, arXiv 2409.12186) puts the other files first:

    [FIM_REP]myproject\\n [FIM_SEP]file0\\n text0 ... [FIM_SEP]filename\\n
    [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]

without FIM_REP/FIM_SEP, each extra chunk follows a "--- snippet ---" line instead. What fits: the
prefix's last 3/4 of a batch, the suffix up to 1/4 of it (less the prompt and two tokens), the extra
chunks' last tokens in what the context has left past a batch. Nothing here calls llama.cpp: the
tokenizer is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

FIM_KEYS = ("fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")
NEEDED = ("fim_pre", "fim_suf", "fim_mid")  # without one of these a model cannot fill in
SERVER_BATCH = 2048  # llama-server's default --batch-size: what its layout keeps of each part
REUSE_CHUNK = 256  # a cached run of at least this many tokens is shifted into place, not evaluated
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"  # between extra chunks, for a model without FIM_SEP

Tokenize = Callable[[str], list[int]]  # text -> tokens, no BOS, special tokens not parsed


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's FIM tokens (-1: none)."""

    pre: int = -1
    suf: int = -1
    mid: int = -1
    pad: int = -1
    rep: int = -1
    sep: int = -1

    @property
    def missing(self) -> list[str]:
        """The tokens it lacks of those filling in needs ("prefix", "suffix", "middle")."""
        names = (("prefix", self.pre), ("suffix", self.suf), ("middle", self.mid))
        return [name for name, token in names if token < 0]


@dataclass(frozen=True)
class Chunk:
    """One extra file of a repo-level request: its text and its name."""

    text: str
    filename: str = "tmp"


@dataclass(frozen=True)
class Infill:
    """What a fill-in-the-middle request gives: the text before the cursor and after it, other
    files, and `prompt`, text that goes right after the prefix (llama.vim sends the current line's
    start there). Each part is text, or a list of text and token ids (llama-server's mixed prompt)."""

    prefix: str | list[str | int]
    suffix: str | list[str | int]
    extra: tuple[Chunk, ...] = field(default_factory=tuple)
    prompt: str = ""


def tokenize_mixed(tokenize: Tokenize, part: str | Sequence[str | int]) -> list[int]:
    """Text, or a list of text and token ids, as tokens (llama-server's tokenize_mixed, no BOS)."""
    if isinstance(part, str):
        return tokenize(part)
    tokens: list[int] = []
    for item in part:
        tokens += tokenize(item) if isinstance(item, str) else [int(item)]
    return tokens


def infill_tokens(
    fim: FimTokens,
    tokenize: Tokenize,
    infill: Infill,
    prompt_tokens: Sequence[int],
    *,
    n_ctx: int,
    bos: int | None,
    n_batch: int = SERVER_BATCH,
    n_predict: int = -1,
) -> list[int]:
    """The prompt's tokens, as llama-server builds them for the same request (`prompt_tokens`: the
    prompt field tokenized with special tokens parsed; `bos`: the BOS token where the vocabulary adds
    one; `n_ctx`: a sequence's context; `n_predict`: the server's own limit, -1 as llama-server's)."""
    extra: list[int] = []
    prefix = tokenize_mixed(tokenize, infill.prefix)
    suffix = tokenize_mixed(tokenize, infill.suffix)
    if fim.rep >= 0:
        extra += [fim.rep, *tokenize("myproject\n")]
    for chunk in infill.extra:
        if fim.sep >= 0:
            extra += [fim.sep, *tokenize(chunk.filename + "\n")]
        else:
            extra += tokenize(CHUNK_SEPARATOR)
        extra += tokenize(chunk.text)
    if fim.sep >= 0:
        extra += [fim.sep, *tokenize("filename\n")]
    take_prefix = min(len(prefix), 3 * (n_batch // 4))
    take_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt_tokens))))
    take_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))
    head = [fim.pre, *prefix[len(prefix) - take_prefix :], *prompt_tokens]
    tail = [fim.suf, *suffix[:take_suffix]]
    if bos is not None:
        head.insert(0, bos)
    kept_extra = extra[len(extra) - take_extra :] if take_extra else []
    return [*kept_extra, *head, *tail, fim.mid]
