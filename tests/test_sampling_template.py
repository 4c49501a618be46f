"""Sampling settings and chat templates: pure functions, exact results."""

from __future__ import annotations

import pytest

from runner.engine.text.sampling import SamplingConfig, model_defaults, resolve
from runner.engine.text.template import build_messages, render
from runner.errors import InvalidModelFile, InvalidSetting

pytestmark = pytest.mark.fast

SMOL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_llama_cpp_defaults() -> None:
    cfg = SamplingConfig()
    assert (cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p, cfg.repeat_penalty) == (
        0.8,
        40,
        0.95,
        0.05,
        1.0,
    )
    assert (cfg.presence_penalty, cfg.frequency_penalty, cfg.seed) == (0.0, 0.0, None)
    assert not cfg.greedy and not cfg.penalties


def test_gguf_keys_override_defaults_and_flags_override_both() -> None:
    metadata = {"general.sampling.temp": 0.6, "general.sampling.top_k": 20, "general.sampling.top_p": 0.9}
    assert resolve(metadata, {}) == SamplingConfig(temperature=0.6, top_k=20, top_p=0.9)
    assert resolve(metadata, {"top_k": 5, "temperature": None}) == SamplingConfig(
        temperature=0.6, top_k=5, top_p=0.9
    )


def test_bad_gguf_sampling_values_are_ignored() -> None:
    metadata = {"general.sampling.temp": "hot", "general.sampling.top_p": 7.0, "general.sampling.top_k": True}
    assert model_defaults(metadata) == {}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "--temperature must be between 0 and 2 (got -0.1)"),
        ({"temperature": float("inf")}, "--temperature must be a finite number (got inf)"),
        ({"top_p": 1.5}, "--top-p must be in (0, 1] (got 1.5)"),
        ({"repeat_last_n": -2}, "--repeat-last-n must be at least 0 (got -2)"),
    ],
)
def test_ranges(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidSetting) as err:
        SamplingConfig(**kwargs)
    assert str(err.value) == message


def test_penalties_only_when_asked() -> None:
    assert SamplingConfig(repeat_penalty=1.1).penalties
    assert SamplingConfig(presence_penalty=0.5).penalties
    assert not SamplingConfig(repeat_penalty=1.1, repeat_last_n=0).penalties


def test_smollm2_template_with_and_without_system() -> None:
    assert render(SMOL, build_messages("Hi")) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(SMOL, build_messages("Hi", "Be brief.")) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # CVE-2024-34359's way out of the sandbox
        "{{ messages.append(1) }}",  # templates may not mutate their input
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    ],
)
def test_templates_render_only_in_the_sandbox(template: str) -> None:
    with pytest.raises(InvalidModelFile, match="unsafe"):
        render(template, build_messages("Hi"))


def test_template_errors_are_the_model_files_fault() -> None:
    with pytest.raises(InvalidModelFile, match="failed to render: roles must alternate"):
        render("{{ raise_exception('roles must alternate') }}", build_messages("Hi"))
    with pytest.raises(InvalidModelFile, match="failed to render"):
        render("{% for %}", build_messages("Hi"))


def test_a_template_compiled_ahead_renders_the_same_and_fails_the_same() -> None:
    """compile_ahead (beside the model load) only fills the compile cache: the render that follows
    gives the same text, and a template that does not compile still fails at the render."""
    from runner.engine.text import template

    source = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<ahead>"
    template.compile_ahead(source)
    template.compile_ahead(source)  # a second call while the first runs starts nothing
    assert list(template._AHEAD) == [source]
    ahead = template._AHEAD[source]
    assert render(source, build_messages("Hi", "Be brief.")) == "<system>Be brief.<user>Hi<ahead>"
    assert not template._AHEAD and not ahead.is_alive()  # the render waited for it, then took its work
    assert template._compiled.cache_info().currsize >= 1

    broken = "{% for %}<ahead>"
    template.compile_ahead(broken)
    with pytest.raises(InvalidModelFile, match="failed to render"):
        render(broken, build_messages("Hi"))
    template.compile_ahead(None)  # no template in the file: nothing to do
    template.compile_ahead("  ")
    assert not template._AHEAD
