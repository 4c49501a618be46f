"""How a constrained answer is laid out, and `uniqueItems` (Pydantic's `set[...]`): one fixed layout,
json.dumps's (`{"a": 1, "b": [2, 3]}`), for every schema shape, so a small model spends no tokens on
line breaks between a key and its colon; a set of a few fixed values held by the mask, any other set
refused with the way around it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from runner.engine.answer import FINISH_STOP
from runner.engine.prompt import render_prompt
from runner.engine.text.constrain import constraint
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.template import Message
from runner.engine.text.unique import MAX_SET_VALUES, enforce_unique
from runner.errors import InvalidSetting
from runner.gguf import read_header

# the shape: a oneOf of inline schemas, which SmolLM2 laid out `"shape"\n:\n{\n"kind"\n:\n…`
SHAPE = {
    "type": "object",
    "properties": {
        "shape": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"kind": {"const": "square"}, "side": {"type": "number"}},
                    "required": ["kind", "side"],
                },
                {
                    "type": "object",
                    "properties": {"kind": {"const": "circle"}, "radius": {"type": "number"}},
                    "required": ["kind", "radius"],
                },
            ]
        },
        "colour": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["shape", "colour", "tags"],
}
# what Pydantic writes for `colours: set[Colour]`, Colour an Enum
COLOURS = {
    "$defs": {"Colour": {"enum": ["red", "green", "blue"], "title": "Colour", "type": "string"}},
    "properties": {
        "colours": {
            "items": {"$ref": "#/$defs/Colour"},
            "title": "Colours",
            "type": "array",
            "uniqueItems": True,
        }
    },
    "required": ["colours"],
    "title": "Palette",
    "type": "object",
}
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def laid_out(text: str) -> bool:
    """Whether the JSON text is json.dumps's layout: outside its strings, no whitespace but the one
    space after each `,` and `:`."""
    bare = STRING.sub('""', text)
    return not re.search(r"\s", bare.replace(", ", ",").replace(": ", ":"))


@pytest.mark.fast
def test_the_layout_is_told_to_llguidance_for_every_shape() -> None:
    for flags in ({"format": "json"}, {"schema": json.dumps(SHAPE)}, {"schema": json.dumps(COLOURS)}):
        rule = constraint(**flags)
        assert rule is not None and rule.guide is not None
        options = json.loads(rule.guide)["grammars"][0]["json_schema"]["x-guidance"]
        assert options == {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    assert laid_out('{"a": [1, 2], "b": {"c": "x \\" ,\\n y"}}')
    assert not laid_out('{"a"\n: 1}') and not laid_out('{"a": 1 }') and not laid_out('{\n"a": 1}')


@pytest.mark.model
def test_sampled_answers_take_the_one_layout(engine, smollm2_path: Path) -> None:
    # sampled wide open, where the line breaks came from: every answer on one line, as json.dumps lays
    # it out (before: 32 tokens for `{"shape": {"kind": "circle", "radius": 15}, "colour": "blue"}`
    # laid out over 7 lines; now 21)
    header = read_header(smollm2_path)
    prompt = render_prompt(engine, header, [Message("user", "Describe a shape.")]).tokens
    for flags in ({"schema": json.dumps(SHAPE)}, {"format": "json"}):
        rule = constraint(**flags)
        assert rule is not None
        for seed in range(4):
            sampling = SamplingConfig(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
            result = engine.generate(prompt, sampling, max_tokens=200, guide=rule.guide)
            if result.finish_reason != FINISH_STOP:
                continue  # cut by the limit: the layout of what came is checked all the same
            assert isinstance(json.loads(result.text), dict), result.text
            assert laid_out(result.text), (flags, seed, result.text)


@pytest.mark.fast
def test_a_set_of_an_enum_is_every_subset_in_the_enums_order() -> None:
    rule = constraint(schema=json.dumps(COLOURS))
    assert rule is not None and rule.guide is not None
    compiled = json.loads(rule.guide)["grammars"][0]["json_schema"]
    branches = compiled["properties"]["colours"]["anyOf"]
    written = [[item["const"] for item in b["prefixItems"]] for b in branches]
    assert sorted(written) == sorted(
        [
            [],
            ["red"],
            ["green"],
            ["blue"],
            ["red", "green"],
            ["red", "blue"],
            ["green", "blue"],
            ["red", "green", "blue"],
        ]
    )
    assert all(b["items"] is False for b in branches)
    assert COLOURS["properties"]["colours"]["uniqueItems"] is True  # the schema as given is untouched


@pytest.mark.fast
def test_set_bounds_booleans_and_other_types_are_kept() -> None:
    schema: dict[str, Any] = {
        "properties": {
            "a": {"type": ["array", "null"], "items": {"type": "boolean"}, "uniqueItems": True, "minItems": 1}
        }
    }
    assert enforce_unique(schema, lambda _ref: None) is None
    branches = schema["properties"]["a"]["anyOf"]
    assert {"type": ["null"]} in branches
    arrays = [[i["const"] for i in b["prefixItems"]] for b in branches if b["type"] == "array"]
    assert sorted(arrays, key=str) == sorted([[False], [True], [False, True]], key=str)
    free = {"properties": {"n": {"type": "array", "items": {"type": "integer"}, "uniqueItems": False}}}
    assert enforce_unique(free, lambda _ref: None) is None and "uniqueItems" not in free["properties"]["n"]


@pytest.mark.fast
@pytest.mark.parametrize(
    "items",
    [{"type": "string"}, None, {"enum": list(range(MAX_SET_VALUES + 1))}, {"$ref": "https://x.org/s.json"}],
    ids=["strings", "anything", "a large enum", "a remote ref"],
)
def test_a_set_the_mask_cannot_hold_is_refused_with_the_way_around_it(items: Any) -> None:
    tags: dict[str, Any] = {"type": "array", "uniqueItems": True}
    if items is not None:
        tags["items"] = items
    with pytest.raises(InvalidSetting) as refused:
        constraint(schema=json.dumps({"properties": {"tags": tags}}))
    said = str(refused.value)
    assert "\n" not in said and ("cannot enforce uniqueItems (at properties/tags)" in said or "$ref" in said)
    if "uniqueItems" in said:
        assert "declare it list[...] and de-duplicate the answer, or remove uniqueItems" in said


@pytest.mark.model
def test_sampled_sets_of_an_enum_have_no_repeats(engine, smollm2_path: Path) -> None:
    rule = constraint(schema=json.dumps(COLOURS))
    assert rule is not None
    header = read_header(smollm2_path)
    finished = 0
    for text in ("Name the colours of a flag.", "Which colours do you like? Say each one many times."):
        prompt = render_prompt(engine, header, [Message("user", text)]).tokens
        for seed in range(4):
            sampling = SamplingConfig(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=seed)
            result = engine.generate(prompt, sampling, max_tokens=60, guide=rule.guide)
            assert result.finish_reason == FINISH_STOP, result.text
            value = json.loads(result.text)
            jsonschema.validate(value, COLOURS)  # uniqueItems included
            order = ["red", "green", "blue"]
            assert value["colours"] == sorted(value["colours"], key=order.index)
            finished += 1
    assert finished == 8
