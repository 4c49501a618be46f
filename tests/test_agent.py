"""The agent loop's parts that need no model and no server (runner.commands.agent): what an answer that
may be a call shows as it streams, which calls run without asking, the tool flags refused before a
load, and a kept step as the chat template reads it. The loop itself, with SmolLM2 and real MCP
servers, is tests/test_tools_cli.py's."""

from __future__ import annotations

import io

import pytest

from runner.commands.agent import Approvals, HeldCalls, ToolNotAllowed, ToolSettings, template_message
from runner.engine.answer import Result, Timings
from runner.errors import UsageError
from runner.store import StoredMessage
from runner.tools.catalog import Tool

pytestmark = pytest.mark.fast

CALL = {"name": "add", "arguments": {"a": 1, "b": 2}}


def streamed(pieces: list[str], result: Result, **kwargs: object) -> str:
    out = io.StringIO()
    writer = HeldCalls(out, **kwargs)  # type: ignore[arg-type]
    for piece in pieces:
        writer.write("answer", piece)
    writer.release(result)
    return out.getvalue()


def answer(text: str, *calls: dict[str, object]) -> Result:
    return Result(text, "tool_calls" if calls else "stop", Timings(), tool_calls=tuple(calls))


def test_a_call_never_reaches_stdout_and_plain_text_streams_as_it_comes() -> None:
    out = io.StringIO()
    writer = HeldCalls(out)
    writer.write("answer", "It is ")
    writer.write("answer", "sunny<tool")
    assert out.getvalue() == "It is sunny"  # "<tool" may open a call: held until the next piece says
    writer.write("answer", "_call>{...}</tool_call>")
    writer.release(answer("It is sunny", CALL))
    assert out.getvalue() == "It is sunny"
    # the pieces split anywhere, a marker across them: the text before it, nothing of the call
    for marker in ("<tool_call>", "<|python_tag|>", "[TOOL_CALLS]"):
        text = f"Let me check. {marker}" + '{"name": "add"}'
        for cut in range(1, len(text)):
            assert streamed([text[:cut], text[cut:]], answer("Let me check.", CALL)) == "Let me check. "
    # an answer that starts as JSON is held whole: a call, or the answer at the end
    assert streamed(['  {"name"', ': "add"}'], answer("", CALL)) == ""
    assert streamed(['{"x"', ": 1}"], answer('{"x": 1}')) == '{"x": 1}'
    # text that only looked like a marker's start comes out once the answer is read
    assert streamed(["a < b and [TOOL"], answer("a < b and [TOOL")) == "a < b and [TOOL"


def test_an_answer_asked_without_tools_is_written_whole_even_when_it_looks_like_a_call() -> None:
    out = io.StringIO()
    with HeldCalls(out) as writer:  # a chat with no tool server: nothing releases the answer
        writer.write("answer", '{"x"')
        writer.write("answer", ": 1}")
    assert out.getvalue() == '{"x": 1}'


def test_run_holds_every_answer_and_writes_only_the_final_one() -> None:
    assert streamed(["The sum ", "is 3."], answer("The sum is 3."), hold_all=True) == "The sum is 3."
    assert streamed(["Checking. ", "<tool_call>"], answer("Checking.", CALL), hold_all=True) == ""


def tool(name: str = "add", server: str = "calc") -> Tool:
    return Tool(server, name, name, "", {})


def test_which_calls_run_without_asking() -> None:
    approvals = Approvals(("add", "files:*"))
    assert approvals.decide(tool("add"), {}) == "allowed"
    assert approvals.decide(tool("read", "files"), {}) == "allowed"
    with pytest.raises(ToolNotAllowed, match="--allow-tools sub"):  # no terminal: nothing asks, nothing runs
        approvals.decide(tool("sub"), {})
    answers = iter(["a", "n"])
    asking = Approvals((), ask=lambda _question: next(answers))
    assert asking.decide(tool("sub"), {"a": 1}) == "always"
    assert asking.decide(tool("sub"), {"a": 2}) == "always"  # not asked again in this chat
    assert asking.decide(tool("mul"), {}) == "no"


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        (ToolSettings(max_steps=0), "--max-tool-steps"),
        (ToolSettings(timeout_s=0), "--tool-timeout"),
        (ToolSettings(allow=("files:x",)), "--allow-tools"),
        (ToolSettings(allow=("",)), "--allow-tools"),
    ],
)
def test_tool_flags_out_of_range_are_refused(settings: ToolSettings, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        settings.check()


def test_the_tool_choice_forces_the_first_step_only() -> None:
    named = ToolSettings(choice="add")
    assert named.api_choice(0, ["add"]) == {"type": "function", "function": {"name": "add"}}
    assert named.api_choice(1, ["add"]) == "auto"  # a forced call every step would never end
    assert ToolSettings(choice="required").api_choice(0, ["add"]) == "required"
    with pytest.raises(UsageError, match="no such tool"):
        ToolSettings(choice="sub").api_choice(0, ["add"])


def test_a_kept_step_is_what_the_template_reads() -> None:
    call = {"id": "call_1", **CALL}
    calls = template_message(StoredMessage("assistant", "", tool_calls=(call,)))
    assert calls.as_dict() == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_1", "type": "function", "function": CALL}],
    }
    result = template_message(StoredMessage("tool", "3", call_id="call_1", tool="add"))
    assert result.as_dict() == {"role": "tool", "content": "3", "tool_call_id": "call_1", "name": "add"}
    assert template_message(StoredMessage("user", "Hi")).as_dict() == {"role": "user", "content": "Hi"}
