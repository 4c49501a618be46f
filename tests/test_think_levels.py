"""--think LEVEL: a template's own switch where it has one (Qwen3's enable_thinking, gpt-oss's
reasoning_effort), else a reasoning budget (runner.engine.text.reasoning.think_settings)."""

from __future__ import annotations

import pytest

from runner.engine.text.reasoning import think_settings

pytestmark = pytest.mark.fast


QWEN3_LIKE = "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
GPT_OSS_LIKE = (
    "{% if reasoning_effort is defined %}Reasoning: {{ reasoning_effort }}{% endif %}<|channel|><|message|>"
)


def test_a_think_level_uses_the_templates_own_switch_else_a_budget() -> None:
    assert think_settings(None, QWEN3_LIKE) == ({}, None)
    assert think_settings(False, QWEN3_LIKE) == ({"enable_thinking": False}, None)  # --no-think as before
    assert think_settings("off", QWEN3_LIKE) == ({"enable_thinking": False}, None)
    assert think_settings("low", QWEN3_LIKE) == ({"enable_thinking": True}, 256)  # on, bounded
    assert think_settings("high", QWEN3_LIKE) == ({"enable_thinking": True}, None)
    assert think_settings("medium", GPT_OSS_LIKE) == ({"reasoning_effort": "medium"}, None)
    assert think_settings("off", GPT_OSS_LIKE) == ({"reasoning_effort": "low"}, 0)  # it cannot stop: closed
    assert think_settings("low", "<think>") == ({}, 256)  # no switch at all: the budget does it
