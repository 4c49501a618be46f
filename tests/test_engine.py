"""The generation loop on the real model: determinism, limits, stop strings, UTF-8, the KV cache."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from runner.engine.answer import FINISH_LENGTH, FINISH_STOP, TextAssembler
from runner.engine.engine import Engine
from runner.engine.llamacpp import Placement
from runner.engine.request import bare
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.template import build_messages, render
from runner.errors import PromptTooLong

GREEDY = SamplingConfig(temperature=0)


def chat(engine: Engine, text: str) -> list[int]:
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n"
    )
    return engine.model.tokenize(render(template, build_messages(text)))


@pytest.mark.model
def test_fixed_seed_is_deterministic_and_seeds_differ(engine: Engine) -> None:
    prompt = chat(engine, "Write a short poem about the sea.")
    runs = [engine.generate(prompt, SamplingConfig(seed=seed), max_tokens=40).text for seed in (7, 7, 8)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert len(runs[0]) > 20


@pytest.mark.model
def test_max_tokens_counts_tokens_and_reports_length(engine: Engine) -> None:
    result = engine.generate(chat(engine, "Count from one to a hundred in words."), GREEDY, max_tokens=12)
    assert result.finish_reason == FINISH_LENGTH
    assert result.timings.completion_tokens == 12
    assert not result.context_full


@pytest.mark.model
def test_end_of_generation_token_finishes_with_stop(engine: Engine) -> None:
    result = engine.generate(chat(engine, "Say only the word yes."), GREEDY, max_tokens=50)
    assert result.finish_reason == FINISH_STOP
    assert result.timings.completion_tokens < 50
    assert "<|im_end|>" not in result.text


@pytest.mark.model
def test_stop_string_cuts_before_it_even_across_tokens(engine: Engine) -> None:
    prompt = chat(engine, "Why is the sky blue? Explain in two sentences.")
    full = engine.generate(prompt, GREEDY, max_tokens=60).text
    # a stop string made of the end of one word and the start of the next spans a token boundary
    words = full.split(" ")
    stop = words[4][-2:] + " " + words[5][:2]
    assert stop in full
    cut = engine.generate(prompt, GREEDY, max_tokens=60, stop=[stop, "never-appears"])
    assert cut.finish_reason == FINISH_STOP
    assert cut.text == full[: full.index(stop)]


@pytest.mark.model
def test_streamed_pieces_join_to_the_full_text(engine: Engine) -> None:
    prompt = chat(engine, "Name three colours.")
    pieces = [c.text for c in engine.stream(bare(prompt, GREEDY, max_tokens=30))]
    assert len([p for p in pieces if p]) > 5  # really streamed, not one blob at the end
    assert "".join(pieces) == engine.generate(prompt, GREEDY, max_tokens=30).text


@pytest.mark.model
def test_utf8_split_across_tokens_is_neither_broken_nor_dropped(engine: Engine) -> None:
    prompt = engine.model.tokenize(
        "<|im_start|>user\nRepeat exactly: こんにちは 😀 café<|im_end|>\n<|im_start|>assistant\n"
    )
    tokens = list(itertools.islice(engine.generate_step(prompt, GREEDY), 12))
    pieces = [engine.model.token_bytes(t) for t in tokens]
    split = [p for p in pieces if _invalid_alone(p)]
    assert split, "the test needs tokens that each carry part of a character"
    whole = b"".join(pieces)
    complete = whole[: len(whole) - _incomplete_tail(whole)].decode("utf-8")
    text = TextAssembler(stop=())
    out = "".join(text.push(p)[0] for p in pieces) + text.flush()
    assert out == complete
    assert "\ufffd" not in out
    assert "こんにちは" in out


def _invalid_alone(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _incomplete_tail(data: bytes) -> int:
    for n in range(1, 4):
        try:
            data[: len(data) - n].decode("utf-8")
            return n if _invalid_alone(data) else 0
        except UnicodeDecodeError:
            continue
    return 0


@pytest.mark.fast
@pytest.mark.parametrize(
    ("pieces", "stop", "expected_out", "stopped"),
    [
        ([b"Hel", b"lo wor", b"ld"], ["wor"], "Hello ", True),
        ([b"a", b"b", b"c"], ["bd"], "abc", False),  # 'b' held back, then released
        ([b"\xe2\x82", b"\xac and"], [], "\u20ac and", False),  # euro sign split in two
        ([b"x", b"ST", b"OP y"], ["STOP"], "x", True),
    ],
)
def test_text_assembler_hand_picked(
    pieces: list[bytes], stop: list[str], expected_out: str, stopped: bool
) -> None:
    text = TextAssembler(stop=stop)
    out = ""
    hit = False
    for piece in pieces:
        part, hit = text.push(piece)
        out += part
        if hit:
            break
    if not hit:
        out += text.flush()
    assert (out, hit) == (expected_out, stopped)


@pytest.mark.fast
def test_held_back_text_is_released_before_it_could_match() -> None:
    text = TextAssembler(stop=["</answer>"])
    assert text.push(b"42 <") == ("42 ", False)
    assert text.push(b"/ans") == ("", False)
    assert text.push(b"wer!") == ("</answer!", False)  # cannot be the stop string any more


@pytest.mark.model
def test_kv_cache_reuse_gives_the_same_answer(engine: Engine) -> None:
    prompt = chat(engine, "What is the capital of Italy?")
    first = engine.generate(prompt, GREEDY, max_tokens=20)
    again = engine.generate(prompt, GREEDY, max_tokens=20)
    assert again.text == first.text
    assert again.timings.prefill_tokens == 1  # all but the last prompt token came from the cache
    longer = chat(engine, "What is the capital of Italy? And of France?")
    other = engine.generate(longer, GREEDY, max_tokens=20)
    assert other.timings.prefill_tokens < len(longer)


@pytest.mark.model
def test_prompt_longer_than_the_context_is_refused_with_a_size_that_fits(engine: Engine) -> None:
    long_prompt = engine.model.tokenize("word " * 3000)
    with pytest.raises(PromptTooLong) as err:
        engine.generate(long_prompt, GREEDY, max_tokens=5)
    message = str(err.value)
    assert f"{len(long_prompt):,} tokens" in message
    assert "--ctx 3328" in message  # 3000+ tokens, plus room to answer, rounded up to 256


@pytest.mark.model
def test_context_full_stops_with_length(smollm2_path) -> None:
    with Engine(smollm2_path, n_ctx=64, n_threads=2) as small:
        prompt = small.model.tokenize("1, 2, 3, 4, 5, 6, 7, 8,")  # raw text a model continues for ever
        result = small.generate(prompt, GREEDY)
    assert result.finish_reason == FINISH_LENGTH
    assert result.context_full
    assert len(prompt) + result.timings.completion_tokens == small.context.n_ctx  # llama.cpp rounds 64 up


@pytest.mark.model
def test_loading_with_no_gpu_device_runs_on_the_cpu(smollm2_path) -> None:
    with Engine(smollm2_path, n_ctx=256, n_threads=2, placement=Placement(use_gpu=False)) as cpu:
        assert cpu.model.n_gpu_layers == 0
        result = cpu.generate(cpu.model.tokenize("1, 2, 3,"), GREEDY, max_tokens=4)
    assert result.text.strip().startswith("4")


@pytest.mark.model
def test_a_context_grows_as_it_fills_and_answers_do_not_change(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-sequence context starts at START_CTX and grows (the KV cache's state moved over) up to
    n_ctx: the same greedy answer as a context allocated whole, across two growths."""
    from runner.engine import context as context_module

    words = " ".join(f"item{i}" for i in range(75))
    texts = {}
    for start in (256, 1 << 20):
        monkeypatch.setattr(context_module, "START_CTX", start)
        with Engine(smollm2_path, n_ctx=4096, n_threads=2) as engine:
            prompt = engine.model.tokenize(f"List: {words}\nContinue the list:")
            assert 200 < len(prompt) < 256 and engine.context.n_ctx == 4096
            assert engine.context._allocated == min(start, 4096)
            result = engine.generate(prompt, SamplingConfig(temperature=0), max_tokens=300)
            assert len(prompt) + result.timings.completion_tokens > 512  # past two growths
            texts[start] = result.text
            assert engine.context._allocated == (1024 if start == 256 else 4096)
    assert texts[256] == texts[1 << 20]


@pytest.mark.model
def test_a_load_runs_with_the_log_muted_and_a_failed_one_still_says_why(
    smollm2_path: Path, tmp_path: Path
) -> None:
    """A load's ~1,200 log lines go to a C no-op (no GIL taken per line, so the template compiles
    beside it); a load that fails is asked again with the log heard, for llama.cpp's reason."""
    import synth

    from runner.engine.llamacpp import LLAMA_LOG, llama
    from runner.errors import InvalidModelFile

    lib = llama()
    params = lib.llama_model_default_params()
    params.vocab_only = True
    LLAMA_LOG.recent.clear()
    with LLAMA_LOG.muted() as muted:
        assert muted  # nothing echoes (--debug) or listens here
        model = lib.llama_model_load_from_file(str(smollm2_path).encode(), params)
    lib.llama_model_free(model)
    assert not LLAMA_LOG.recent  # nothing reached Python
    model = lib.llama_model_load_from_file(str(smollm2_path).encode(), params)
    lib.llama_model_free(model)
    assert LLAMA_LOG.recent  # and the log is runner's again
    LLAMA_LOG.listeners.append(lambda *_: None)
    try:
        with LLAMA_LOG.muted() as muted:
            assert not muted  # a listener hears every line, as --debug does
    finally:
        LLAMA_LOG.listeners.pop()

    odd = synth.write_unknown_arch(tmp_path / "odd.gguf")
    with pytest.raises(InvalidModelFile, match="unknown model architecture: 'foobar'"):
        Engine(odd)
