"""JSON Schema enforced by llguidance: a token mask per constrained sequence, applied to its logits.

llguidance (the constraint engine llama.cpp itself builds with LLAMA_LLGUIDANCE; its wheel has no
dependencies) compiles a JSON Schema to a grammar in about a millisecond, with the keywords
llama-cpp-python's GBNF converter has not (integer and number ranges, formats, patterns, ...), and
computes the set of tokens that keep the answer valid in well under a millisecond a token. How it is
used here (runner.engine.loop): before a constrained sequence samples, its mask sets every token the
schema cannot take next to -inf in that sequence's row of logits; the sampler chain then picks as it
always does (greedy, or temperature and a draw), and the token picked is consumed by the matcher. A
sequence without a guide pays nothing. The tokenizer llguidance needs is built from the model's own
vocabulary once per loaded model (Guides); a grammar is compiled once per text and kept, bounded, and
each answer gets a copy of the compiled matcher.

Imported only where a schema is asked for: `runner --help` and a plain `runner run` never load it.
"""

from __future__ import annotations

import ctypes
import warnings
from collections import OrderedDict
from typing import Any

import llguidance
import numpy as np

from runner.errors import InvalidSetting

KEEP = 64  # compiled grammars kept per loaded model, least recently used dropped first


class GuideError(InvalidSetting):
    """llguidance refused a grammar with this model's vocabulary."""


class Guide:
    """One answer's matcher: mask() the logits before each sample, take() the token sampled."""

    def __init__(self, matcher: Any, n_vocab: int) -> None:
        self.matcher = matcher
        self.n_vocab = n_vocab
        self.bits = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self.error: str | None = None

    def mask(self, logits: Any) -> None:
        """Every token the grammar cannot take next set to -inf in this row of logits (a float*)."""
        self.matcher.unsafe_compute_mask_ptr(self.bits.ctypes.data, self.bits.nbytes)
        allowed = np.unpackbits(self.bits.view(np.uint8), count=self.n_vocab, bitorder="little")
        floats = ctypes.cast(logits, ctypes.POINTER(ctypes.c_float))
        row = np.ctypeslib.as_array(floats, shape=(self.n_vocab,))
        row[allowed == 0] = -np.inf

    def take(self, token: int) -> bool:
        """The token sampled, consumed; False (and `error` said) where the grammar could not take it."""
        if self.matcher.consume_token(token):
            return True
        self.error = self.matcher.get_error() or f"the grammar cannot take token {token}"
        return False

    @property
    def done(self) -> bool:
        return bool(self.matcher.is_stopped())


class Guides:
    """A loaded model's llguidance tokenizer (built on first use) and its compiled grammars."""

    def __init__(self, vocab: Any, n_vocab: int, end_tokens: list[int]) -> None:
        self.vocab = vocab
        self.n_vocab = n_vocab
        self.end_tokens = end_tokens
        self._tokenizer: Any = None
        self._compiled: OrderedDict[str, Any] = OrderedDict()

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from llguidance.llamacpp import lltokenizer_from_vocab

            with warnings.catch_warnings():  # it calls llama_token_get_attr, deprecated: once a token
                warnings.simplefilter("ignore", DeprecationWarning)
                self._tokenizer = lltokenizer_from_vocab(self.vocab, eos_token=self.end_tokens)
        return self._tokenizer

    def guide(self, grammar: str) -> Guide:
        """A fresh matcher for `grammar` (llguidance's), compiled once per text; GuideError where it
        cannot be compiled with this vocabulary."""
        compiled = self._compiled.get(grammar)
        if compiled is None:
            compiled = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
            if compiled.is_error():
                problem = f"cannot be enforced: {compiled.get_error()}"
                raise GuideError(f"the schema {problem}", field="schema", problem=problem)
            self._compiled[grammar] = compiled
            while len(self._compiled) > KEEP:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(grammar)
        return Guide(compiled.deep_copy(), self.n_vocab)
