"""Property: for random schemas within what runner enforces (hypothesis draws them: integer ranges,
number bounds, string lengths, patterns, formats, enums, consts, nested objects and arrays, anyOf),
every answer SmolLM2 finishes under the schema's mask validates against the schema as given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.engine.answer import FINISH_STOP
from runner.engine.prompt import render_prompt
from runner.engine.text.constrain import constraint
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.template import Message
from runner.gguf import read_header
from tests.helpers import checked

pytestmark = pytest.mark.model

NAMES = ["name", "age", "city", "tags", "id", "score", "kind", "note", "when", "ok"]
WORDS = st.text(alphabet="abcdefghij", min_size=1, max_size=6)


def _integer(low: int, span: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": low, "maximum": low + span}


def _number(low: int, span: int) -> dict[str, Any]:
    return {"type": "number", "exclusiveMinimum": low, "exclusiveMaximum": low + span}


def _object(members: dict[str, Any], required: bool) -> dict[str, Any]:
    schema = {"type": "object", "properties": members, "additionalProperties": False}
    return {**schema, "required": sorted(members)} if required else schema


def _array(items: Any, least: int, more: int) -> dict[str, Any]:
    return {"type": "array", "items": items, "minItems": least, "maxItems": least + more}


LEAVES = st.one_of(
    st.builds(_integer, st.integers(-1000, 1000), st.integers(0, 500)),
    st.builds(_number, st.integers(-100, 100), st.integers(1, 100)),
    st.integers(1, 30).map(lambda n: {"type": "string", "maxLength": n}),
    st.integers(1, 4).map(lambda n: {"type": "string", "minLength": n, "maxLength": n + 12}),
    st.sampled_from(["^[a-z]{1,8}$", "^[A-Z][a-z]{0,6}$", "^[0-9]{3}-[0-9]{4}$"]).map(
        lambda p: {"type": "string", "pattern": p}
    ),
    st.sampled_from(["date", "date-time", "time", "uuid", "email", "ipv4"]).map(
        lambda f: {"type": "string", "format": f}
    ),
    st.lists(WORDS, min_size=1, max_size=4, unique=True).map(lambda v: {"enum": v}),
    st.one_of(WORDS, st.integers(-9, 9)).map(lambda v: {"const": v}),
    st.sampled_from([{"type": "boolean"}, {"type": "null"}]),
)
SCHEMAS = st.builds(  # the answer's own object, its members anything the recursion draws
    _object,
    st.dictionaries(
        st.sampled_from(NAMES),
        st.recursive(
            LEAVES,
            lambda inner: st.one_of(
                st.builds(
                    _object,
                    st.dictionaries(st.sampled_from(NAMES), inner, min_size=1, max_size=3),
                    st.booleans(),
                ),
                st.builds(_array, inner, st.integers(0, 2), st.integers(0, 3)),
                st.lists(inner, min_size=2, max_size=3).map(lambda options: {"anyOf": options}),
            ),
            max_leaves=5,
        ),
        min_size=1,
        max_size=4,
    ),
    st.booleans(),
)


def test_every_finished_answer_to_a_random_schema_validates(engine, smollm2_path: Path) -> None:
    header = read_header(smollm2_path)
    prompt = render_prompt(engine, header, [Message("user", "Fill in this record.")]).tokens
    finished: list[bool] = []

    @settings(
        max_examples=24,
        deadline=None,
        derandomize=True,  # the same 24 schemas on every run: CI is not a lottery
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(schema=SCHEMAS, seed=st.integers(0, 2**31))
    def answers(schema: dict[str, Any], seed: int) -> None:
        rule = constraint(schema=json.dumps(schema))
        assert rule is not None and rule.guide is not None
        sampling = SamplingConfig(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
        result = engine.generate(prompt, sampling, max_tokens=160, guide=rule.guide)
        finished.append(result.finish_reason == FINISH_STOP)
        if result.finish_reason == FINISH_STOP:
            value = json.loads(checked(rule, result.text, result.finish_reason))  # check raises on a mismatch
            jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())

    answers()
    assert sum(finished) >= len(finished) * 3 // 4, finished  # the property held on real answers
