"""--reasoning-budget in the engine: past N tokens of thinking, its end is forced in the model's own
format (a short note the model reads, then </think>, or gpt-oss's final channel), and the answer
follows. SmolLM2 thinks for ever in a template that opens a <think> block: without a budget the whole
answer is thinking; with one, an answer comes."""

from __future__ import annotations

import pytest

from runner.engine.engine import Engine
from runner.engine.request import Prompt, Request
from runner.engine.text.reasoning import BUDGET_NOTE, THINK_CLOSE, closing
from runner.engine.text.sampling import SamplingConfig

pytestmark = pytest.mark.model

GREEDY = SamplingConfig(temperature=0)
OPENED = "<|im_start|>user\nWhat is 2 + 2? Think step by step.<|im_end|>\n<|im_start|>assistant\n<think>\n"


def thinking(engine: Engine, budget: int | None) -> Request:
    prompt = Prompt(engine.model.tokenize(OPENED), OPENED, reasoning_style="think", opens_reasoning=True)
    return Request(prompt, GREEDY, max_tokens=80, reasoning_budget=budget)


def test_a_spent_budget_closes_the_thinking_and_an_answer_follows(engine: Engine) -> None:
    unbounded = engine.answer(thinking(engine, None))
    assert unbounded.text == "" and unbounded.timings.reasoning_tokens == 80  # it never stops thinking
    bounded = engine.answer(thinking(engine, 12))
    assert bounded.reasoning.endswith(BUDGET_NOTE.rstrip("\n")) or BUDGET_NOTE.strip() in bounded.reasoning
    assert bounded.text.strip(), bounded  # the answer came
    assert THINK_CLOSE not in bounded.text and THINK_CLOSE not in bounded.reasoning
    note = len(engine.model.tokenize(BUDGET_NOTE, add_special=False))
    assert 12 <= bounded.timings.reasoning_tokens <= 12 + note + 2  # its own, then the forced note
    assert bounded.reasoning.startswith(unbounded.reasoning[: len(bounded.reasoning) // 3])  # same start
    none = engine.answer(thinking(engine, 0))  # no thinking at all: the end comes first
    assert none.text.strip() and none.reasoning.strip() == BUDGET_NOTE.strip()


def test_each_style_is_closed_its_own_way() -> None:
    assert closing("think", "") == f"{THINK_CLOSE}\n\n"
    assert closing("channels", "") == "<|end|><|start|>assistant<|channel|>final<|message|>"
    assert closing(None) is None
