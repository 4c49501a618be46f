"""What the one generation loop (runner.engine.loop) needs of an engine, as a Protocol: the loop is
written against it, and runner.engine.engine.Engine is one (tests drive the loop with stand-ins)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from runner.engine.prefix import Sequences
from runner.engine.speculate import SpecCosts, Speculation, Speculator
from runner.engine.text.sampling import SamplingConfig
from runner.engine.threads import Threads
from runner.errors import PromptTooLong


class Decoder(Sequences, Protocol):
    """What the loop needs of an engine (runner.engine.engine.Engine is one): its context's steps
    (runner.engine.context), its vocabulary, sampler chains and speculation."""

    threads: Threads
    n_seq: int
    n_vocab: int
    n_batch: int
    load_s: float
    speculation: Speculation | None
    spec_costs: SpecCosts | None

    @property
    def n_ctx_seq(self) -> int: ...

    def too_long(self, n: int, max_tokens: int | None = None) -> PromptTooLong | None: ...

    def prefill(self, tokens: Sequence[int], seq: int = 0, media: Any = None) -> int: ...

    def extend(
        self,
        tokens: Sequence[int],
        seq: int = 0,
        *,
        logits: bool = True,
        all_logits: bool = False,
        rows_from: int | None = None,
    ) -> None: ...

    def keep_head(self, tokens: Sequence[int], seq: int = 0) -> int: ...

    def position(self, seq: int = 0, n: int | None = None) -> int: ...

    def reserve(self, tokens: int) -> None: ...

    def batch_for(self, n: int) -> Any: ...

    def evaluate(self, batch: Any) -> None: ...

    def is_end(self, token: int) -> bool: ...

    def token_bytes(self, token: int, *, special: bool = False) -> bytes: ...

    def sampler(
        self, cfg: SamplingConfig, history: Sequence[int] = (), grammar: str | None = None
    ) -> Any: ...

    def guide(self, grammar: str) -> Any: ...

    def new_speculator(self, seq: int) -> Speculator: ...

    def reset(self) -> None: ...
