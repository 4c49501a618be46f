"""Tool-call formats: which one a model speaks, and its calls read back out of an answer.

Each family writes its calls its own way. llama.cpp's common/chat.cpp tells them apart by marks in
the chat template's source (never by the file's name); `format_of` looks for the same marks in the
same order, most specific first. The formats, and a call in each:

  hermes            Hermes 2 Pro/3, Qwen2.5, Qwen3, QwQ: <tool_call>{"name", "arguments"}</tool_call>
  qwen3-coder       Qwen3-Coder, Qwen3.5: <tool_call><function=NAME><parameter=KEY>VALUE</parameter>...
  llama3            Llama 3.1-3.3: {"name", "parameters"}; <|python_tag|>NAME.call(KEY="value") (builtins)
  mistral           [TOOL_CALLS][{"name", "arguments", "id"}]; [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}
  gpt-oss           harmony: <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}
  granite           Granite 3: <|tool_call|>[{...}]; Granite 4: <tool_call>{...}</tool_call>
  phi-4-mini        <|tool_call|>{...}<|/tool_call|>, or functools[{...}] (FireFunction v2's too)
  deepseek          R1 and V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>... <｜tool▁calls▁end｜>
  command-r7b       <|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}]<|END_ACTION|>
  functionary-v3.2  >>>NAME\\n{...} (">>>all\\n" heads text); v3.1: <function=NAME>{...}</function>
  gemma             none of its own: llama.cpp's generic JSON ({"tool_call"}, {"tool_calls"}, {"response"})
  generic           a <tool_call> block, or an answer that is one JSON object {"name", "arguments"}

Every format also reads what `generic` reads: what a template without tools was asked for
(tools.tools_as_system), and all that runner read before. A call comes out as {"name", "arguments":
dict}, with "id" where the format carries one. A name not among the request's tools is no call; a
call that does not parse stays text; no answer makes this raise. Pure text: no llama.cpp.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

GENERIC = "generic"
Call = dict[str, Any]  # {"name", "arguments": dict} and "id" where the format carries one
Calls = tuple[list[Call], str]  # the calls, and the text around them
Got = tuple[list[Call], int] | None  # a reader's: the calls a mark starts, and where they end
Fns = dict[str, dict[str, Any]]  # name -> OpenAI function definition


def format_of(template: str | None) -> str:
    """The call format a chat template's model speaks (GENERIC when no family's marks are there)."""
    return next(f.name for f in TABLE if all(mark in (template or "") for mark in f.marks))


def markers(fmt: str | None) -> frozenset[str]:
    """The marks of a format that are control tokens in its models' vocabularies: a loop renders a
    control token as nothing unless told (runner.engine.sequence.Job.markers), and a call without
    its marks cannot be read."""
    return frozenset(FORMATS[fmt].markers) if fmt in FORMATS else frozenset()


def parse_calls(text: str, tools: list[dict[str, Any]], fmt: str, *, whole_json: bool = False) -> Calls:
    """The calls an answer makes in format `fmt` (format_of's) and the text around them. `whole_json`:
    the answer was held to one call's JSON (a forced call), whatever the format."""
    fns = functions(tools)
    if whole_json:
        call = _as_call(_loads(text.strip()), fns)
        if call is not None:
            return [call], ""
    parse = FORMATS[fmt].parse if fmt in FORMATS else _generic
    calls, rest = parse(text, fns)
    if not calls and parse is not _generic:
        found, plain = _generic(text, fns)
        if found:
            return found, plain
    return calls, rest


def functions(tools: list[dict[str, Any]]) -> Fns:
    """name -> OpenAI function definition ({"name", "description", "parameters"})."""
    out = {}
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None  # a client's: anything
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out[fn["name"]] = fn
    return out


# -- reading JSON out of text ------------------------------------------------------------------------

_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")
_ARGS = ("arguments", "parameters")


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _decode(text: str, at: int) -> tuple[Any, int] | None:
    """The JSON value at `at` (after any white space) and where it ends, or None."""
    at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
    try:
        return _DECODER.raw_decode(text, at)
    except (ValueError, RecursionError):
        return None


def _past(text: str, at: int, close: str) -> int:
    """`at` moved past white space and `close`, where they follow (a closing mark may be missing)."""
    end = _SPACE.match(text, at).end()  # type: ignore[union-attr]
    return end + len(close) if close and text.startswith(close, end) else at


def _as_call(value: Any, fns: Fns, name: str = "name", args: tuple = _ARGS, ids: str = "id") -> Call | None:
    """A call of one of `fns` from a decoded object (its keys named as the format names them)."""
    if not isinstance(value, dict) or not isinstance(value.get(name), str) or value[name] not in fns:
        return None
    found: Any = next((value[key] for key in args if key in value), {})
    return _call(value[name], found, value.get(ids))


def _call(name: str, args: Any, call_id: Any = None) -> Call | None:
    if isinstance(args, str):
        args = _loads(args) if args.strip() else {}
    if not isinstance(args, dict):
        return None
    call: Call = {"name": name, "arguments": args}
    if isinstance(call_id, (str, int)) and not isinstance(call_id, bool) and str(call_id):
        call["id"] = str(call_id)
    return call


def _as_calls(value: Any, fns: Fns, **keys: Any) -> list[Call] | None:
    """Every element a call (a list), or the object one call; else None (then none is taken)."""
    items = value if isinstance(value, list) else [value]
    calls = [_as_call(item, fns, **keys) for item in items]
    return None if not calls or None in calls else calls  # type: ignore[return-value]


Reader = Callable[[re.Match[str], str], Got]


def _scan(text: str, opener: re.Pattern[str], read: Reader) -> Calls:
    """The calls each match of `opener` starts (read from the match: the calls and where they end),
    and the text outside them."""
    calls: list[Call] = []
    kept, at = [], 0
    for match in opener.finditer(text):
        if match.start() < at:
            continue
        got = read(match, text)
        if got is None:
            continue
        kept.append(text[at : match.start()])
        calls += got[0]
        at = got[1]
    if not calls:
        return [], text
    kept.append(text[at:])
    return calls, "".join(kept).strip()


def _json_reader(fns: Fns, close: str = "", **keys: Any) -> Reader:
    """A reader for a mark followed by JSON (one call's object, or a list of them), then `close`."""

    def read(match: re.Match[str], text: str) -> Got:
        got = _decode(text, match.end())
        if got is None:
            return None
        calls = _as_calls(got[0], fns, **keys)
        return None if calls is None else (calls, _past(text, got[1], close))

    return read


def _named_reader(fns: Fns, close: str) -> Reader:
    """A reader for a mark that names the function (its first group that matched), then the
    arguments' JSON object."""

    def read(match: re.Match[str], text: str) -> Got:
        name, got = next((g for g in match.groups() if g), "").strip(), _decode(text, match.end())
        if name not in fns or got is None:
            return None
        call = _call(name, got[0])
        return None if call is None else ([call], _past(text, got[1], close))

    return read


# -- the formats ---------------------------------------------------------------------------------------

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _generic(text: str, fns: Fns) -> Calls:
    """<tool_call> blocks, or an answer that is one JSON object: what runner always read."""
    calls = [c for c in (_as_call(_loads(block), fns) for block in TOOL_CALL.findall(text)) if c]
    if calls:
        return calls, TOOL_CALL.sub("", text).strip()
    stripped = text.strip()
    if stripped.startswith("{"):
        call = _as_call(_loads(stripped), fns)
        if call is not None:
            return [call], ""
    return [], text


_HERMES = re.compile(r'<tool_call>|<function=([^>\n]+)>|<function name="([^"\n]+)">')
_FUNCTION = re.compile(r"<function=([^>\n]+)>")


def _hermes(text: str, fns: Fns) -> Calls:
    """<tool_call>{...}</tool_call> (the last one may be left open), or <function=NAME>{...}</function>
    as llama.cpp's Hermes parser also takes."""
    tagged, named = _json_reader(fns, "</tool_call>"), _named_reader(fns, "</function>")
    return _scan(text, _HERMES, lambda m, t: (named if m.group(1) or m.group(2) else tagged)(m, t))


_CODER = re.compile(r"(?:<tool_call>\s*)?<function=([^>\n]+)>")
_PARAM = re.compile(r"\s*<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_CODER_END = re.compile(r"\s*</function>(?:\s*</tool_call>)?")


def _qwen3_coder(text: str, fns: Fns) -> Calls:
    """<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call> (the first
    <tool_call> may be missing): each value as its parameter's schema types it."""

    def read(match: re.Match[str], text: str) -> Got:
        name, at, args = match.group(1).strip(), match.end(), dict[str, Any]()
        while (param := _PARAM.match(text, at)) is not None:
            key = param.group(1).strip()
            args[key] = _typed(param.group(2), ((fns.get(name) or {}).get("parameters") or {}), key)
            at = param.end()
        end = _CODER_END.match(text, at)
        return ([{"name": name, "arguments": args}], end.end()) if name in fns and end else None

    return _scan(text, _CODER, read)


def _typed(value: str, params: Any, key: str) -> Any:
    """A parameter's text as the type `params` (the function's JSON Schema) gives `key`: a string
    stays one; anything else is read as JSON where it parses."""
    schema = (params.get("properties") or {}).get(key) if isinstance(params, dict) else None
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string" or (isinstance(kind, list) and "string" in kind):
        return value
    parsed = _loads(value)
    return value if parsed is None and value.strip() != "null" else parsed


_PYTHON_TAG = re.compile(r"<\|python_tag\|>")
_BUILTIN = re.compile(r"\s*([\w.]+)\.call\((.*)\)\s*$", re.DOTALL)
_SEMICOLON = re.compile(r"\s*;")


def _llama3(text: str, fns: Fns) -> Calls:
    """Calls as JSON objects {"name", "parameters"} from the start of the answer (parallel ones
    separated by white space or ";"), or after <|python_tag|>: NAME.call(KEY=VALUE, ...) for the
    builtin tools, JSON, or code for the "python" tool."""
    tagged = _scan(text, _PYTHON_TAG, _python_reader(fns))
    if tagged[0]:
        return tagged
    calls, at = [], 0
    while (got := _decode(text, at)) is not None and (call := _as_call(got[0], fns)) is not None:
        calls.append(call)
        at = got[1]
        semi = _SEMICOLON.match(text, at)
        at = semi.end() if semi else at
    return (calls, text[at:].strip()) if calls else ([], text)


def _python_reader(fns: Fns) -> Reader:
    return lambda match, text: _python_tag(text[match.end() :], fns, len(text))


def _python_tag(code: str, fns: Fns, end: int) -> Got:
    """What follows <|python_tag|> (to the answer's end) as one call."""
    got = _decode(code, 0)
    if got is not None and not code[got[1] :].strip():
        call = _as_call(got[0], fns)
        return ([call], end) if call is not None else None
    builtin = _BUILTIN.match(code)
    if builtin is not None and builtin.group(1) in fns:
        args = _keywords(builtin.group(2))
        return None if args is None else ([{"name": builtin.group(1), "arguments": args}], end)
    if "python" in fns and code.strip():
        return [{"name": "python", "arguments": {"code": code.strip()}}], end
    return None


def _keywords(source: str) -> dict[str, Any] | None:
    """KEY=VALUE, ... of a builtin call, each VALUE a Python literal (parsed, never run), or None."""
    try:
        tree = ast.parse(f"f({source})", mode="eval").body
        if not isinstance(tree, ast.Call) or tree.args:
            return None
        return {kw.arg: ast.literal_eval(kw.value) for kw in tree.keywords if kw.arg is not None}
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None


_MISTRAL = re.compile(r"\[TOOL_CALLS\]")
_MISTRAL_NAMED = re.compile(r"\s*([^\[\]{}\s]+)\s*(?:\[CALL_ID\]\s*([^\[\s]*)\s*)?\[ARGS\]")


def _mistral(text: str, fns: Fns) -> Calls:
    """[TOOL_CALLS] and a JSON list of calls (Mistral Nemo, ids of 9 characters), or [TOOL_CALLS]NAME
    [CALL_ID]ID[ARGS]{...} (Mistral Small 3.2, Devstral, Ministral; no [CALL_ID] in some), each call
    after its own [TOOL_CALLS] or after the one before."""

    def read(match: re.Match[str], text: str) -> Got:
        listed = _json_reader(fns)(match, text)
        if listed is not None:
            return listed
        calls, at = [], match.end()
        while (named := _MISTRAL_NAMED.match(text, at)) is not None:
            got = _decode(text, named.end())
            if named.group(1) not in fns or got is None:
                break
            call = _call(named.group(1), got[0], named.group(2))
            if call is None:
                break
            calls.append(call)
            at = got[1]
        return (calls, at) if calls else None

    calls, rest = _scan(text, _MISTRAL, read)
    if not calls and text.lstrip().startswith("["):  # [TOOL_CALLS] not rendered (no control token)
        listed = _json_reader(fns)(_SPACE.match(text), text)  # type: ignore[arg-type]
        if listed is not None:
            return listed[0], text[listed[1] :].strip()
    return calls, rest


_HARMONY = re.compile(
    r"(?:<\|start\|>\s*assistant)?\s*(?:to=functions\.(?P<role>[^\s<]+)\s*)?<\|channel\|>\s*\w+"
    r"\s*(?:to=functions\.(?P<chan>[^\s<]+))?\s*(?:<\|constrain\|>\s*\w*)?\s*<\|message\|>"
)


def _gpt_oss(text: str, fns: Fns) -> Calls:
    """A message to a functions.NAME recipient (named in its role's header or its channel's), its
    body the arguments' JSON, then <|call|> (runner.engine.text.reasoning.Splitter keeps these
    messages in the answer when the request has tools)."""
    return _scan(text, _HARMONY, _named_reader(fns, "<|call|>"))


_GRANITE_TAG = re.compile(r"<\|tool_call\|>")
_RESPONSE = re.compile(r"</?response>")


def _granite(text: str, fns: Fns) -> Calls:
    """<|tool_call|>[{...}] (Granite 3), <tool_call>{...}</tool_call> (Granite 4); <response> tags
    around the text dropped."""
    calls, rest = _scan(text, _GRANITE_TAG, _json_reader(fns))
    if not calls:
        calls, rest = _hermes(text, fns)
    return calls, _RESPONSE.sub("", rest) if calls else rest


_PHI = re.compile(r"<\|tool_call\|>|\bfunctools(?=\[)")


def _phi4(text: str, fns: Fns) -> Calls:
    """<|tool_call|>{...}<|/tool_call|> (one call an object, or a list), or functools[{...}, ...]."""
    return _scan(text, _PHI, _json_reader(fns, "<|/tool_call|>"))


_DEEPSEEK = re.compile(r"<｜tool▁calls▁begin｜>|<｜tool▁calls｜>")
_DEEPSEEK_CALL = re.compile(
    r"\s*(?:<｜tool▁call▁begin｜>)?\s*(?:function<｜tool▁sep｜>(?P<r1>[^\n<]+)\n\s*```(?:json)?"
    r"|(?P<v3>[^<\n]+?)<｜tool▁sep｜>)"
)
_DEEPSEEK_END = re.compile(r"\s*(?:```\s*)?<｜tool▁call▁end｜>")


def _deepseek(text: str, fns: Fns) -> Calls:
    """Each call between <｜tool▁call▁begin｜> and <｜tool▁call▁end｜> (R1: function<｜tool▁sep｜>NAME
    and the arguments in a ```json fence; V3.1: NAME<｜tool▁sep｜>{...}), inside <｜tool▁calls▁begin｜>."""

    def read(match: re.Match[str], text: str) -> Got:
        calls, at = [], match.end()
        while (head := _DEEPSEEK_CALL.match(text, at)) is not None:
            name = (head.group("r1") or head.group("v3") or "").strip()
            got = _decode(text, head.end())
            call = _call(name, got[0]) if got is not None and name in fns else None
            if call is None or got is None:
                break
            end = _DEEPSEEK_END.match(text, got[1])
            at = end.end() if end else got[1]
            calls.append(call)
        return (calls, _past(text, at, "<｜tool▁calls▁end｜>")) if calls else None

    return _scan(text, _DEEPSEEK, read)


_ACTION = re.compile(r"<\|START_ACTION\|>")
_COHERE_MARKS = re.compile(r"<\|(?:START|END)_(?:RESPONSE|THINKING|TEXT)\|>")


def _command_r7b(text: str, fns: Fns) -> Calls:
    """<|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}, ...]<|END_ACTION|>; the
    response's and thinking's marks dropped from the text around (their text kept, as without tools)."""
    read = _json_reader(fns, "<|END_ACTION|>", name="tool_name", args=("parameters",), ids="tool_call_id")
    calls, rest = _scan(text, _ACTION, read)
    plain = _COHERE_MARKS.sub("", rest)
    return calls, plain.strip() if calls or plain != rest else text


_RECIPIENT = re.compile(r"(?:^|>>>)([\w.-]+)\n")


def _functionary_v32(text: str, fns: Fns) -> Calls:
    """Messages each headed by its recipient (>>>NAME\\n; the template's generation prompt wrote the
    first >>>): "all" is text, a function's body its arguments' JSON ("python": its code)."""
    heads = list(_RECIPIENT.finditer(text))
    if not heads or heads[0].start() != 0:
        return [], text
    calls, kept = [], []
    for head, after in zip(heads, [*heads[1:], None], strict=True):
        body = text[head.end() : after.start() if after else len(text)]
        name = head.group(1)
        args = _loads(body.strip()) if name in fns else None
        if name == "all":
            kept.append(body)
        elif isinstance(args, dict):
            calls.append({"name": name, "arguments": args})
        elif name == "python" and name in fns and body.strip():
            calls.append({"name": name, "arguments": {"code": body.strip()}})
        else:
            kept.append(text[head.start() : after.start() if after else len(text)])
    if not calls and all(head.group(1) != "all" for head in heads):
        return [], text
    return calls, "".join(kept).strip()


def _functionary_v31(text: str, fns: Fns) -> Calls:
    """<function=NAME>{...}</function>, or <|python_tag|> and code for the "python" tool."""
    calls, rest = _scan(text, _FUNCTION, _named_reader(fns, "</function>"))
    if calls:
        return calls, rest
    return _scan(text, _PYTHON_TAG, _python_reader(fns))


_FENCED = re.compile(r"\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def _gemma(text: str, fns: Fns) -> Calls:
    """llama.cpp's generic JSON answer, Gemma's for want of its own: {"tool_call": {...}},
    {"tool_calls": [...], "content"} or {"response": "..."}, alone or in a ```json fence."""
    fenced = _FENCED.match(text)
    value = _loads(fenced.group(1) if fenced else text.strip())
    value = value if isinstance(value, dict) else {}
    calls = _as_calls(value.get("tool_calls", value.get("tool_call")), fns)
    if calls:
        return calls, value["content"] if isinstance(value.get("content"), str) else ""
    said = value.get("response") if set(value) == {"response"} else None
    return [], said if isinstance(said, str) else text


@dataclass(frozen=True)
class Format:
    """A family's way of writing calls: how its template is told, how its calls are read."""

    name: str
    marks: tuple[str, ...]  # all in a chat template's source: its model speaks this format
    parse: Callable[[str, Fns], Calls]
    markers: tuple[str, ...] = ()  # its marks that are control tokens (gpt-oss renders them all)


_DS = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
)
_TAGS, _PY, _ACT = (
    ("<tool_call>", "</tool_call>"),
    ("<|python_tag|>",),
    ("<|START_ACTION|>", "<|END_ACTION|>"),
)
# most specific first, in common/chat.cpp's order; generic, which needs no mark, last
TABLE: tuple[Format, ...] = (
    Format("gpt-oss", ("<|channel|>", "<|message|>"), _gpt_oss),
    Format("mistral", ("[TOOL_CALLS]",), _mistral, ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")),
    Format("deepseek", ("<｜tool▁calls▁begin｜>",), _deepseek, (*_DS, "<｜tool▁calls▁end｜>")),
    Format("command-r7b", ("<|START_ACTION|>",), _command_r7b, _ACT),
    Format("functionary-v3.2", (">>>all",), _functionary_v32),
    Format("firefunction", (" functools[",), _phi4),
    Format("granite", ("<|start_of_role|>",), _granite, (*_TAGS, "<|tool_call|>")),
    Format("phi-4-mini", ("<|tool|>", "<|/tool|>"), _phi4, ("<|tool_call|>", "<|/tool_call|>")),
    Format("functionary-v3.1", ("<|start_header_id|>", "<function="), _functionary_v31, _PY),
    Format("qwen3-coder", ("<tool_call>", "<function=", "<parameter="), _qwen3_coder, _TAGS),
    Format("hermes", ("<tool_call>",), _hermes, _TAGS),
    Format("llama3", ("<|start_header_id|>ipython<|end_header_id|>",), _llama3, _PY),
    Format("gemma", ("<start_of_turn>",), _gemma),
    Format(GENERIC, (), _generic),
)
FORMATS = {f.name: f for f in TABLE}
