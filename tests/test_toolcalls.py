"""Every family's tool calls (runner.engine.text.toolcalls): its real chat template told apart and
rendered with tools, the outputs llama.cpp's own parser tests record read back to the calls those
tests expect, broken outputs left as text; and the wiring: a call's control tokens shown by the step
function, gpt-oss's call kept out of its reasoning, and `finish` reading the prompt's format, on
hand-made tokens (fast) and through the real loop from scripted models (model)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runner.engine.answer import FINISH_STOP, FINISH_TOOL_CALLS
from runner.engine.request import Prompt, Request, finish, to_job
from runner.engine.sequence import Slot
from runner.engine.text.reasoning import ANSWER, REASONING, Splitter
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.template import Message, render
from runner.engine.text.toolcalls import FORMATS, GENERIC, format_of, markers, parse_calls
from runner.engine.text.tools import parse_tool_calls

TEMPLATES = Path(__file__).parent / "data" / "templates"  # where each came from: SOURCES.md there


def tool(name: str, **props: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}
    return {"type": "function", "function": {"name": name, "description": f"{name}.", "parameters": schema}}


# llama.cpp's test tools (tests/test-chat.cpp: special_function, special_function_with_opt, python,
# code_interpreter), and the ones its DeepSeek V3.1 and gpt-oss cases call
TOOLS = [
    tool("special_function", arg1="integer"),
    tool("special_function_with_opt", arg1="integer", arg2="integer"),
    tool("python", code="string"),
    tool("code_interpreter", code="string"),
    tool("get_time", city="string"),
    tool("get_weather", city="string"),
    tool("edit", oldString="string", newString="string", replaceAll="boolean"),
]

FAMILIES = {
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "Qwen-QwQ-32B.jinja": "hermes",
    "Qwen3-Coder.jinja": "qwen3-coder",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "llama3",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral",
    "unsloth-mistral-Devstral-Small-2507.jinja": "mistral",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": "mistral",
    "openai-gpt-oss-120b.jinja": "gpt-oss",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "granite",
    "ibm-granite-granite-4.0.jinja": "granite",
    "llama-cpp-microsoft-Phi-4-mini-instruct.jinja": "phi-4-mini",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "firefunction",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek",
    "llama-cpp-deepseek-r1.jinja": "deepseek",
    "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "command-r7b",
    "meetkai-functionary-medium-v3.2.jinja": "functionary-v3.2",
    "meetkai-functionary-medium-v3.1.jinja": "functionary-v3.1",
    "google-gemma-2-2b-it.jinja": "gemma",
    "microsoft-Phi-3.5-mini-instruct.jinja": GENERIC,
}
# templates that render no list of tools (runner.serve.engine_backend then uses tools_as_system)
SHOWS_NO_TOOLS = {
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "deepseek-ai-DeepSeek-V3.1.jinja",
    "google-gemma-2-2b-it.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
}
# what runner.engine.text.template does not give this one (llama.cpp passes no `functions` either)
RENDER_GAPS = {
    "fireworks-ai-llama-3-firefunction-v2.jinja": "reads `functions` and `datetime`, which llama.cpp passes",
}


@pytest.mark.fast
def test_every_template_here_is_one_of_the_families() -> None:
    assert sorted(p.name for p in TEMPLATES.glob("*.jinja")) == sorted(FAMILIES)
    assert set(FAMILIES.values()) == set(FORMATS)  # every format has a real template here


@pytest.mark.fast
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_family_is_told_by_its_template(name: str) -> None:
    assert format_of((TEMPLATES / name).read_text()) == FAMILIES[name]


@pytest.mark.fast
def test_no_template_is_generic() -> None:
    assert format_of(None) == format_of("") == format_of("{{ messages }}") == GENERIC


@pytest.mark.fast
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=RENDER_GAPS[n]))
        if n in RENDER_GAPS
        else n
        for n in sorted(FAMILIES)
    ],
)
def test_a_family_template_renders_a_conversation_with_tools(name: str) -> None:
    messages = [Message("user", "What is the weather in Paris?")]
    text = render((TEMPLATES / name).read_text(), messages, bos_token="<s>", eos_token="</s>", tools=TOOLS)
    assert "What is the weather in Paris?" in text
    assert ("special_function" in text) == (name not in SHOWS_NO_TOOLS)


# -- recorded outputs -----------------------------------------------------------------------------------
#
# Each output below is copied exactly from llama.cpp's parser tests, with the calls they expect
# (arguments as JSON objects, ids where the test has one) and the text around them. [pinned]: the
# llama.cpp that llama-cpp-python 0.3.36 vendors, tests/test-chat.cpp. [older]: llama.cpp's
# tests/test-chat.cpp before its PEG parsers (ggml-org/llama.cpp history, test_template_output_parsers),
# where the pinned file has no such case. A case without a tool call is not listed: no tools, no change.

CALL = {"name": "special_function", "arguments": {"arg1": 1}}
CALL_ID = {**CALL, "id": "123456789"}
PYTHON = {"name": "python", "arguments": {"code": "print('hey')"}}
CONTENT = "Hello, world!\nWhat's up?"

RECORDED: list[tuple[str, str, list[dict[str, Any]], str]] = [
    # hermes [pinned] Hermes 2 Pro; [older] Hermes 2 Pro / Qwen2.5, parallel calls
    ("hermes", '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>', [CALL], ""),
    (
        "hermes",
        "Hello, world!\nWhat's up?<tool_call>\n"
        '{"name": "special_function", "arguments": {"arg1": 1}}</tool_call>',
        [CALL],
        CONTENT,
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "python", "arguments": {"code":"print(\'hello\')"}}\n</tool_call>',
        [CALL, {"name": "python", "arguments": {"code": "print('hello')"}}],
        "",
    ),
    ("hermes", '<function=special_function>{"arg1": 1}</function>', [CALL], ""),
    ("hermes", '{"name": "special_function", "arguments": {"arg1": 1}}', [CALL], ""),
    # qwen3-coder [pinned] Qwen3-Coder
    (
        "qwen3-coder",
        "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
        [CALL],
        "",
    ),
    (
        "qwen3-coder",
        "Let me call it.\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n"
        "</tool_call>",
        [CALL],
        "Let me call it.",
    ),
    (
        "qwen3-coder",
        "<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
        "<function=special_function_with_opt>\n<parameter=arg1>\n1\n</parameter>\n<parameter=arg2>\n2\n"
        "</parameter>\n</function>\n</tool_call>",
        [CALL, {"name": "special_function_with_opt", "arguments": {"arg1": 1, "arg2": 2}}],
        "",
    ),
    # llama3 [older] Llama 3.1 / 3.2: a JSON object, and the builtin tools after <|python_tag|>
    ("llama3", '{"name": "special_function", "parameters": {"arg1": 1}}', [CALL], ""),
    (
        "llama3",
        "<|python_tag|>code_interpreter.call(code=\"print('hey')\")",
        [{"name": "code_interpreter", "arguments": {"code": "print('hey')"}}],
        "",
    ),
    ("llama3", "<|python_tag|>python.call(code=\"print('hey')\")", [PYTHON], ""),
    # mistral [pinned] Mistral Nemo (ids), Mistral Small 3.2 ([CALL_ID], parallel), Devstral (no id)
    (
        "mistral",
        '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]',
        [CALL_ID],
        "",
    ),
    ("mistral", '[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}', [CALL_ID], ""),
    (
        "mistral",
        '[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
        '[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}',
        [
            {**CALL, "id": "000000001"},
            {"name": "special_function_with_opt", "arguments": {"arg1": 1, "arg2": 2}, "id": "000000002"},
        ],
        "",
    ),
    ("mistral", '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', [CALL], ""),
    ("mistral", 'Hello, world!\nWhat\'s up?[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', [CALL], CONTENT),
    # granite [older] Granite 3.3; [pinned] Granite 4.0
    ("granite", '<|tool_call|>[{"name": "special_function", "arguments": {"arg1": 1}}]', [CALL], ""),
    (
        "granite",
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
        [CALL],
        "",
    ),
    # phi-4-mini: the pinned llama.cpp has no Phi-4-mini case (its template's own example is tested
    # below); [pinned] FireFunction v2's functools[...], the form Phi-4-mini itself writes
    ("firefunction", ' functools[{"name": "special_function", "arguments": {"arg1": 1}}]', [CALL], ""),
    ("phi-4-mini", ' functools[{"name": "special_function", "arguments": {"arg1": 1}}]', [CALL], ""),
    # deepseek [pinned] R1 (llama.cpp's template, and the Qwen 32B distill's); [older] R1's other
    # opening, and V3.1
    (
        "deepseek",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n"
        '```json\n{"arg1": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        [CALL],
        "",
    ),
    (
        "deepseek",
        "<｜tool▁calls｜>function<｜tool▁sep｜>special_function\n"
        '```json\n{"arg1": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        [CALL],
        "",
    ),
    (
        "deepseek",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"city": "Tokyo"}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        [{"name": "get_time", "arguments": {"city": "Tokyo"}}],
        "",
    ),
    (
        "deepseek",
        'CONTENT<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"city": "Paris"}'
        '<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        [
            {"name": "get_time", "arguments": {"city": "Paris"}},
            {"name": "get_weather", "arguments": {"city": "Paris"}},
        ],
        "CONTENT",
    ),
    # command-r7b [pinned]: the thinking's marks dropped, its text kept (as without tools, where
    # they are control tokens not rendered)
    (
        "command-r7b",
        "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_ACTION|>[\n"
        '    {"tool_call_id": "0", "tool_name": "special_function", "parameters": {"arg1": 1}}\n'
        "]<|END_ACTION|>",
        [{**CALL, "id": "0"}],
        "I'm\nthinking",
    ),
    # functionary-v3.2 [pinned], [older]: the generation prompt ends with ">>>"
    ("functionary-v3.2", 'special_function\n{"arg1": 1}', [CALL], ""),
    (
        "functionary-v3.2",
        'all\nHello, world!\nnono\nWhat\'s up?>>>special_function\n{"arg1": 1}\n',
        [CALL],
        "Hello, world!\nnono\nWhat's up?",
    ),
    (
        "functionary-v3.2",
        "python\n# This is a program:\nprint('hey')",
        [{"name": "python", "arguments": {"code": "# This is a program:\nprint('hey')"}}],
        "",
    ),
    ("functionary-v3.2", 'special_function\n{"arg1": 1} \n                    ', [CALL], ""),
    # functionary-v3.1 [pinned]
    ("functionary-v3.1", '<function=special_function>{"arg1": 1}</function>', [CALL], ""),
    # gemma: llama.cpp's generic format [older] (its complete call is in a disabled block there)
    (
        "gemma",
        '{\n  "tool_calls": [\n    {\n      "name": "special_function",\n      "arguments": {\n'
        '        "arg1": 1\n      },\n      "id": "123456789"\n    }\n  ],\n  "content": ""\n}',
        [CALL_ID],
        "",
    ),
    ("gemma", '{\n  "response": "Hello, world!\\nWhat\'s up?"\n}', [], CONTENT),
    # generic: what runner always read
    (
        "generic",
        '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}\n</tool_call>',
        [CALL],
        "",
    ),
]


@pytest.mark.fast
@pytest.mark.parametrize("fmt, output, calls, text", RECORDED)
def test_a_recorded_output_reads_as_llama_cpp_reads_it(
    fmt: str, output: str, calls: list[dict[str, Any]], text: str
) -> None:
    assert parse_calls(output, TOOLS, fmt) == (calls, text)


@pytest.mark.fast
def test_phi4_minis_own_example_is_a_call_of_a_tool_it_has() -> None:
    """The Phi-4-mini template's example names "foo", no tool above: given foo, it is a call."""
    example = '<|tool_call|>{"name": "foo", "arguments": {"a": 1}}<|/tool_call|>'
    assert parse_calls(example, [tool("foo", a="integer")], "phi-4-mini") == (
        [{"name": "foo", "arguments": {"a": 1}}],
        "",
    )


# gpt-oss [pinned] and [older]: the answer reaches `finish` through the splitter, which keeps a message
# to functions.NAME in the answer when the request has tools; llama.cpp expects this reasoning too
HARMONY_CALLS = [
    (' to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}', ""),
    ('<|channel|>analysis to=functions.special_function<|message|>{"arg1": 1}', ""),
    (' to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{"arg1": 1}', ""),
    ('<|channel|>commentary to=functions.special_function<|message|>{"arg1": 1}', ""),
    (
        "<|channel|>analysis<|message|>I'm\nthinking<|end|>"
        '<|start|>assistant to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}',
        "I'm\nthinking",
    ),
    (
        "<|channel|>analysis<|message|>I'm\nthinking<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.special_function <|constrain|>json"
        '<|message|>{"arg1": 1}',
        "I'm\nthinking",
    ),
]


def split(text: str, calls: bool, cuts: list[int]) -> tuple[str, str]:
    splitter, parts, last = Splitter("channels", calls=calls), [], 0
    for cut in [*cuts, len(text)]:
        parts += splitter.push(text[last:cut])
        last = cut
    parts += splitter.flush()
    return "".join(t for k, t in parts if k == REASONING), "".join(t for k, t in parts if k == ANSWER)


@pytest.mark.fast
@pytest.mark.parametrize("output, reasoning", HARMONY_CALLS)
def test_a_harmony_call_reaches_finish_whole_at_every_split(output: str, reasoning: str) -> None:
    for cuts in ([], *([i] for i in range(1, len(output))), list(range(1, len(output)))):
        said, answer = split(output, True, cuts)
        assert said == reasoning, cuts
        assert parse_calls(answer, TOOLS, "gpt-oss") == ([CALL], ""), cuts


@pytest.mark.fast
def test_harmonys_complex_call_and_a_call_without_tools() -> None:
    """[pinned] "Complex tool calling": an edit's arguments; without tools a commentary message is
    reasoning, as it always was."""
    output = (
        "<|channel|>analysis<|message|>Thinking about edit...<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json"
        '<|message|>{"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", '
        '"replaceAll": false}'
    )
    reasoning, answer = split(output, True, [])
    args = {"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", "replaceAll": False}
    assert reasoning == "Thinking about edit..."
    assert parse_calls(answer, TOOLS, "gpt-oss") == ([{"name": "edit", "arguments": args}], "")
    reasoning, answer = split(output, False, [])
    assert answer == "" and reasoning.startswith("Thinking about edit...") and "railCount" in reasoning


# -- broken outputs -----------------------------------------------------------------------------------------

BROKEN = [
    # cut short: [older] llama.cpp's partial cases, read whole here (a cut answer is no call)
    ("granite", '<|tool_call|>[{"name": "special_function", "arguments": {"arg'),
    ("command-r7b", '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "special'),
    ("gpt-oss", '<|channel|>commentary to=functions.special_function <|constrain|>json<|message|>{"arg1'),
    ("gemma", '{ "tool_call" : { "name" : "special_function", "arguments" : { "arg'),
    ("hermes", "Let's call something\n<tool_call>{\"name"),
    ("functionary-v3.1", '<function=special_function>{"arg1": 1'),
    ("mistral", '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}'),
    (
        "deepseek",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{",
    ),
    ("llama3", "<|python_tag|>code_interpreter.call(code=\"print('hey')"),
    ("qwen3-coder", "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n"),
    # names not among the tools
    ("hermes", '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'),
    ("llama3", '{"name": "rm_rf", "parameters": {}}'),
    ("mistral", '[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}'),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "special_function", "arguments": {}}, {"name": "rm_rf", "arguments": {}}]',
    ),
    ("deepseek", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>rm_rf<｜tool▁sep｜>{}<｜tool▁call▁end｜>"),
    ("phi-4-mini", ' functools[{"name": "rm_rf", "arguments": {}}]'),
    ("functionary-v3.1", '<function=rm_rf>{"path": "/"}</function>'),
    # arguments that are no object
    ("hermes", '<tool_call>{"name": "special_function", "arguments": [1]}</tool_call>'),
    ("generic", '{"name": "special_function", "arguments": "not json"}'),
]


@pytest.mark.fast
@pytest.mark.parametrize("fmt, output", BROKEN)
def test_a_broken_output_is_text(fmt: str, output: str) -> None:
    assert parse_calls(output, TOOLS, fmt) == ([], output)


@pytest.mark.fast
def test_an_answer_without_a_call_is_left_as_it_is() -> None:
    """Every format, white space and a marks-free answer kept byte for byte; only functionary's "all"
    heading and a generic {"response"} are read off (as llama.cpp reads them)."""
    for fmt in FORMATS:
        for answer in ("  Hello, world!\nWhat's up?\n\n", "Say [1, 2] and {3}.", ""):
            assert parse_calls(answer, TOOLS, fmt) == ([], answer), fmt
    assert parse_calls("all\nHello!", TOOLS, "functionary-v3.2") == ([], "Hello!")


@pytest.mark.fast
def test_no_prefix_of_any_output_raises() -> None:
    """An answer cut anywhere (a length limit, a stop string) is read without raising, in every format."""
    outputs = [output for _, output, _, _ in RECORDED] + [output for _, output in BROKEN]
    for fmt in FORMATS:
        for output in outputs:
            for end in range(len(output) + 1):
                calls, _ = parse_calls(output[:end], TOOLS, fmt)
                assert all(call["name"] in {t["function"]["name"] for t in TOOLS} for call in calls)


@pytest.mark.fast
def test_a_builtin_tools_arguments_are_literals_read_never_run() -> None:
    """<|python_tag|>NAME.call(...): keyword arguments, each a Python literal (ast.literal_eval), else
    no call; code after the tag is the "python" tool's, where the request has that tool."""
    builtins = [t for t in TOOLS if t["function"]["name"] != "python"]
    for output in (
        "<|python_tag|>code_interpreter.call(__import__('os').system('x'))",
        '<|python_tag|>rm.call(p="/")',
    ):
        assert parse_calls(output, builtins, "llama3") == ([], output)
    raw = "<|python_tag|>print(sum(range(4)))"
    assert parse_calls(raw, TOOLS, "llama3") == (
        [{"name": "python", "arguments": {"code": "print(sum(range(4)))"}}],
        "",
    )


@pytest.mark.fast
def test_a_forced_call_is_the_whole_answer_whatever_the_format() -> None:
    forced = '{"name": "special_function", "arguments": {"arg1": 1}}'
    for fmt in FORMATS:
        assert parse_tool_calls(forced, TOOLS, fmt, whole_json=True) == ([CALL], "")


# -- the wiring: markers shown, the format carried from the prompt to finish ---------------------------


class Vocab:
    """Token ids -> text, some of them control tokens that render only when asked (as llama.cpp's)."""

    def __init__(self, words: dict[int, str], control: set[int]) -> None:
        self.words, self.control = words, control

    def is_end(self, token: int) -> bool:
        return token == 0

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return b"" if token in self.control and not special else self.words[token].encode()


MISTRAL = {1: "[TOOL_CALLS]", 2: "special_function", 3: "[ARGS]", 4: '{"arg1": 1}', 5: "<unused>", 6: "Sure."}


def answer(request: Request, tokens: list[int]) -> Any:
    """The step function over `tokens` (a control token among them), then `finish`, as every door does."""
    slot = Slot(0, to_job(request), sampler=None, speculator=None, start=0.0)
    vocab = Vocab(MISTRAL, control={1, 3, 5})
    for token in tokens:
        assert slot.take(token, vocab, 1000) is None
        slot.pos += 1
    return finish(request, slot.result(FINISH_STOP, flush=True, extra={}))


@pytest.mark.fast
def test_a_calls_control_tokens_are_shown_and_read_in_the_prompts_format() -> None:
    """Mistral's [TOOL_CALLS] and [ARGS] are control tokens: with tools, the step shows them (and no
    other control token), and finish reads the call in the prompt's format; without tools nothing
    changes: the marks are not shown, nothing is read."""
    prompt = Prompt(
        [7], "", tool_format=format_of((TEMPLATES / "unsloth-mistral-Devstral-Small-2507.jinja").read_text())
    )
    greedy = SamplingConfig(temperature=0)
    asked = Request(prompt, greedy, tools=tuple(TOOLS))
    assert to_job(asked).markers == markers("mistral") and "[TOOL_CALLS]" in markers("mistral")
    result = answer(asked, [6, 5, 1, 2, 3, 4])
    assert (result.finish_reason, result.tool_calls, result.text) == (FINISH_TOOL_CALLS, (CALL,), "Sure.")
    plain = answer(Request(prompt, greedy), [6, 5, 1, 2, 3, 4])
    assert (plain.finish_reason, plain.tool_calls, plain.text) == (
        FINISH_STOP,
        (),
        'Sure.special_function{"arg1": 1}',
    )
    generic = answer(Request(Prompt([7], ""), greedy, tools=tuple(TOOLS)), [6, 5, 1, 2, 3, 4])
    assert (
        generic.tool_calls == () and generic.text == 'Sure.special_function{"arg1": 1}'
    )  # no marks: no call


# -- a model that really writes calls: the real loop, llama.cpp's control tokens ------------------------
#
# Scripted models (tests/synth.py) on SmolLM2's tokenizer, their unused control tokens renamed to a
# family's marks; each greedy answer is a call of get_weather. Rendered, looked up and ended by
# llama.cpp as that family's model would be.

WEATHER = [tool("get_weather", city="string")]
PARIS = {"name": "get_weather", "arguments": {"city": "Paris"}}


@dataclass(frozen=True)
class Script:
    """A family's scripted model: its template, the answer (text, or a renamed token's id) and the
    control tokens renamed to its marks."""

    name: str
    template: str
    answer: tuple[str | int, ...]
    edits: dict[int, str]


MISTRAL_MODEL = Script(
    "mistral",
    "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}{# [TOOL_CALLS] #}",
    (3, "get_weather", 4, '{"city": "Paris"}', 2),  # 2: SmolLM2's <|im_end|>
    {3: "[TOOL_CALLS]", 4: "[ARGS]"},
)
HARMONY_MARKS = (
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|start|>",
    "<|return|>",
    "<|call|>",
    "<|constrain|>",
)
GPT_OSS_MODEL = Script(  # <|call|> ends generation; <|end|> does not
    "gpt-oss",
    "{% for m in messages %}<|start|>{{ m.role }}{% if m.role == 'assistant' %}<|channel|>final{% endif %}"
    "<|message|>{{ m.content }}<|end|>{% endfor %}<|start|>assistant",
    (3, "commentary to=functions.get_weather ", 9, "json", 4, '{"city":"Paris"}', 8),
    dict(enumerate(HARMONY_MARKS, start=3)),
)


def scripted(smollm2_path: Path, folder: Path, script: Script) -> Path:
    """The family's model: a greedy answer to its template's prompt that is `script.answer`."""
    from runner.engine.engine import Engine
    from tests.synth import write_scripted

    with Engine(smollm2_path, n_ctx=256, n_threads=1) as vocab:

        def tokens(text: str) -> list[int]:
            return vocab.model.tokenize(text, add_special=False)

        prompt = render(script.template, [Message("user", "weather")], tools=WEATHER)
        ids = [tokens(prompt)[-1]]
        for part in script.answer:
            ids += [part] if isinstance(part, int) else tokens(part)
    out = folder / f"{script.name}.gguf"
    return write_scripted(out, smollm2_path, ids, edits=script.edits, template=script.template)


def ask(model: Path, tools: list[dict[str, Any]]) -> Any:
    """The model's answer through the engine's own loop and `finish`, and the prompt's call format."""
    from runner.engine.engine import Engine
    from runner.engine.prompt import render_prompt
    from runner.gguf import read_header

    with Engine(model, n_ctx=512, n_threads=1) as engine:
        prompt = render_prompt(engine, read_header(model), [Message("user", "weather")], tools=tools or None)
        request = Request(prompt, SamplingConfig(temperature=0), max_tokens=48, tools=tuple(tools))
        return prompt.tool_format, engine.answer(request)


@pytest.mark.model
def test_a_mistral_models_call_is_read_through_the_real_loop(smollm2_path: Path, tmp_path: Path) -> None:
    """[TOOL_CALLS] and [ARGS] are control tokens llama.cpp renders as nothing: with tools they are
    shown and the call read; without, the answer is what it always was."""
    model = scripted(smollm2_path, tmp_path, MISTRAL_MODEL)
    fmt, result = ask(model, WEATHER)
    assert (fmt, result.finish_reason, result.tool_calls, result.text) == (
        "mistral",
        "tool_calls",
        (PARIS,),
        "",
    )
    _, plain = ask(model, [])
    assert (plain.finish_reason, plain.tool_calls, plain.text) == ("stop", (), 'get_weather{"city": "Paris"}')


@pytest.mark.model
def test_a_gpt_oss_models_call_is_no_reasoning_with_tools(smollm2_path: Path, tmp_path: Path) -> None:
    """A commentary message to functions.get_weather, ended by <|call|>: with tools a call, its JSON
    in no reasoning; without tools, reasoning as it always was."""
    model = scripted(smollm2_path, tmp_path, GPT_OSS_MODEL)
    fmt, result = ask(model, WEATHER)
    assert (fmt, result.tool_calls, result.text, result.reasoning) == ("gpt-oss", (PARIS,), "", "")
    _, plain = ask(model, [])
    assert (plain.tool_calls, plain.text, plain.reasoning) == ((), "", '{"city":"Paris"}')


@pytest.mark.slow
@pytest.mark.parametrize("script", [MISTRAL_MODEL, GPT_OSS_MODEL], ids=lambda s: s.name)
def test_a_served_calls_markup_never_streams(smollm2_path: Path, tmp_path: Path, script: Script) -> None:
    """runner serve, streamed with tools: the call comes as a tool_calls delta, and no content or
    reasoning delta carries its marks or its arguments."""
    import openai

    from tests.serving import serving

    model = scripted(smollm2_path, tmp_path, script)
    with serving([str(model), "--ctx", "1024"], tmp_path / "stderr") as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused")
        said, calls = "", []
        question = [{"role": "user", "content": "weather"}]
        for chunk in client.chat.completions.create(
            model=model.stem, messages=question, tools=WEATHER, max_tokens=48, temperature=0, stream=True
        ):
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is not None:
                said += (delta.content or "") + ((delta.model_extra or {}).get("reasoning_content") or "")
                calls += delta.tool_calls or []
    assert said == ""
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
