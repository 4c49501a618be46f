"""Output a script can rely on: --format json, --schema, --grammar.

Every token is one the constraint allows: the answer is the JSON and nothing else, and it ends where
the JSON ends. A JSON Schema (--schema, a server's json_schema, a forced tool call) is enforced by
llguidance (runner.engine.guide), and so is --format json (a schema for any object): jsonschema
checks a schema is valid, llguidance compiles it and names any keyword it cannot enforce, both before
any model loads; during sampling its mask removes every token the schema cannot take next. --grammar
(GBNF) runs llama.cpp's own grammar sampler in the engine's native sampler chain
(llama_sampler_init_grammar). Where a schema leaves them open, strings, members, items and nesting
are bounded, so that a small model's loop ends where a bound does (MAX_CHARS and the rest, below).
What the constraint cannot guarantee is said, not hidden: an answer cut by --max-tokens or the
context before its JSON closed is an error, and so is one that does not validate.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.engine.text.schemawalk import DATA, MAPS, subschemas
from runner.engine.text.unique import enforce_unique
from runner.errors import InvalidSetting, RunnerError

FORMATS = ("json",)
CUT_SHORT = "before its JSON closed"  # how Constraint.problem ends for an answer that stopped mid-JSON


class ConstraintError(RunnerError):
    """The answer is not what --format/--schema asked for (cut short, or not valid): exit 1."""


@dataclass(frozen=True)
class Constraint:
    kind: str  # "json", "schema" or "grammar"
    grammar: str | None  # GBNF, root rule "root", for llama.cpp's grammar sampler ("json", "grammar")
    schema: dict[str, Any] | None = None
    guide: str | None = None  # the schema's llguidance grammar (runner.engine.guide), for "schema"

    @property
    def is_json(self) -> bool:
        return self.kind in ("json", "schema")

    def problem(self, text: str, finish_reason: str) -> str | None:
        """How a finished answer fails this shape (not JSON, cut short, not an object, not the schema's),
        None where it holds: a grammar's answers hold by construction. runner.engine.request.finish
        asks it once for every door."""
        if not self.is_json:
            return None
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            if finish_reason != "stop":
                return f"the answer ended ({finish_reason}) {CUT_SHORT}"
            return f"the answer is not JSON ({exc})"
        if self.schema is None:  # json: any object, as its grammar allows and json_object asks
            return None if isinstance(value, dict) else "the answer is not a JSON object"
        problem = mismatch(value, self.schema)
        return f"the answer does not match the schema {problem}" if problem else None


def mismatch(value: Any, schema: dict[str, Any]) -> str | None:
    """Where and how a parsed answer fails the schema as given ("at PATH: MESSAGE"), None when it
    validates. Formats are checked where jsonschema has a checker (uuid, email, ipv4, ...): a format
    llguidance does not enforce (idn-email, regex) is caught here rather than passed on."""
    import jsonschema

    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    checker = validator.FORMAT_CHECKER
    errors = sorted(validator(schema, format_checker=checker).iter_errors(value), key=str)
    if not errors:
        return None
    where = "/".join(str(p) for p in errors[0].absolute_path) or "the top level"
    return f"at {where}: {errors[0].message}"


def constraint(
    *, schema: str | None = None, format: str | None = None, grammar: str | None = None
) -> Constraint | None:
    """The constraint the flags ask for, checked; InvalidSetting (exit 2) for anything wrong with them."""
    given = [name for name, v in (("--schema", schema), ("--format", format), ("--grammar", grammar)) if v]
    if len(given) > 1:
        raise InvalidSetting(f"{' and '.join(given)} do not go together: choose one")
    if format is not None:
        if format.strip().lower() not in FORMATS:
            raise InvalidSetting(f"--format must be json (got {format!r})")
        return json_shape()
    if schema is not None:
        return schema_shape(_load_schema(schema))
    if grammar is not None:
        path = Path(grammar)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise InvalidSetting(f"--grammar: cannot read {grammar}: {reason}") from None
        if "root" not in text:
            raise InvalidSetting(f"--grammar: {grammar} has no rule named root")
        return Constraint("grammar", text)
    return None


# --format json: any JSON object, within bounds a small model cannot loop in without end. llama.cpp's
# json.gbnf bounds whitespace only. Sampled at the default temperature, SmolLM2-135M still ran past
# 300 tokens in 13 of 120 answers (3 prompts x 40 seeds), each in a loop that grammar allows: one
# phrase again and again inside a string, the same member again and again, objects nested in objects.
# With these bounds: 3 of 120. A schema's strings, arrays and open objects get the same bounds where it
# sets none (61 of 120 answers to an open schema ran on; 15). They are applied to the schema
# (_bounded) before llguidance compiles it; whitespace is bounded by JSON_OPTIONS.
MAX_DEPTH = 4  # objects and arrays inside one another, the answer's own object counted
MAX_MEMBERS = 16  # members of one object, items of one array
MAX_CHARS = 200  # characters in one string, keys included


def json_shape() -> Constraint:
    """Any JSON object (--format json, a server's json_object), within the bounds below."""
    return Constraint("json", None, None, json_guide())


def schema_shape(schema: dict[str, Any]) -> Constraint:
    """An answer that matches `schema` (checked_schema'd): its grammar compiled once and kept by text."""
    return Constraint("schema", None, schema, schema_guide_of(json.dumps(schema)))


def json_guide() -> str:
    """--format json, a server's json_object: llguidance's grammar for any JSON object within the bounds."""
    return schema_guide_of('{"type": "object"}')


def _load_schema(value: str) -> dict[str, Any]:
    """--schema: inline JSON (it starts with `{`), else a path to a JSON file."""
    text = value
    if not value.lstrip().startswith("{"):
        try:
            text = Path(value).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise InvalidSetting(
                f"--schema: cannot read {value}: {reason} (inline JSON starts with {{)"
            ) from None
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSetting(f"--schema is not JSON: {exc}") from None
    except RecursionError:  # Python's parser recurses: thousands of levels end here
        raise InvalidSetting(f"--schema is nested deeper than {MAX_SCHEMA_DEPTH} levels") from None
    return checked_schema(parsed)


MAX_SCHEMA_DEPTH = 64  # JSON levels in a schema, as in a server's request body (serve/shared/body.py)


def _too_deep(value: Any) -> bool:
    """Whether a parsed value nests objects and arrays deeper than MAX_SCHEMA_DEPTH, found without
    recursion: jsonschema's check, the bounds and llguidance all recurse into a schema."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def checked_schema(parsed: Any, where: str = "--schema") -> dict[str, Any]:
    """A schema given as a value (a server's request): a JSON object that is a valid JSON Schema."""
    if not isinstance(parsed, dict):
        problem = "must be a JSON object (a JSON Schema)"
        raise InvalidSetting(f"{where} {problem}", field="schema", problem=problem)
    if _too_deep(parsed):
        problem = f"is nested deeper than {MAX_SCHEMA_DEPTH} levels"
        raise InvalidSetting(f"{where} {problem}", field="schema", problem=problem)
    import jsonschema

    try:
        jsonschema.validators.validator_for(parsed).check_schema(parsed)
    except jsonschema.SchemaError as exc:
        problem = f"is not a valid JSON Schema: {exc.message}"
        raise InvalidSetting(f"{where} {problem}", field="schema", problem=problem) from None
    return parsed


def _schema_error(problem: str) -> InvalidSetting:
    """What is wrong with a schema, as --schema says it (and, by field and problem, a server)."""
    return InvalidSetting(f"--schema: {problem}", field="schema", problem=problem)


# How llguidance writes JSON: one layout, Python's json.dumps's (`{"a": 1, "b": [2, 3]}`), no other
# whitespace. llama.cpp's json.gbnf bounds each run of whitespace (none, a space, or a line break and
# up to 20 spaces or tabs) but allows one between every two tokens, and SmolLM2 sampled took them:
# `"shape"\n:\n{\n"kind"\n:\n"square"`, a third of an answer's tokens spent on line breaks
# (docs/pipelines.md). A fixed layout leaves the model no whitespace to choose: fewer tokens, one
# line a script and a person read alike, and no run a small model could fill without end.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _ref_loop(schema: dict[str, Any], ref: str) -> bool:
    """Whether a local $ref reaches, through schemas that are only another $ref, one it passed already
    (`{"$ref": "#"}`): llguidance compiles it to a grammar of no value, and a validator recurses
    without end."""
    seen: set[str] = set()
    while ref not in seen:
        seen.add(ref)
        target = _target(schema, ref)
        if target is None:
            return False  # not found: llguidance says so
        if not (
            isinstance(target, dict)
            and set(target)
            <= {"$ref", "$defs", "definitions", "$schema", "$id", "title", "description", "$comment"}
        ):
            return False
        next_ref = target.get("$ref")
        if not isinstance(next_ref, str) or not next_ref.startswith("#"):
            return False
        ref = next_ref
    return True


def _target(schema: dict[str, Any], ref: str) -> Any:
    """What a local $ref ("#/$defs/node") points at in the schema; None where nothing is."""
    target: Any = schema
    for part in ref.removeprefix("#").split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return None
    return target


MAX_NESTING = 4  # a recursive $ref taken this many times inside itself, then only its way out
UNROLLED_MAX = 4  # an unrolled schema at most this many times its own size, else left recursive


def _local_refs(node: Any) -> set[str]:
    return {
        sub["$ref"]
        for _, sub in subschemas(node)
        if isinstance(sub.get("$ref"), str) and sub["$ref"].startswith("#")
    }


def _recursive_refs(schema: dict[str, Any]) -> set[str]:
    """The local $refs whose target reaches the same $ref again."""
    inside: dict[str, set[str]] = {}
    todo = list(_local_refs(schema))
    while todo:
        ref = todo.pop()
        if ref not in inside:
            inside[ref] = _local_refs(_target(schema, ref))
            todo.extend(inside[ref])
    looping = set()
    for start, first in inside.items():
        seen, stack = set(), list(first)
        while stack and start not in seen:
            ref = stack.pop()
            if ref not in seen:
                seen.add(ref)
                stack.extend(inside.get(ref, ()))
        if start in seen:
            looping.add(start)
    return looping


def _unrolled(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with each recursive local $ref written out MAX_NESTING deep, and past that a schema
    no value matches (false), so that only the recursion's own way out is left (a null `next`, an
    empty `children`). A linked list SmolLM2 extended node after node until --max-tokens closes at
    the fourth. Left recursive where the copies would grow past UNROLLED_MAX times the schema."""
    looping = _recursive_refs(schema)
    if not looping:
        return schema
    budget = [UNROLLED_MAX * len(json.dumps(schema)) + 65536]  # characters of schema written out

    def walk(node: Any, depth: dict[str, int]) -> Any:
        budget[0] -= len(node) if isinstance(node, (dict, list, str)) else 1
        if budget[0] < 0:
            raise OverflowError  # a schema that would grow too large written out: left recursive
        if isinstance(node, list):
            return [walk(item, depth) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref in looping:
            if depth.get(ref, 0) >= MAX_NESTING:
                return False
            target = {k: v for k, v in _target(schema, ref).items() if k not in ("$defs", "definitions")}
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return walk({"allOf": [target, rest]} if rest else target, {**depth, ref: depth.get(ref, 0) + 1})
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in DATA:
                out[key] = value
            elif key in MAPS and isinstance(value, dict):
                out[key] = {name: walk(sub, depth) for name, sub in value.items()}
            else:
                out[key] = walk(value, depth)
        return out

    try:
        return dict(walk(schema, {"#": 1}))
    except OverflowError:
        return schema


def _where(path: str) -> str:
    return path.lstrip("/") or "the top level"


def schema_guide(schema: dict[str, Any]) -> str:
    """The llguidance grammar that enforces `schema` (runner.engine.guide), compiled and checked here,
    before any model loads; InvalidSetting naming the keyword and where, for what it cannot enforce.
    A remote $ref is never fetched. A `format` llguidance does not know is an annotation, as JSON
    Schema has it (the answer is checked against the schema as given): left out of the grammar."""
    from llguidance import LLMatcher

    for path, sub in subschemas(schema):
        ref = sub.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            problem = f"$ref {ref!r} (at {_where(path)}) is not in the schema: runner never fetches one"
            raise _schema_error(problem)
        if isinstance(ref, str) and _ref_loop(schema, ref):
            problem = f"$ref {ref!r} (at {_where(path)}) leads only to itself: it describes no value"
            raise _schema_error(problem)
    bounded, options = _bounded(_unrolled(schema)), dict(JSON_OPTIONS)
    unheld = enforce_unique(bounded, lambda ref: _target(bounded, ref))
    if unheld is not None:
        raise _schema_error(unheld)
    for _ in range(64):  # each unknown format found, left out, and the schema compiled again
        try:
            grammar = LLMatcher.grammar_from_json_schema(bounded, defaults=options)  # type: ignore[arg-type]
        except ValueError as exc:
            raise _schema_error(f"cannot be enforced ({exc})") from None
        failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
        if not failed:
            return grammar
        message = " ".join((messages[0] if messages else "no reason given").split())  # one line
        if message.startswith("Unknown format: "):
            name = message.removeprefix("Unknown format: ")
            if _drop_format(bounded, name):
                continue
        if "coerce_one_of" in message and not options.get("coerce_one_of"):
            # a oneOf whose branches llguidance cannot tell apart: sampled as anyOf (one branch or
            # more), the answer then checked against oneOf (exactly one), like every answer
            options["coerce_one_of"] = True
            continue
        raise _schema_error(_problem(schema, message))
    raise _schema_error("cannot be enforced (too many unknown formats)")


@functools.lru_cache(maxsize=256)
def schema_guide_of(text: str) -> str:
    """schema_guide for a schema as JSON text, kept by its text: a server's clients send the same
    schema again and again. The schema is checked to be valid JSON Schema first (checked_schema)."""
    return schema_guide(json.loads(text))


def _problem(schema: dict[str, Any], message: str) -> str:
    """llguidance's reason, worded for the user: the first place an unimplemented keyword is."""
    if message.startswith("Unimplemented keys: "):
        try:
            keys = set(json.loads(message.removeprefix("Unimplemented keys: ")))
        except ValueError:
            keys = set()
        for path, sub in subschemas(schema):
            found = [k for k in sub if k in keys]
            if found:
                return (
                    f"runner's constraint engine (llguidance) cannot enforce {found[0]} (at {_where(path)}); "
                    "remove it, or ask for any JSON object and check the answer yourself"
                )
    return f"cannot be enforced: {message}"


def _drop_format(schema: Any, name: str) -> bool:
    """Every `format: name` left out of the (bounded copy of the) schema; whether there was one."""
    dropped = False
    for _, sub in list(subschemas(schema)):
        if sub.get("format") == name:
            del sub["format"]
            dropped = True
    return dropped


def _bounded(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of the schema with MAX_CHARS on each string, MAX_MEMBERS on each array and each open
    object it leaves unbounded, so a small model's loop ends where a bound does (the answer is still
    checked against the schema as given). A string with an enum or const is left be; one with a format or
    a pattern is bounded too (a uri or `^a+$` runs on as far as a free string does).
    An object with `properties` and no `additionalProperties` takes no others, as llama.cpp's own
    converter has it (llama-server's json_schema), except inside allOf, whose parts add up; a value
    left free (an open object's members, an array's items) is any JSON within the same bounds."""
    out: dict[str, Any] = copy.deepcopy(schema)
    for path, sub in list(subschemas(out)):
        types = sub.get("type")
        types = set(types) if isinstance(types, list) else {types}
        fixed = any(k in sub for k in ("enum", "const"))  # a format or a pattern may still run on
        if "string" in types and "maxLength" not in sub and not fixed:
            sub["maxLength"] = max(MAX_CHARS, _int(sub.get("minLength")))
        if ("array" in types or "items" in sub) and "maxItems" not in sub and "prefixItems" not in sub:
            sub["maxItems"] = max(MAX_MEMBERS, _int(sub.get("minItems")))
        if "array" in types and sub.get("items", True) is True and "prefixItems" not in sub:
            sub["items"] = any_json(MAX_DEPTH - 1)
        named = sub.get("properties") if isinstance(sub.get("properties"), dict) else {}
        required = sub.get("required") if isinstance(sub.get("required"), list) else []
        in_all_of = path.rpartition("/")[0].endswith("/allOf")
        if named and "additionalProperties" not in sub and not in_all_of:
            sub["additionalProperties"] = False
        others = sub.get("additionalProperties", True)
        open_object = "object" in types and not named and "patternProperties" not in sub
        if open_object and others is not False and not in_all_of:
            # any key within MAX_CHARS (llguidance bounds keys as patternProperties), with the value
            # the schema allows, or any
            sub["patternProperties"] = {_key(): any_json(MAX_DEPTH - 1) if others is True else others}
            sub["additionalProperties"] = False
        if (
            "object" in types
            and "maxProperties" not in sub
            and (sub.get("additionalProperties") is not False or "patternProperties" in sub)
            and set(named) <= set(required)  # llguidance bounds members only where every named is required
        ):
            sub["maxProperties"] = max(MAX_MEMBERS, len(named), _int(sub.get("minProperties")))
    return out


def any_json(depth: int) -> dict[str, Any]:
    """Any JSON value within the bounds: strings of MAX_CHARS, MAX_MEMBERS members or items, `depth`
    objects and arrays deep."""
    scalars: list[dict[str, Any]] = [
        {"type": "string", "maxLength": MAX_CHARS},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "null"},
    ]
    if depth <= 0:
        return {"anyOf": scalars}
    inner = any_json(depth - 1)
    return {
        "anyOf": [
            *scalars,
            {"type": "array", "items": inner, "maxItems": MAX_MEMBERS},
            {
                "type": "object",
                "patternProperties": {_key(): inner},
                "additionalProperties": False,
                "maxProperties": MAX_MEMBERS,
            },
        ]
    }


def _key() -> str:
    """The pattern of an open object's keys: at most MAX_CHARS characters."""
    return f"^.{{0,{MAX_CHARS}}}$"


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
