"""Speculative decoding: propose several tokens cheaply, let the target verify them in one batch.

The one loop (runner.engine.loop) does the verifying, per sequence inside the shared batch: it adds
[last, d0 … dk-1] to the step's llama_decode with logits at every position, samples each position in
order with the answer's own native sampler chain, keeps the drafts up to the first one its sample
differs from, plus that sample, and drops the rest from the KV cache. Each kept token is the target's
own sample, drawn by the same chain in the same order as without speculation, so the answer does not
change (up to llama.cpp's batch-size-dependent kernels, which can flip a near tie).

This module proposes, and decides how many to propose:
  NgramDrafter   prompt lookup: the tokens that followed the latest earlier match of the answer's last
                 n-gram (keys of 4, then 3, then 2 tokens) in the prompt and the answer so far; while
                 the answer copies a proposal's source, it is followed at that place
  ModelDrafter   a small model with the same vocabulary, decoding greedily in its own context
  Speculator     one sequence's adaptive length: from the measured cost of a plain step, of the
                 tokens drafts add to it, of drafting, and the acceptance measured (SpecCosts: shared
                 by every sequence of a loop, carried from answer to answer), the draft length with
                 the best expected tokens per second for the whole batch, or none (a copy kept
                 whole at least doubles its next draft); speculation stops for the rest of an
                 answer when the last verify batches, as measured, did not pay. With n sequences in
                 a step, a sequence's drafts slow all n: it drafts only where (n + expected kept) /
                 (step + drafts' cost) beats n / step, so a batch full enough that drafting costs
                 more than it saves drafts nothing (on a CPU, whose step cost grows with its
                 tokens, at a few sequences; on a GPU, whose step barely does, much later).

Where runner differs from llama.cpp's (common/speculative.cpp, pinned build):
  ngram-simple looks up a 12-token key and drafts up to 48 tokens whenever it matches; runner looks up
  4, 3 or 2 tokens (the longest that matches) and sizes the draft by its acceptance at that key length,
  so a 135M model's short copies are found and spurious short matches do not cost a verify batch.
  A draft model: llama.cpp drafts --spec-draft-n-max (3) tokens; runner adapts 1 … 16 as above
  (n-gram drafts: 1 … 32).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from runner.engine.llamacpp import llama

if TYPE_CHECKING:
    from runner.engine.context import Context

SPEC_NONE = "none"
SPEC_NGRAM = "ngram"
SPEC_DRAFT = "draft"

NGRAM_KEYS = (4, 3, 2)  # key lengths looked up, longest first
NGRAM_MAX = 32  # most tokens an n-gram draft proposes
DRAFT_MAX = 16  # most tokens a draft model proposes
WINDOW = 8  # verify steps the "does it pay" check looks back over
PAYS = 0.85  # below this measured gain (time a plain loop would have taken / time taken) it stops
# A verify batch of k drafts costs 1 + scale * (FIXED + PER_TOKEN * k) plain steps: the shape measured
# on this CPU (SmolLM2, 2 cores: 1 draft 1.7 steps, 8 drafts 4.7, 16 drafts 8.9), scale 1 until a batch
# is measured; a GPU's batches are nearly free and its scale soon falls near 0.
BATCH_COST_FIXED = 0.2
BATCH_COST_PER_TOKEN = 0.48
VOCAB_SIZE_SLACK = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_FROM = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID: the first few are often specials
EMA = 0.3  # weight of a new timing measurement
FORGET = 0.9  # per verify batch, the weight left to older batch costs


@dataclass(frozen=True)
class Speculation:
    """An engine's speculative decoding setting: the mode, the draft model's engine (mode "draft"),
    and a fixed draft length (tests, benchmarks; None: adaptive)."""

    mode: str
    draft: Any = None
    fixed: int | None = None


@dataclass(frozen=True)
class SpecStats:
    mode: str = SPEC_NONE
    steps: int = 0  # verify batches
    drafted: int = 0  # tokens proposed and verified
    accepted: int = 0  # of those, kept
    stopped: bool = False  # switched off for the rest of the answer: it did not pay

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """Drafted tokens kept per verify batch (each batch also yields one token of the target's)."""
        return self.accepted / self.steps if self.steps else 0.0


class Drafter(Protocol):
    mode: str
    costs_time: bool  # drafting itself takes time worth measuring (a model, not a lookup)

    def reset(self) -> None:
        """A new answer begins."""

    def candidates(self, history: Sequence[int]) -> tuple[int, int]:
        """(kind, most): a key for the acceptance to use, and how many tokens could be proposed."""

    def propose(self, history: Sequence[int], n: int) -> list[int]: ...

    def close(self) -> None: ...


class NgramDrafter:
    """Prompt lookup over an index of every n-gram seen so far: O(1) per token."""

    mode = SPEC_NGRAM
    costs_time = False

    def __init__(self, keys: Sequence[int] = NGRAM_KEYS, most: int = NGRAM_MAX, is_end: Any = None) -> None:
        self.keys = tuple(keys)
        self.most = most
        self.is_end = is_end  # token -> bool: a draft ends with an end-of-generation token of its source
        self.reset()

    def reset(self) -> None:
        self._follow: dict[int, dict[tuple[int, ...], int]] = {k: {} for k in self.keys}
        self._indexed = 0  # history[:_indexed] has had its n-grams entered
        self._match: tuple[int, int] | None = None  # (key length, start of the continuation)
        # a copy under way: the history index whose token the next one would copy, and how far the
        # history had been followed (set by each proposal, verified or not; None: no copy now)
        self._aligned: int | None = None
        self._followed = 0

    def _index(self, history: Sequence[int]) -> None:
        # an n-gram ending at i is entered once its follower (i + 1) exists: the latest match of the
        # current suffix is then always an earlier one, never the suffix itself
        for end in range(max(self._indexed, 1), len(history)):
            for k, table in self._follow.items():
                if end >= k:
                    table[tuple(history[end - k : end])] = end
        self._indexed = max(self._indexed, len(history))

    def candidates(self, history: Sequence[int]) -> tuple[int, int]:
        """The kind is the key length, or CONTINUING + the longest while the tokens that came since
        the last proposal copied its source: a copy under way, kept far more often, and followed at
        its own place even where the text repeats itself (the latest match could be another)."""
        self._index(history)
        if self._follow_copy(history):
            assert self._aligned is not None
            self._match = (0, self._aligned)
            return NGRAM_KEYS[0] + CONTINUING, min(self.most, len(history) - self._aligned)
        self._match = None
        for k in self.keys:
            if len(history) < k:
                continue
            start = self._follow[k].get(tuple(history[-k:]))
            if start is not None:
                self._match = (k, start)
                return k, min(self.most, len(history) - start)
        return 0, 0

    def _follow_copy(self, history: Sequence[int]) -> bool:
        """Walk the aligned source over the tokens that came: True while every one copied it."""
        if self._aligned is None:
            return False
        came = range(self._followed, len(history))
        self._followed = len(history)
        if not came:
            return False
        for i in came:
            if self._aligned >= i or history[i] != history[self._aligned]:
                self._aligned = None
                return False
            self._aligned += 1
        return True

    def propose(self, history: Sequence[int], n: int) -> list[int]:
        if self._match is None:
            return []
        _, start = self._match
        proposal = list(history[start : start + n])
        if self.is_end is not None:  # what follows an end in the source (a template's turn) is never next
            cut = next((i for i, t in enumerate(proposal) if self.is_end(t)), None)
            proposal = proposal if cut is None else proposal[: cut + 1]
        self._aligned, self._followed = start, len(history)  # the next token would copy history[start]
        return proposal

    def close(self) -> None:
        pass


class ModelDrafter:
    """A small model with the target's vocabulary, in its own context, drafting greedily for one
    sequence (`seq`: the target's sequence, the same one in the draft's context, which holds as many).
    Its KV cache follows the answer by the context's own prefill: only what changed is evaluated. The
    draft engine's context is shared by every sequence's drafter and closed by its owner, not here."""

    mode = SPEC_DRAFT
    costs_time = True

    def __init__(self, context: Context, seq: int = 0, most: int = DRAFT_MAX) -> None:
        self.context = context
        self.seq = seq
        self.most = most
        lib = llama()
        self._greedy = lib.llama_sampler_init_greedy()

    def reset(self) -> None:
        pass  # the draft's KV cache keeps what the next prompt shares, as the target's does

    def candidates(self, history: Sequence[int]) -> tuple[int, int]:
        return 1, min(self.most, self.context.n_ctx_seq - len(history) - 1)

    def propose(self, history: Sequence[int], n: int) -> list[int]:
        lib = llama()
        context = self.context
        context.prefill(history, self.seq)
        out: list[int] = []
        for i in range(n):
            token = lib.llama_sampler_sample(self._greedy, context.ctx, -1)
            out.append(token)
            if context.model.is_end(token):
                break
            if i + 1 < n:
                context.extend([token], self.seq)
        return out

    def close(self) -> None:
        if self._greedy:
            llama().llama_sampler_free(self._greedy)
            self._greedy = None


# Acceptance before anything is measured, by the kind of draft: (kept, missed) pseudo-counts. A key that
# matches is as often chance as a copy (free text repeats its 2- to 4-token phrases): 1 in 2. Where a
# verify batch costs more than a step (a CPU), its first drafts are then shadows, scored for free as the
# answer goes on; once batches were measured nearly free (a GPU, after its first copy), it drafts at
# once. A shadow whose first token came is a copy under way (CONTINUING): 6 in 7, so its drafts start
# short (3 on this CPU) and double while kept whole, and a chance match that went on for a token costs
# one short batch. A draft model: 3 in 4.
CONTINUING = 10
COPY_ACCEPTANCE = 0.99  # the acceptance that bounds how far a copy's drafts grow
ACCEPTANCE_PRIOR = {4: (1.0, 1.0), 3: (1.0, 1.0), 2: (1.0, 1.0), 1: (3.0, 1.0)}
ACCEPTANCE_PRIOR[NGRAM_KEYS[0] + CONTINUING] = (6.0, 1.0)


class _Acceptance:
    """Per-token acceptance: a slowly decaying count of kept and rejected drafts, from a prior."""

    def __init__(self, kind: int) -> None:
        self.kept, self.missed = ACCEPTANCE_PRIOR.get(kind, (3.0, 1.0))

    def add(self, kept: int, missed: int) -> None:
        self.kept = self.kept * 0.9 + kept
        self.missed = self.missed * 0.9 + missed

    @property
    def p(self) -> float:
        return self.kept / (self.kept + self.missed)


class SpecCosts:
    """What steps cost on this machine, measured as the loop runs and shared by every sequence's
    Speculator (it carries over from answer to answer): a plain step (every sequence's one token),
    the extra a step's drafted tokens add, in plain steps, and drafting time per drafted token. And
    how each kind of draft fared (its acceptance): a server's answers, a chat's turns, tend to be
    alike, so what the last answers taught (free text: a 1-token match is chance) is where the next
    one starts; a shadow, scored for free, raises it again within a few tokens of a real copy."""

    def __init__(self) -> None:
        self.step_s: float | None = None
        self.batch_cost = _BatchCost()
        self.draft_s = 0.0
        self.acceptance: dict[int, _Acceptance] = {}

    def plain_step(self, seconds: float) -> None:
        self.step_s = _ema(self.step_s, seconds)

    def verify_step(self, drafted: int, seconds: float) -> None:
        """A step with `drafted` drafts in all took `seconds` (drafting not included)."""
        if self.step_s is not None and drafted:
            self.batch_cost.add(drafted, seconds / self.step_s - 1.0)


class Speculator:
    """One sequence's speculation: what to draft at each step, and whether it still pays. The measured
    costs and each kind's acceptance (SpecCosts) carry over from answer to answer and are shared by
    a loop's sequences; the "does it pay" record is per answer."""

    def __init__(self, drafter: Any, fixed: int | None = None, costs: SpecCosts | None = None) -> None:
        self.drafter = drafter
        self.fixed = fixed  # draft this many whenever possible, never stop (tests, benchmarks)
        self.costs = costs if costs is not None else SpecCosts()
        self.begin()

    @property
    def step_s(self) -> float | None:
        """A plain step (decode every sequence's one token, sample), measured."""
        return self.costs.step_s

    @property
    def batch_cost(self) -> _BatchCost:
        """The extra cost of a step's drafted tokens, in plain steps."""
        return self.costs.batch_cost

    @property
    def draft_s(self) -> float:
        """Drafting time per drafted token (a draft model), measured."""
        return self.costs.draft_s

    @property
    def mode(self) -> str:
        return str(self.drafter.mode)

    def begin(self) -> None:
        """A new answer."""
        self.drafter.reset()
        self._kind = 0
        self._full_run = 0  # the last verify's draft length, when every draft of it was kept
        self._recent: list[tuple[float, float]] = []  # (time a plain loop would take, time taken)
        self._shadow: tuple[int, list[int], int] | None = None  # an n-gram draft not verified
        self._sequences = 1  # how many shared the last step drafted for
        self.steps = self.drafted = self.accepted = 0
        self.stopped = False

    # -- what to draft ------------------------------------------------------------------------

    def draft(self, history: Sequence[int], room: int, sequences: int = 1) -> list[int]:
        """Tokens to verify after history's last token (at most `room`), or none for a plain step;
        `sequences`: how many share the step (each one's token is slowed by these drafts)."""
        if self.stopped or room < 1:
            return []
        self._check_shadow(history)
        if self.step_s is None:  # the first step is plain: it measures what a plain step costs
            return []
        kind, most = self.drafter.candidates(history)
        most = min(most, room)
        if most < 1:
            return []
        self._sequences = sequences
        p = self._accept(kind).p
        n = min(self.fixed, most) if self.fixed else self._best_length(p, most, sequences)
        if kind > CONTINUING and self._full_run and not self.fixed:
            # a copy whose last draft was kept whole: the longer it has run, the likelier it goes
            # on (a geometric guess undersells that), so at least double the last draft, up to the
            # best length were nearly every draft kept (so the price of a miss stays bounded)
            n = max(n, min(2 * self._full_run, self._best_length(COPY_ACCEPTANCE, most, sequences)))
        if n == 0:
            if self.drafter.costs_time:  # nothing would change the estimate again: off for this answer
                self.stopped = True
            elif self._shadow is None:
                # a free draft: see, as the answer goes on, whether it would have been kept
                self._shadow = (kind, self.drafter.propose(history, most), len(history))
            return []
        self._shadow = None
        start = time.perf_counter()
        proposal = self.drafter.propose(history, n)
        if self.drafter.costs_time and proposal:
            per_token = (time.perf_counter() - start) / len(proposal)
            self.costs.draft_s = _ema(self.costs.draft_s or None, per_token)
        self._kind = kind
        return proposal

    def _best_length(self, p: float, most: int, sequences: int = 1) -> int:
        """The draft length with the best expected tokens per second for the whole step (each of the
        `sequences` gives one token; this one's kept drafts come on top); 0 if a plain step is better."""
        assert self.step_s is not None
        best_n, best_rate = 0, sequences / self.step_s
        expected, p_i = float(sequences), 1.0
        for n in range(1, most + 1):
            p_i *= p
            expected += p_i  # the target's own token, plus each draft kept only if all before were
            cost = self.step_s * (1.0 + self.batch_cost(n)) + self.draft_s * n
            rate = expected / cost
            if rate > best_rate * 1.02:
                best_n, best_rate = n, rate
        return best_n

    def _accept(self, kind: int) -> _Acceptance:
        learned = self.costs.acceptance
        if kind not in learned:
            learned[kind] = _Acceptance(kind)
        return learned[kind]

    def _check_shadow(self, history: Sequence[int]) -> None:
        """Score an n-gram draft that was not verified against the tokens that came instead, as they
        come: each one that matches counts as kept, the first that does not as missed."""
        if self._shadow is None:
            return
        kind, proposal, at = self._shadow
        came = history[at : at + len(proposal)]
        kept = 0
        for want, got in zip(proposal, came, strict=False):
            if want != got:
                self._accept(kind).add(kept, 1)
                self._shadow = None
                return
            kept += 1
        self._accept(kind).add(kept, 0)
        rest = proposal[kept:]
        # once its first token came, the rest is a copy under way: scored as such
        going_on = NGRAM_KEYS[0] + CONTINUING if kept else kind
        self._shadow = (going_on, rest, at + kept) if rest else None

    # -- what happened ------------------------------------------------------------------------

    def plain_step(self, seconds: float) -> None:
        self.costs.plain_step(seconds)

    def verified(
        self, drafted: int, kept: int, seconds: float, draft_seconds: float, *, measured: bool = True
    ) -> None:
        """A verify step of `drafted` drafts (plus the last token) took `seconds` (drafting included;
        in a step several sequences drafted in, this one's share); `kept` drafts were the target's own
        samples. `measured`: the step's cost is this sequence's alone to learn from (one sequence);
        the loop measures a shared step once (SpecCosts.verify_step)."""
        assert self.step_s is not None
        self.steps += 1
        self.drafted += drafted
        self.accepted += kept
        self._accept(self._kind).add(kept, int(kept < drafted))
        self._full_run = drafted if kept == drafted else 0
        if measured:
            self.costs.verify_step(drafted, seconds - draft_seconds)
        n = self._sequences
        self._recent = (self._recent + [((kept + n) * self.step_s / n, seconds)])[-WINDOW:]
        if len(self._recent) == WINDOW and not self.fixed:
            worth = sum(w for w, _ in self._recent)
            spent = sum(s for _, s in self._recent)
            if worth < PAYS * spent:
                self.stopped = True

    def stats(self) -> SpecStats:
        return SpecStats(self.mode, self.steps, self.drafted, self.accepted, self.stopped)

    def close(self) -> None:
        self.drafter.close()


class _BatchCost:
    """extra(k) = scale * (PRIOR_FIXED + PRIOR_PER_TOKEN * k): the CPU's shape, scaled by least squares
    to the measured batches (older ones weigh less). One parameter: batches of one size define it."""

    def __init__(self) -> None:
        self._shape_y = self._shape_shape = 0.0  # Σ y·shape(k), Σ shape(k)² over the measurements
        self.scale = 1.0

    def add(self, k: int, y: float) -> None:
        shape = _shape(k)
        self._shape_y = self._shape_y * FORGET + max(0.0, y) * shape
        self._shape_shape = self._shape_shape * FORGET + shape * shape
        self.scale = self._shape_y / self._shape_shape

    def __call__(self, k: int) -> float:
        return self.scale * _shape(k)


def _shape(k: int) -> float:
    return BATCH_COST_FIXED + BATCH_COST_PER_TOKEN * k


def _ema(old: float | None, new: float) -> float:
    return new if old is None else old + EMA * (new - old)


def draft_mismatch(target: Any, draft: Any) -> str | None:
    """Why a draft model (its GGUF header) cannot draft for the target, or None: llama.cpp's own test
    (common_speculative_are_compatible) on the headers, so it runs before either model loads."""
    tokenizer = "tokenizer.ggml.model"
    if target.get(tokenizer) != draft.get(tokenizer):
        return f"its tokenizer is {draft.get(tokenizer)!r}, the target's {target.get(tokenizer)!r}"
    for flag, token in (("add_bos_token", "bos_token_id"), ("add_eos_token", "eos_token_id")):
        adds = target.get(f"tokenizer.ggml.{flag}")
        if adds != draft.get(f"tokenizer.ggml.{flag}") or (
            adds and target.get(f"tokenizer.ggml.{token}") != draft.get(f"tokenizer.ggml.{token}")
        ):
            return f"its {token.split('_')[0].upper()} token differs from the target's"
    ours, theirs = target.get("tokenizer.ggml.tokens") or [], draft.get("tokenizer.ggml.tokens") or []
    if abs(len(ours) - len(theirs)) > VOCAB_SIZE_SLACK:
        return f"its vocabulary has {len(theirs):,} tokens, the target's {len(ours):,}"
    for i in range(VOCAB_CHECK_FROM, min(len(ours), len(theirs))):
        if ours[i] != theirs[i]:
            return f"token {i} is {theirs[i]!r} in it, {ours[i]!r} in the target"
    return None
