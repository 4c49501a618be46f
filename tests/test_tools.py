"""Tools for a model (runner.engine.tools), hand-picked: the tools in the system message of a template
that has no place for them, the schema a forced call must match, and calls read back out of answers."""

from __future__ import annotations

import json

from runner.engine.template import Message
from runner.engine.tools import forced_call_schema, parse_tool_calls, tools_as_system

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
    assert one["properties"] == {"name": {"const": "get_weather"}, "arguments": SCHEMA}
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
