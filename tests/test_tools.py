"""Tools for a model (runner.engine.text.tools), hand-picked: the tools in the system message of a template
that has no place for them, the schema a forced call must match, and calls read back out of answers."""

from __future__ import annotations

import json

import pytest

from runner.engine.text.template import Message
from runner.engine.text.tools import forced_call_schema, parse_tool_calls, tools_as_system

pytestmark = pytest.mark.fast

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
    {"type": "function", "function": {"name": "now"}},
]


def test_tools_go_in_the_system_message_a_template_without_them_reads() -> None:
    listed = '{"name": "get_weather", "parameters": ' + json.dumps(SCHEMA) + '}\n{"name": "now"}'
    text = (
        f"You can call these functions:\n{listed}\n"
        'To call one, answer with only a JSON object: {"name": <function name>, "arguments": {...}}.'
    )
    user = Message("user", "Weather?", {"name": "me"})
    assert tools_as_system([user], TOOLS) == [Message("system", text), user]
    system = Message("system", "Be brief.", {"x": 1})
    assert tools_as_system([system, user], TOOLS) == [
        Message("system", f"Be brief.\n\n{text}", {"x": 1}),
        user,
    ]
    assert tools_as_system([], TOOLS) == []


def test_a_forced_call_schema_and_calls_read_back() -> None:
    one = forced_call_schema(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    # the parameters as llama.cpp's grammar reads them: no keys but those named, unless they say
    assert one["properties"] == {
        "name": {"const": "get_weather"},
        "arguments": {**SCHEMA, "additionalProperties": False},
    }
    assert [o["properties"]["name"] for o in forced_call_schema(TOOLS, "required")["oneOf"]] == [
        {"const": "get_weather"},
        {"const": "now"},
    ]
    text = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert parse_tool_calls(text, TOOLS) == (
        [{"name": "get_weather", "arguments": {"city": "Paris"}}],
        "Sure.",
    )
    assert parse_tool_calls('{"name": "now", "parameters": "{}"}', TOOLS) == (
        [{"name": "now", "arguments": {}}],
        "",
    )
    assert parse_tool_calls('{"name": "rm", "arguments": {}}', TOOLS) == (
        [],
        '{"name": "rm", "arguments": {}}',
    )


def test_a_forced_calls_refs_point_where_its_parameters_went() -> None:
    """Pydantic's parameters refer to their own root ("#/$defs/Address"); inside the call's schema
    they sit under arguments, so each local $ref follows them there (instructor's nested models in
    TOOLS mode got a 400, "Pointer '/$defs/Address' does not exist"). Data is left as it is."""
    import jsonschema

    from runner.engine.text.constrain import constraint

    address = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    params = {
        "$defs": {"Address": address},
        "type": "object",
        "properties": {
            "home": {"$ref": "#/$defs/Address"},
            "enum": {"enum": [{"$ref": "#/kept"}]},  # a property named enum, with data that looks like a ref
            "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
        },
        "required": ["home"],
    }
    tools = [{"type": "function", "function": {"name": "move", "parameters": params}}, *TOOLS]
    one = forced_call_schema(tools, {"type": "function", "function": {"name": "move"}})
    moved = one["properties"]["arguments"]["properties"]
    assert moved["home"] == {"$ref": "#/properties/arguments/$defs/Address"}
    assert moved["enum"] == {"enum": [{"$ref": "#/kept"}]}
    assert moved["next"]["anyOf"][0] == {"$ref": "#/properties/arguments"}
    every = forced_call_schema(tools, "required")
    assert every["oneOf"][0]["properties"]["arguments"]["properties"]["home"] == {
        "$ref": "#/oneOf/0/properties/arguments/$defs/Address"
    }
    call = {"name": "move", "arguments": {"home": {"city": "Oslo"}, "next": None}}
    for schema in (one, every):
        assert constraint(schema=json.dumps(schema)) is not None  # llguidance finds every pointer
        jsonschema.validate(call, schema)  # and so does the check of the answer
        try:
            jsonschema.validate({"name": "move", "arguments": {"home": {"town": 1}}}, schema)
        except jsonschema.ValidationError:
            pass
        else:
            raise AssertionError("the moved $ref did not reach Address")
