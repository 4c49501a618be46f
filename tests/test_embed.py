"""Embeddings with the real model: unit vectors, the same in process, batched and through `runner
embed`, same-topic texts closer than unrelated ones, and bad input refused with exit 2."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.engine.embed import Embedder, EmptyInput, InputTooLong, normalized, plan_batches
from runner.engine.engine import Engine
from tests.conftest import run_cli
from tests.serving import BATCH_COSINE, BATCH_TOLERANCE, TEXTS, cosine

SAME_TOPIC = [(0, 1), (2, 3), (4, 5)]
CLI_TOLERANCE = 1e-6  # another process, maybe another thread count, the text alone: measured 0 here


@pytest.fixture(scope="module")
def embedder(engine: Engine) -> Iterator[Embedder]:
    with Embedder(engine) as made:
        yield made


@pytest.fixture(scope="module")
def vectors(embedder: Embedder) -> list[list[float]]:
    return embedder.embed([embedder.tokenize(t) for t in TEXTS])


# -- pure parts ------------------------------------------------------------------------------


@pytest.mark.fast
def test_batches_are_consecutive_and_bounded_by_tokens_and_sequences() -> None:
    assert plan_batches([3, 3, 3], 10, 8) == [range(0, 3)]
    assert plan_batches([4, 4, 4], 10, 8) == [range(0, 2), range(2, 3)]
    assert plan_batches([10, 1, 9], 10, 8) == [range(0, 1), range(1, 3)]
    assert plan_batches([1] * 5, 100, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert plan_batches([], 10, 8) == []


@pytest.mark.fast
def test_normalized_is_unit_length_and_zero_stays_zero() -> None:
    assert normalized([3.0, 4.0]) == [0.6, 0.8]
    assert normalized([0.0, 0.0]) == [0.0, 0.0]


# -- the engine ------------------------------------------------------------------------------


@pytest.mark.model
def test_mean_pooling_for_a_chat_model_and_its_size(embedder: Embedder) -> None:
    assert embedder.pooling == "mean"  # SmolLM2's GGUF declares no pooling
    # flash attention off where the engine's is "auto", unlike a reranker's (runner.engine.embed says why)
    assert (embedder.engine.context.flash_attn, embedder.context.flash_attn) == (None, False)
    assert embedder.n_embd == 576
    assert embedder.n_ctx == 512  # EMBED_CTX: the session engine was trained on more


@pytest.mark.model
def test_vectors_are_unit_length(vectors: list[list[float]]) -> None:
    for vector in vectors:
        assert len(vector) == 576
        assert math.isclose(math.hypot(*vector), 1.0, abs_tol=1e-9)


@pytest.mark.model
def test_same_topic_is_closer_than_any_other_topic(vectors: list[list[float]]) -> None:
    for a, b in SAME_TOPIC:
        same = cosine(vectors[a], vectors[b])
        others = [cosine(vectors[a], vectors[c]) for c in range(len(TEXTS)) if c not in (a, b)]
        assert same > max(others), (TEXTS[a], same, others)


@pytest.mark.model
def test_batched_is_one_by_one_and_repeatable(embedder: Embedder, vectors: list[list[float]]) -> None:
    alone = [embedder.embed([embedder.tokenize(t)])[0] for t in TEXTS]
    worst = max(abs(x - y) for v, w in zip(vectors, alone, strict=True) for x, y in zip(v, w, strict=True))
    assert worst <= 1e-6  # one short batch: what the kernels do for one sequence, to the last bits
    assert embedder.embed([embedder.tokenize(t) for t in TEXTS]) == vectors


@pytest.mark.model
def test_many_inputs_take_several_decodes_in_order(embedder: Embedder, vectors: list[list[float]]) -> None:
    tokens = [embedder.tokenize(t) for t in TEXTS] * 30  # 180 inputs, over 512 tokens: 3 decodes
    batches = list(embedder.stream(tokens))
    assert len(batches) > 1
    out = [v for batch in batches for v in batch]
    alone = [vectors[i % len(TEXTS)] for i in range(len(out))]
    worst = max(abs(x - y) for v, w in zip(out, alone, strict=True) for x, y in zip(v, w, strict=True))
    assert worst <= BATCH_TOLERANCE
    assert min(cosine(v, w) for v, w in zip(out, alone, strict=True)) >= BATCH_COSINE


@pytest.mark.model
def test_too_long_names_the_input_unless_truncated(embedder: Embedder) -> None:
    short, long = embedder.tokenize("Hello."), embedder.tokenize("word " * 600)
    with pytest.raises(InputTooLong) as raised:
        embedder.embed([short, long])
    assert (raised.value.index, raised.value.n_tokens, raised.value.limit) == (1, len(long), 512)
    assert "input 1 is" in str(raised.value)
    cut = embedder.embed([long], truncate=True)[0]
    assert cut == embedder.embed([long[:512]])[0]
    with pytest.raises(EmptyInput):
        embedder.embed([short, []])


# -- the command -----------------------------------------------------------------------------


def test_runner_embed_prints_the_same_vector(smollm2_path: Path, vectors: list[list[float]]) -> None:
    done = run_cli("embed", str(smollm2_path), TEXTS[0])
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr == b""
    (line,) = done.stdout.decode().splitlines()
    printed = json.loads(line)
    assert max(abs(x - y) for x, y in zip(printed, vectors[0], strict=True)) <= CLI_TOLERANCE


def test_each_line_jsonl_keeps_order_and_marks_bad_lines(
    smollm2_path: Path, vectors: list[list[float]]
) -> None:
    lines = [TEXTS[0].encode(), b"", TEXTS[2].encode(), b"\xff\xfe", TEXTS[4].encode()]
    done = run_cli("embed", str(smollm2_path), "--each-line", "--jsonl", input=b"\n".join(lines) + b"\n")
    assert done.returncode == 2  # some lines were bad input; the others are answered
    records = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [r["id"] for r in records] == [1, 2, 3, 4, 5]
    assert records[1] == {"id": 2, "error": "line 2 is empty"}
    assert records[3]["error"].startswith("line 4 is not UTF-8")
    for record, i in ((records[0], 0), (records[2], 2), (records[4], 4)):
        assert max(abs(x - y) for x, y in zip(record["embedding"], vectors[i], strict=True)) <= CLI_TOLERANCE
        assert record["usage"]["prompt_tokens"] > 0


def test_each_line_plain_keeps_an_empty_line_for_a_bad_one(smollm2_path: Path) -> None:
    done = run_cli("embed", str(smollm2_path), "--each-line", input=b"One.\n\nTwo.\n")
    assert done.returncode == 2
    out = done.stdout.decode().split("\n")
    assert len(json.loads(out[0])) == 576 and out[1] == "" and len(json.loads(out[2])) == 576
    assert "line 2 is empty" in done.stderr.decode()


def test_a_text_too_long_is_refused_unless_truncated(smollm2_path: Path) -> None:
    long = "word " * 600
    refused = run_cli("embed", str(smollm2_path), long)
    assert refused.returncode == 2 and refused.stdout == b""
    (message,) = refused.stderr.decode().splitlines()
    assert "tokens, more than the 512" in message and "--truncate" in message
    cut = run_cli("embed", str(smollm2_path), "--truncate", long)
    assert cut.returncode == 0 and len(json.loads(cut.stdout)) == 576


@pytest.mark.parametrize(
    ("args", "stdin", "said"),
    [
        ((), b"   \n", "the text is empty"),
        ((), b"\xff", "stdin is not UTF-8"),
        (("--each-line", "x"), b"a\n", "leave TEXT out"),
        (("--each-line",), b"", "the input is empty"),
        (("--ctx", "0", "x"), b"", "--ctx"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    smollm2_path: Path, args: tuple[str, ...], stdin: bytes, said: str
) -> None:
    done = run_cli("embed", str(smollm2_path), *args, input=stdin)
    assert done.returncode == 2, done.stderr.decode()
    assert done.stdout == b""
    (line,) = done.stderr.decode().splitlines()
    assert said in line


@pytest.mark.model
def test_the_plan_counts_an_embedding_context_as_llama_cpp_allocates_it(smollm2_path: Path) -> None:
    """runner serve prices a model with its embedding context (commands/serve._needs): within 5% of
    the buffers llama.cpp logs as it creates one."""
    import re

    from runner.engine.embed import MAX_SEQS
    from runner.engine.llamacpp import LLAMA_LOG
    from runner.gguf import read_header
    from runner.memory.estimate import embedding_context_bytes

    lines: list[str] = []
    listener = lambda _level, text: lines.append(text)  # noqa: E731
    with Engine(smollm2_path, n_ctx=1024, n_threads=2) as engine:
        LLAMA_LOG.listeners.append(listener)
        try:
            made = Embedder(engine)
        finally:
            LLAMA_LOG.listeners.remove(listener)
        n_ctx, n_seq = made.n_ctx, made.n_seq
        made.close()
    logged = re.findall(r"(?:output|KV|compute) buffer size = +([0-9.]+) MiB", "".join(lines))
    assert len(logged) == 3, lines
    real = sum(float(mib) for mib in logged) * (1 << 20)
    planned = embedding_context_bytes(read_header(smollm2_path), n_ctx=n_ctx, n_seq=n_seq)
    assert n_seq == MAX_SEQS
    assert abs(planned - real) <= 0.05 * real, (planned, real)
