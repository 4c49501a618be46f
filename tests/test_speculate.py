"""Speculative decoding with the real model: the same answers, drafts kept where they should be."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.engine.engine import Engine
from runner.engine.prompt import render_prompt
from runner.engine.speculate import (
    CONTINUING,
    NGRAM_KEYS,
    NgramDrafter,
    SpecCosts,
    Speculator,
    draft_mismatch,
)
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.template import Message
from runner.gguf import read_header
from tests.conftest import run_cli
from tests.serving import same_unless_near_tie
from tests.synth import SPECS, Spec, write_model

GREEDY = SamplingConfig(temperature=0)
COPYING = NGRAM_KEYS[0] + CONTINUING  # the kind of a draft that carries on a copy under way
PARAGRAPH = (
    "The old lighthouse stood on the northern cliff for two hundred years. Every night its keeper "
    "climbed the spiral stairs, trimmed the wick and polished the great lens until it shone. Ships "
    "passing in the dark trusted its beam to guide them past the rocks."
)
COPY = f"Rewrite the following paragraph, changing 'keeper' to 'guardian'.\n\n{PARAGRAPH}"
FREE = ["Write a short story about a dragon who bakes bread.", "Name three colors.", "What is 7 times 6?"]


@pytest.fixture(scope="module")
def target(smollm2_path: Path):
    with Engine(smollm2_path, n_ctx=2048, n_threads=2) as engine:
        yield engine


@pytest.fixture(scope="module")
def draft_path(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight llama with SmolLM2's tokenizer: a valid draft that is almost always wrong."""
    spec = Spec("llama", n_layer=2, n_embd=64, n_head=2, n_head_kv=1, n_ff=128, n_ctx_train=8192)
    return write_model(tmp_path_factory.mktemp("draft") / "draft.gguf", _tokenized(spec, smollm2_path))


def _tokenized(spec: Spec, source: Path, edits: dict[int, str] | None = None) -> Spec:
    from dataclasses import replace

    return replace(spec, tokenizer=source, token_edits=edits or {})


def tokens_for(engine: Engine, path: Path, text: str) -> list[int]:
    return render_prompt(engine, read_header(path), [Message("user", text)]).tokens


def answer(
    engine: Engine,
    prompt: list[int],
    mode: str,
    sampling: SamplingConfig = GREEDY,
    max_tokens: int = 120,
    **kw: object,
):
    engine.speculate(mode, **kw)  # type: ignore[arg-type]
    try:
        engine.context.reset()
        return engine.generate(prompt, sampling, max_tokens=max_tokens)
    finally:
        engine.speculate("none")


# -- the drafting logic, on token lists -------------------------------------------------------------


@pytest.mark.fast
def test_ngram_drafts_what_followed_the_latest_earlier_match() -> None:
    d = NgramDrafter()
    history = [1, 2, 3, 4, 5, 6, 9, 1, 2, 3, 4, 7, 8, 1, 2, 3, 4]
    kind, most = d.candidates(history)
    assert kind == 4  # the longest key that matches: [1, 2, 3, 4]
    assert d.propose(history, most) == [7, 8, 1, 2, 3, 4]  # the latest match, not the first
    assert d.propose(history, 2) == [7, 8]
    history += [7, 8]  # the answer copies what was proposed: a copy under way, followed at its place
    assert d.candidates(history)[0] == COPYING and d.propose(history, 3) == [1, 2, 3]
    history += [5]  # it parts from its source: back to lookups
    assert d.candidates(history) == (0, 0)


@pytest.mark.fast
def test_a_copy_is_followed_at_its_own_place_where_the_text_repeats() -> None:
    d = NgramDrafter()
    source = [1, 2, 3, 4, 50, 51, 1, 2, 3, 4, 60, 61, 62]
    history = [*source, 9, 1, 2, 3, 4]
    d.candidates(history)
    assert d.propose(history, 1) == [60]  # the latest match
    history += [50]  # the model copies the first place instead
    assert d.candidates(history)[0] == 4 and d.propose(history, 2) == [51, 1]


@pytest.mark.fast
def test_unverified_drafts_are_scored_as_the_answer_goes_on() -> None:
    spec = Speculator(NgramDrafter())
    spec.plain_step(0.010)
    spec.batch_cost.scale = 50.0  # verify batches far too dear: nothing is drafted, only scored
    source = list(range(100, 140))
    history = [*source, 1, 2, *source[:3]]
    before = None
    for token in source[3:20]:
        assert spec.draft(history, 32) == []
        history.append(token)
        p = spec._accept(COPYING).p
        assert before is None or p >= before  # each copied token raises the copy's acceptance
        before = p
    assert before is not None and before > 0.97


@pytest.mark.fast
def test_a_first_match_is_verified_only_once_its_shadow_was_kept_where_batches_cost() -> None:
    # free text repeats its short phrases by chance: on a CPU (a verify batch of one draft costs ~1.7
    # steps, the prior shape) a first match costs nothing; its draft is scored as a shadow, and once
    # its first token came the copy drafts, short (a chance that went on for a token costs little)
    spec = Speculator(NgramDrafter())
    spec.plain_step(0.010)
    source = list(range(100, 140))
    history = [*source, 1, 2, *source[:4]]  # a 4-token key: [100, 101, 102, 103]
    assert spec.draft(history, 32) == []  # a shadow, not a verify batch
    history.append(source[4])  # the shadow's first token came: a copy under way
    drafts = spec.draft(history, 32)
    assert drafts == source[5 : 5 + len(drafts)] and 1 <= len(drafts) <= 4
    # once batches were measured nearly free (a GPU, after its first copy), the same first match drafts
    gpu = Speculator(NgramDrafter())
    gpu.plain_step(0.010)
    for _ in range(6):
        gpu.costs.verify_step(8, 0.0105)
    assert gpu.draft([*source, 1, 2, *source[:4]], 32)[:2] == source[4:6]


@pytest.mark.fast
def test_what_a_kind_of_draft_earned_carries_to_the_next_answer() -> None:
    """Free text repeats a phrase by chance: a match that misses at once, or whose first token came
    and then its drafts missed. After two answers of each, the next chance match is no verify batch;
    a real copy, scored as a shadow for free, drafts again within a few tokens. A fresh loop (its own
    SpecCosts) drafts at once."""
    costs = SpecCosts()
    spec = Speculator(NgramDrafter(), costs=costs)
    spec.plain_step(0.010)
    source = list(range(100, 140))
    start = [*source, 1, 2, *source[:4]]  # a 4-token key: [100, 101, 102, 103]

    def chance_match(first_came: bool) -> list[int]:
        spec.begin()
        assert spec.draft(start, 32) == []  # a shadow
        return spec.draft([*start, source[4] if first_came else 99], 32)

    for _ in range(2):  # a match whose first token came and whose drafts missed; one that missed at once
        drafts = chance_match(True)
        assert drafts
        spec.verified(len(drafts), 0, 0.010 * (1.2 + 0.48 * len(drafts)), 0.0)  # none kept
        assert chance_match(False) == []
    assert chance_match(True) == []
    fresh = Speculator(NgramDrafter(), costs=SpecCosts())
    fresh.plain_step(0.010)
    assert fresh.draft(start, 32) == []  # a shadow ...
    assert fresh.draft([*start, source[4]], 32)  # ... then drafts
    spec.begin()
    history = list(start)
    for token in source[4:20]:  # a real copy: the shadow keeps matching
        history.append(token)
        if drafts := spec.draft(history, 32):
            break
    assert drafts and drafts == source[len(history) - len(start) + 4 :][: len(drafts)]
    assert len(history) - len(start) <= 6, len(history) - len(start)


@pytest.mark.fast
def test_ngram_falls_back_to_shorter_keys_and_never_matches_itself() -> None:
    d = NgramDrafter()
    assert d.candidates([10, 11, 12]) == (0, 0)  # the suffix alone is no earlier match
    d = NgramDrafter()
    history = [7, 8, 30, 40, 9, 7, 8]
    kind, most = d.candidates(history)
    assert (kind, d.propose(history, most)) == (2, [30, 40, 9, 7, 8])


class _Fixed:
    """A drafter that proposes a given continuation (for the controller's arithmetic)."""

    mode = "test"
    costs_time = False

    def reset(self) -> None: ...

    def candidates(self, history: list[int]) -> tuple[int, int]:
        return 1, 32

    def propose(self, history: list[int], n: int) -> list[int]:
        return [0] * n

    def close(self) -> None: ...


@pytest.mark.fast
def test_the_draft_length_follows_acceptance_and_batch_cost() -> None:
    spec = Speculator(_Fixed())
    spec.plain_step(0.010)
    assert spec._best_length(0.99, 32) >= 8  # nearly every draft kept: long drafts
    assert spec._best_length(0.3, 32) == 0  # mostly rejected: a plain step is faster
    for _ in range(6):  # a GPU-like machine: a verify batch costs little more than one token
        spec.verified(8, 8, 0.0105, 0.0)
    assert spec._best_length(0.9, 32) > 8 and spec.batch_cost(8) < 0.2


@pytest.mark.fast
def test_speculation_stops_for_the_answer_when_it_does_not_pay() -> None:
    spec = Speculator(_Fixed())
    spec.plain_step(0.010)
    spec.draft([1, 2, 3], 32)
    for _ in range(8):  # each batch: 4 drafts, none kept, 3 steps' time for 1 token
        spec.verified(4, 0, 0.030, 0.0)
    assert spec.stopped and spec.draft([1, 2, 3], 32) == []
    assert spec.stats().stopped and spec.stats().acceptance == 0.0
    spec.begin()  # a new answer tries again
    assert not spec.stopped


# -- the engine, with the real model ---------------------------------------------------------------


@pytest.mark.model
def test_ngram_speculation_keeps_the_greedy_answer_of_a_copy_task(target: Engine, smollm2_path: Path) -> None:
    prompt = tokens_for(target, smollm2_path, COPY)
    plain = answer(target, prompt, "none")
    fixed = answer(target, prompt, "ngram", fixed=8)
    adaptive = answer(target, prompt, "ngram")
    same_unless_near_tie(target, prompt, plain.text, fixed.text)
    same_unless_near_tie(target, prompt, plain.text, adaptive.text)
    s = fixed.timings.speculation
    assert s.mode == "ngram" and s.steps > 3
    assert s.acceptance > 0.6 and s.mean_accepted > 3  # the paragraph is copied: most drafts kept
    assert fixed.timings.completion_tokens == plain.timings.completion_tokens
    assert PARAGRAPH[:40] in plain.text  # the task really is a copy for this model


@pytest.mark.model
def test_the_model_as_its_own_draft_keeps_nearly_every_draft(target: Engine, smollm2_path: Path) -> None:
    for text in FREE:
        prompt = tokens_for(target, smollm2_path, text)
        plain = answer(target, prompt, "none")
        drafted = answer(target, prompt, "draft", draft=Engine(smollm2_path, n_ctx=2048), fixed=4)
        same_unless_near_tie(target, prompt, plain.text, drafted.text)
        s = drafted.timings.speculation
        assert s.mode == "draft" and s.steps > 0 and s.acceptance > 0.9, s


@pytest.mark.model
def test_a_bad_draft_is_rejected_and_the_answer_stays_the_same(
    target: Engine, smollm2_path: Path, draft_path: Path
) -> None:
    prompt = tokens_for(target, smollm2_path, FREE[0])
    plain = answer(target, prompt, "none")
    drafted = answer(target, prompt, "draft", draft=Engine(draft_path, n_ctx=2048), fixed=4)
    same_unless_near_tie(target, prompt, plain.text, drafted.text)
    s = drafted.timings.speculation
    assert s.steps > 10 and s.acceptance < 0.3, s


@pytest.mark.model
def test_sampling_with_a_seed_gives_the_same_answer_with_speculation(
    target: Engine, smollm2_path: Path
) -> None:
    """Each kept token is the target's own draw, by the same chain in the same order: a seeded answer
    at temperature > 0 does not change (checked by token, where a flip would begin)."""
    prompt = tokens_for(target, smollm2_path, COPY)
    sampling = SamplingConfig(temperature=0.7, seed=42)
    plain = answer(target, prompt, "none", sampling)
    drafted = answer(target, prompt, "ngram", sampling, fixed=8)
    assert drafted.timings.speculation.accepted > 0
    assert plain.text == drafted.text


@pytest.mark.model
def test_drafts_stop_at_max_tokens_and_the_context(target: Engine, smollm2_path: Path) -> None:
    prompt = tokens_for(target, smollm2_path, COPY)
    for limit in (1, 2, 5, 17):
        result = answer(target, prompt, "ngram", fixed=16, max_tokens=limit)
        assert result.timings.completion_tokens == limit
    with Engine(smollm2_path, n_ctx=512, n_threads=2) as small:
        filler = ""
        while len(long := tokens_for(small, smollm2_path, filler + COPY)) < small.context.n_ctx - 24:
            filler += "Read this carefully. "  # the copy task, 24 tokens short of the context's end
        small.speculate("ngram", fixed=16)
        result = small.generate(long, GREEDY)
        assert result.context_full and result.timings.speculation.steps > 0
        assert (
            len(long) + result.timings.completion_tokens == small.context.n_ctx >= len(small.context.cells[0])
        )


@pytest.mark.model
def test_a_recurrent_model_decodes_plainly(tmp_path: Path) -> None:
    path = write_model(tmp_path / "mamba.gguf", SPECS["mamba"])
    with Engine(path, n_ctx=256, n_threads=2) as engine:
        assert engine.speculate("ngram") is False and engine.speculation is None


# -- draft models checked before loading; the CLI ----------------------------------------------------


@pytest.mark.model
def test_draft_vocabularies_are_compared_as_llama_cpp_does(smollm2_path: Path, tmp_path: Path) -> None:
    target = read_header(smollm2_path)
    base = Spec("llama", n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=128)
    same = write_model(tmp_path / "same.gguf", _tokenized(base, smollm2_path))
    assert draft_mismatch(target, read_header(same)) is None
    edited = write_model(tmp_path / "edit.gguf", _tokenized(base, smollm2_path, {300: "zzz"}))
    assert "token 300" in (draft_mismatch(target, read_header(edited)) or "")
    none = write_model(tmp_path / "none.gguf", base)
    assert "tokenizer" in (draft_mismatch(target, read_header(none)) or "")


@pytest.mark.parametrize(
    "make, words",
    [
        ("other-vocab", "cannot draft for this model: its tokenizer is"),
        ("missing", "no-such-draft.gguf"),
        ("bigger", "is bigger than the model it would draft for"),
        ("spec-too", "give one of them"),
        ("bad-spec", "--spec must be ngram or none"),
    ],
)
def test_bad_draft_usage_is_one_line_and_exit_2(
    smollm2_path: Path, draft_path: Path, tmp_path: Path, make: str, words: str
) -> None:
    model, extra = str(smollm2_path), ["--draft", str(draft_path)]
    if make == "other-vocab":
        extra = ["--draft", str(write_model(tmp_path / "v.gguf", Spec("llama", n_layer=1, n_embd=64)))]
    elif make == "missing":
        extra = ["--draft", str(tmp_path / "no-such-draft.gguf")]
    elif make == "bigger":
        model, extra = str(draft_path), ["--draft", str(smollm2_path)]
    elif make == "spec-too":
        extra += ["--spec", "ngram"]
    elif make == "bad-spec":
        extra = ["--spec", "eagle"]
    proc = run_cli("run", model, "Hi", "--max-tokens", "4", *extra)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert proc.stdout == b"" and words in err and len(err.strip().splitlines()) == 1, err


def test_json_and_verbose_report_the_speculation(smollm2_path: Path) -> None:
    args = ["run", str(smollm2_path), COPY, "--temperature", "0", "--max-tokens", "80"]
    data = json.loads(run_cli(*args, "--json").stdout)
    spec = data["speculation"]
    assert spec["mode"] == "ngram" and spec["accepted"] <= spec["drafted"]
    assert set(spec) == {"mode", "drafted", "accepted", "acceptance_rate", "mean_accepted", "stopped"}
    off = json.loads(run_cli(*args, "--json", "--spec", "none").stdout)
    assert "speculation" not in off and off["text"] == data["text"]
    verbose = run_cli(*args, "--verbose").stderr.decode()
    assert "spec ngram:" in verbose


def test_a_draft_for_a_recurrent_model_is_refused_with_a_warning(tmp_path: Path) -> None:
    target = write_model(tmp_path / "mamba.gguf", SPECS["mamba"])
    draft = write_model(tmp_path / "tiny.gguf", Spec("llama", n_layer=1, n_embd=64, n_head=2, n_ff=128))
    assert draft.stat().st_size < target.stat().st_size
    proc = run_cli("run", str(target), "Hi", "--max-tokens", "2", "--draft", str(draft))
    assert "cannot drop rejected drafts" in proc.stderr.decode(), proc.stderr.decode()
