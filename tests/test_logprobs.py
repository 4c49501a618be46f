"""Token log-probabilities and answer quality with the real model: an answer's logprobs against the
same tokens scored as a prompt (two paths through llama.cpp: decode steps, and one evaluation with
logits at every position), a schema's mask in them, `echo` on /v1/completions and logprobs on chat
through the real `openai` and `ollama` clients, `runner run --json --logprobs`; and `runner bench
--quality`: perplexity against the same positions scored one by one, a model's KL-divergence from
itself, the reference kept and read back, and its bad input. The figures against llama.cpp's own
tools (llama-server's logprobs, llama-perplexity) are scripts/bench_quality.py's (docs/quality.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import ollama
import pytest

from runner.engine.logprobs import FLOOR, score_prompt
from runner.engine.quality import score_text
from runner.engine.text.sampling import SamplingConfig
from runner.settings import LoadSettings
from tests.conftest import run_cli
from tests.serving import MODEL, Server, model_server, openai_client

GREEDY = SamplingConfig(temperature=0)
DEFAULT_TEXT = Path(__file__).resolve().parent.parent / "runner" / "data" / "quality.txt"


@pytest.mark.model
def test_an_answers_logprobs_are_its_tokens_scored_as_a_prompt(engine) -> None:
    """Each sampled token's log-probability (read in the decode step that chose it) equals that token
    scored in prompt + answer evaluated whole; greedy, it is the first of its alternatives, which are
    ranked best first."""
    prompt = engine.model.tokenize("The capital of France is")
    result = engine.generate(prompt, GREEDY, max_tokens=8, logprobs=5)
    assert len(result.logprobs) == result.timings.completion_tokens == 8
    answer = [s.token for s in result.logprobs]
    assert b"".join(engine.model.token_bytes(t) for t in answer).decode() == result.text
    scored = score_prompt(engine.context, prompt + answer, 0, 5)
    for sampled, again in zip(result.logprobs, scored[len(prompt) - 1 :], strict=True):
        assert sampled.token == again.token
        assert abs(sampled.logprob - again.logprob) < 1e-3
        assert [t for t, _ in sampled.top] == [t for t, _ in again.top]
        assert sampled.top[0] == (sampled.token, sampled.logprob)
        values = [lp for _, lp in sampled.top]
        assert values == sorted(values, reverse=True) and all(lp <= 0 for lp in values)
        assert math.fsum(math.exp(lp) for lp in values) <= 1 + 1e-6


@pytest.mark.model
def test_a_schemas_mask_is_in_the_logprobs(engine) -> None:
    """With a schema, the refused tokens have no probability and are no alternatives: of 20 asked,
    only tokens the enum can start with are listed (fewer than 20), never one at -3.4e38, and they
    share the whole mass between them."""
    from runner.engine.text.constrain import schema_guide_of

    guide = schema_guide_of(json.dumps({"enum": ["yes", "no"]}))
    prompt = engine.model.tokenize("Is the sky blue? Answer yes or no:")
    result = engine.generate(prompt, GREEDY, max_tokens=4, guide=guide, logprobs=20)
    assert result.text in ('"yes"', '"no"')
    first = result.logprobs[0]
    assert 0 < len(first.top) < 20 and all(lp > FLOOR for _, lp in first.top)
    assert all('"yes"'.startswith(engine.model.token_bytes(t).decode()) or '"no"'.startswith(
        engine.model.token_bytes(t).decode()) for t, _ in first.top)  # fmt: skip
    assert abs(math.fsum(math.exp(lp) for _, lp in first.top) - 1) < 1e-6
    assert all(lp > FLOOR for scored in result.logprobs for _, lp in scored.top)


@pytest.mark.fast
def test_a_masked_token_is_no_alternative() -> None:
    """A row as a schema's mask leaves it (-inf where refused): the alternatives are the tokens left,
    best first, however many were asked for; an unmasked row lists as many as asked."""
    import numpy as np

    from runner.engine.logprobs import read

    row = np.array([2.0, -np.inf, 1.0, -np.inf, 0.5], dtype=np.float32)
    scored = read(row, 0, 4)
    assert [t for t, _ in scored.top] == [0, 2, 4]
    assert abs(math.fsum(math.exp(lp) for _, lp in scored.top) - 1) < 1e-6
    assert [t for t, _ in read(np.array([2.0, 0.0, 1.0, -1.0, 0.5], dtype=np.float32), 0, 4).top] == [
        0,
        2,
        4,
        1,
    ]


@pytest.mark.fast
def test_a_reasonings_tokens_and_markers_are_not_the_answers() -> None:
    """Only the answer's tokens are listed, each with the answer text it made: not the reasoning's,
    not </think>, not the blank lines after it; a stop string's tokens are dropped."""
    from runner.engine.logprobs import TokenLogprob
    from runner.engine.sequence import Job, Slot

    pieces = {1: "<think>", 2: "hmm", 3: "</think>", 4: "\n\n", 5: "Hi", 6: " there", 7: "!", 8: "END"}

    class Vocab:
        def is_end(self, token: int) -> bool:
            return False

        def token_bytes(self, token: int, *, special: bool = False) -> bytes:
            return pieces[token].encode()

    sent: list[list[int]] = []
    job = Job(0, [0], GREEDY, stop=("END",), reasoning="think", logprobs=0)
    job.on_logprobs = lambda entries: sent.append([e.token for e in entries])
    slot = Slot(0, job, None, None, 0.0)
    for token in pieces:
        slot.scored = TokenLogprob(token, -0.5)
        if slot.take(token, Vocab(), room=100) is not None:
            break
    result = slot.result("stop", flush=True, extra={})
    assert (result.reasoning, result.text) == ("hmm", "Hi there!")
    assert [e.token for e in result.logprobs] == [5, 6, 7]
    assert sent == [[5], [6], [7]]


# -- the server, with its real clients ------------------------------------------------------------


@pytest.fixture(scope="module")
def server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with model_server(tmp_path_factory.mktemp("serve"), "--parallel", "2", "--ctx", "1024") as running:
        yield running


def test_the_start_up_line_says_each_sequences_context(server: Server) -> None:
    """--ctx is a sequence's context everywhere: the start-up line says so, the total beside it."""
    assert "ctx 1024 a sequence (2048 in all)" in server.stderr() and "2 sequences at once" in server.stderr()


@pytest.mark.fast
def test_counts_are_said_in_the_singular_for_one() -> None:
    from runner import ui

    assert [ui.count(n, "thread") for n in (0, 1, 2, 1024)] == [
        "0 threads",
        "1 thread",
        "2 threads",
        "1,024 threads",
    ]
    assert ui.count(1, "request") == "1 request" and ui.count(3, "entry", "entries") == "3 entries"


def test_chat_logprobs_whole_and_streamed_through_openai(server: Server) -> None:
    client = openai_client(server)
    messages = [{"role": "user", "content": "Name three colors."}]
    kwargs = {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 12}
    whole = client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=3)
    content = whole.choices[0].logprobs.content
    assert "".join(t.token for t in content) == whole.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == t.logprob for t in content)
    assert all(bytes(t.bytes).decode() == t.token for t in content)
    streamed = []
    for chunk in client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=3, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [
        (t.token, round(t.logprob, 4)) for t in content
    ]
    plain = client.chat.completions.create(**kwargs)
    assert (
        plain.choices[0].logprobs is None
        and plain.choices[0].message.content == whole.choices[0].message.content
    )
    only = client.chat.completions.create(**kwargs, logprobs=True)
    assert all(t.top_logprobs == [] for t in only.choices[0].logprobs.content)


def test_completions_echo_scores_the_prompt_through_openai(server: Server) -> None:
    """echo + logprobs: the prompt's tokens first, the first with none (nothing predicted it), one value
    for every other; max_tokens 0 scores the prompt alone (what evaluation harnesses ask); the
    prompt's scores equal the answer's own for the same text."""
    client = openai_client(server)
    prompt = "The capital of France is"
    alone = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=1, max_tokens=0)
    lp = alone.choices[0].logprobs
    assert alone.choices[0].text == prompt and "".join(lp.tokens) == prompt
    assert lp.token_logprobs[0] is None and all(v < 0 for v in lp.token_logprobs[1:])
    assert lp.top_logprobs[0] is None and all(len(top) == 1 for top in lp.top_logprobs[1:])
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    answer = client.completions.create(model=MODEL, prompt=prompt, logprobs=2, max_tokens=3, temperature=0)
    text = answer.choices[0].text
    both = client.completions.create(model=MODEL, prompt=prompt + text, echo=True, logprobs=0, max_tokens=0)
    tail = both.choices[0].logprobs.token_logprobs[-3:]
    for got, again in zip(answer.choices[0].logprobs.token_logprobs, tail, strict=True):
        assert abs(got - again) < 1e-3
    echoed = client.completions.create(
        model=MODEL, prompt=prompt, echo=True, logprobs=1, max_tokens=3, temperature=0
    )
    assert echoed.choices[0].text == prompt + text
    assert len(echoed.choices[0].logprobs.tokens) == len(lp.tokens) + 3


def test_ollama_logprobs_through_its_client(server: Server) -> None:
    client = ollama.Client(host=server.url)
    options = {"temperature": 0, "num_predict": 6}
    whole = client.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        options=options,
        logprobs=True,
        top_logprobs=2,
    )
    assert "".join(t.token for t in whole.logprobs) == whole.message.content
    assert all(len(t.top_logprobs) == 2 for t in whole.logprobs)
    streamed = []
    for part in client.generate(model=MODEL, prompt="Hi", options=options, logprobs=True, stream=True):
        streamed += part.logprobs or []
    again = client.generate(model=MODEL, prompt="Hi", options=options, logprobs=True)
    assert [t.token for t in streamed] == [t.token for t in again.logprobs]
    assert client.generate(model=MODEL, prompt="Hi", options=options).logprobs is None


def test_run_json_logprobs(smollm2_path: Path) -> None:
    done = run_cli(
        "run", str(smollm2_path), "Hi", "--max-tokens", "4", "--temperature", "0", "--json", "--logprobs", "2"
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert "".join(t["token"] for t in data["logprobs"]) == data["text"]
    assert all(len(t["top_logprobs"]) == 2 for t in data["logprobs"])
    for args, says in [
        (("--logprobs", "2"), "goes with --json"),
        (("--json", "--logprobs", "21"), "between 0 and 20"),
    ]:
        bad = run_cli("run", str(smollm2_path), "Hi", *args)
        assert bad.returncode == 2 and says in bad.stderr.decode() and bad.stdout == b""


# -- perplexity and KL-divergence ------------------------------------------------------------------


@pytest.mark.model
def test_perplexity_is_the_second_halves_scored(engine) -> None:
    """score_text's perplexity and its error are llama-perplexity's formulas over each chunk's second
    half, here computed apart from the same logits (each chunk one decode, every row asked: the rows
    are the same whichever are asked); against itself the KL-divergence is 0 and every top token the
    same."""
    import numpy as np

    from runner.engine.logprobs import rows

    tokens = engine.model.tokenize(DEFAULT_TEXT.read_text())[: 3 * 128 + 50]
    quality, kept = score_text(engine.context, tokens, 128, keep=True)
    assert (quality.chunks, quality.scored) == (3, 3 * 63)
    nll = []
    for c in range(3):
        chunk = tokens[c * 128 : (c + 1) * 128]
        engine.context.forget(0)
        engine.context.extend(chunk, 0, all_logits=True)
        logits = rows(engine.context.ctx, 128, engine.model.n_vocab).astype(np.float64)
        for i in range(64, 127):  # row i predicts token i + 1
            row = logits[i] - logits[i].max()
            nll.append(math.log(np.exp(row).sum()) - row[chunk[i + 1]])
    mean = math.fsum(nll) / len(nll)
    assert quality.perplexity == pytest.approx(math.exp(mean), rel=1e-9)
    spread = math.sqrt((math.fsum(v * v for v in nll) / len(nll) - mean * mean) / (len(nll) - 1))
    assert quality.perplexity_error == pytest.approx(spread * math.exp(mean), rel=1e-6)
    assert kept is not None
    again, _ = score_text(engine.context, tokens, 128, reference=kept)
    assert again.kld_mean is not None and 0 <= again.kld_mean < 1e-6 and again.same_top == 1.0
    assert again.reference_perplexity == pytest.approx(quality.perplexity)


def test_bench_quality_with_a_reference_kept_and_read_back(smollm2_path: Path, tmp_path: Path) -> None:
    text = tmp_path / "text.txt"  # its own words, so no earlier run's reference is kept for it
    text.write_text(f"{tmp_path.name}.\n\n" + DEFAULT_TEXT.read_text()[:3000])
    args = ("bench", str(smollm2_path), "--quality", str(text), "--ctx", "128", "--json")
    first = run_cli(*args, "--reference", str(smollm2_path))
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)
    assert data["perplexity"] > 1 and data["scored"] == data["chunks"] * 63
    assert 0 <= data["kld_mean"] < 1e-6 and data["same_top"] == 1.0  # rounding noise is not below 0
    assert "scored once and kept" in first.stderr.decode()
    second = run_cli(*args, "--reference", str(smollm2_path))
    said = second.stderr.decode()
    assert second.returncode == 0 and "its pass kept in" in said
    Path(said.split("its pass kept in ")[1].split()[0]).unlink()
    assert json.loads(second.stdout)["perplexity"] == pytest.approx(data["perplexity"], rel=1e-6)
    table = run_cli("bench", str(smollm2_path), "--ctx", "128", "--quality", str(text))
    assert table.returncode == 0 and table.stdout.decode().startswith("text")
    assert "perplexity" in table.stdout.decode()


@pytest.mark.fast
def test_a_kl_divergence_of_rounding_noise_is_0() -> None:
    """A model against itself sums -7e-9 (its reference kept as float32): never printed below 0."""
    import numpy as np

    from runner.engine.quality import Reference, _quality, _Scores

    nll = np.array([1.0, 2.0, 3.0])
    scores = _Scores(nll=nll, kld=np.array([-7e-9, -1e-9, -2e-9]), same=np.array([True, True, True]))
    reference = Reference("tokens", 128, None, None, nll)
    quality = _quality(scores, 300, 2, 128, 0.0, reference)
    assert quality.kld_mean == 0.0 and quality.kld_p99 == 0.0
    assert quality.as_dict()["kld_mean"] == 0.0 and quality.same_top == 1.0
    scores.kld = np.array([0.5, 0.25, 0.0])  # a real divergence stays as it is
    assert _quality(scores, 300, 2, 128, 0.0, reference).kld_mean == pytest.approx(0.25)


@pytest.mark.fast
def test_vocabularies_are_compared_from_the_headers() -> None:
    from runner.engine.quality import vocabulary_mismatch
    from runner.gguf import GGUFHeader

    def vocab(tokens: list[str], model: str = "gpt2", pre: str = "smollm") -> GGUFHeader:
        keys = {"tokenizer.ggml.model": model, "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens}
        return GGUFHeader("test", 3, {"general.architecture": "llama", **keys}, (), 32, 4096, 4096)

    ours = vocab(["a", "b", "c"])
    assert vocabulary_mismatch(ours, vocab(["a", "b", "c"])) is None
    assert vocabulary_mismatch(ours, vocab(["a", "x", "c"])) == "token 1 is 'x' in it, 'b' in the model"
    assert vocabulary_mismatch(ours, vocab(["a", "b"])) == "its vocabulary has 2 tokens, the model's 3"
    assert vocabulary_mismatch(ours, vocab(["a", "b", "c"], model="llama")) == (
        "its tokenizer is 'llama', the model's 'gpt2'"
    )
    assert "pre-tokenizer is 'qwen2'" in (
        vocabulary_mismatch(ours, vocab(["a", "b", "c"], pre="qwen2")) or ""
    )


def test_bench_quality_refuses_a_reference_of_another_vocabulary_before_scoring(
    smollm2_path: Path, tmp_path: Path
) -> None:
    from tests.synth import Spec, write_model

    spec = Spec("llama", n_layer=2, n_embd=64, n_head=2, n_head_kv=1, n_ff=128, tokenizer=smollm2_path)
    other = write_model(tmp_path / "other.gguf", replace(spec, token_edits={1000: "zzqq"}))
    done = run_cli("bench", str(smollm2_path), "--quality", "--ctx", "128", "--reference", str(other))
    said = done.stderr.decode()
    assert done.returncode == 2 and done.stdout == b"", said
    assert (
        f"--reference {other} has another vocabulary than {smollm2_path} (token 1000 is 'zzqq' in it" in said
    )
    assert "reference:" not in said and "chunk" not in said  # neither model scored, nor loaded


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--quality", "--ctx", "2048"), "needs at least 4,096"),
        (("--quality", "{missing}"), "no such file"),
        (("--quality", "{empty}"), "the file is empty"),
        (("--quality", "--ctx", "129"), "even context"),
        (("--reference", "x"), "go with --quality"),
        (("--ctx", "512"), "go with --quality"),
    ],
)
def test_bench_quality_bad_input(
    smollm2_path: Path, tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    (tmp_path / "empty.txt").write_text("  \n")
    named = {"{missing}": str(tmp_path / "nope.txt"), "{empty}": str(tmp_path / "empty.txt")}
    done = run_cli("bench", str(smollm2_path), *[named.get(a, a) for a in args])
    assert done.returncode == 2 and says in done.stderr.decode(), done.stderr
    assert b"Traceback" not in done.stderr and done.stdout == b""


@pytest.mark.model
def test_the_plan_counts_the_rows_of_logits_a_decode_asks_for(smollm2_path: Path) -> None:
    """A scored prompt (echo: ROWS rows a decode) and --quality (ctx/2) grow llama.cpp's output buffer
    past its row per sequence: the plan counts it that large, in the estimate and the host's RSS."""
    from runner.engine.logprobs import ROWS
    from runner.gguf import read_header
    from runner.loader import plan_for

    header = read_header(smollm2_path)
    n_vocab = 49152
    plain = plan_for(header, "smollm2", LoadSettings(ctx=512))
    scored = plan_for(header, "smollm2", LoadSettings(ctx=512, output_rows=256))
    served = plan_for(header, "smollm2", LoadSettings(ctx=1024, parallel=4, output_rows=ROWS))
    assert plain.estimate.output_bytes == n_vocab * 4
    assert scored.estimate.output_bytes == n_vocab * 256 * 4
    assert scored.estimate.host_rss_bytes - plain.estimate.host_rss_bytes == n_vocab * 255 * 4
    assert served.estimate.output_bytes == n_vocab * ROWS * 4
