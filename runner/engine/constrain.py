"""Output a script can rely on: --format json, --schema, --grammar as a GBNF grammar for llama.cpp.

The grammar sampler runs in the engine's native sampler chain (llama_sampler_init_grammar), so every
token is one the grammar allows: the answer is the JSON and nothing else, and it ends where the JSON
ends. A schema becomes GBNF with llama-cpp-python's converter (llama_cpp.llama_grammar, the port of
llama.cpp's json-schema-to-grammar), after jsonschema has checked it is a valid schema; both happen
before any model loads. Where neither bounds them, strings, members, items and (--format json)
nesting are bounded, so that a small model's loop ends where a bound does (MAX_CHARS and the rest,
below). What the grammar cannot guarantee is said, not hidden: an answer cut by --max-tokens or the
context before its JSON closed is an error, and so is one that does not validate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.errors import InvalidSetting, RunnerError

FORMATS = ("json",)


class ConstraintError(RunnerError):
    """The answer is not what --format/--schema asked for (cut short, or not valid): exit 1."""


@dataclass(frozen=True)
class Constraint:
    kind: str  # "json", "schema" or "grammar"
    grammar: str  # GBNF, root rule "root"
    schema: dict[str, Any] | None = None

    @property
    def is_json(self) -> bool:
        return self.kind in ("json", "schema")

    def check(self, text: str, finish_reason: str) -> str:
        """The answer as it goes to stdout: the JSON, trimmed; ConstraintError when it is not whole."""
        answer = text.strip()
        if not self.is_json:
            return answer
        try:
            value = json.loads(answer)
        except json.JSONDecodeError as exc:
            if finish_reason != "stop":
                raise ConstraintError(
                    f"the answer ended ({finish_reason}) before its JSON closed; "
                    "raise --max-tokens (or --ctx) for a longer answer"
                ) from None
            raise ConstraintError(f"the answer is not JSON ({exc})") from None
        if self.schema is not None:
            import jsonschema

            errors = sorted(jsonschema.Draft202012Validator(self.schema).iter_errors(value), key=str)
            if errors:
                where = "/".join(str(p) for p in errors[0].absolute_path) or "the top level"
                raise ConstraintError(f"the answer does not match the schema at {where}: {errors[0].message}")
        return answer


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
        return Constraint("json", json_grammar())
    if schema is not None:
        parsed = _load_schema(schema)
        return Constraint("schema", schema_grammar(parsed), parsed)
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
# json.gbnf bounds whitespace only (`ws ::= | " " | "\n" [ \t]{0,20}`, kept here). Sampled at the
# default temperature, SmolLM2-135M still ran past 300 tokens in 13 of 120 answers (3 prompts x 40
# seeds), each in a loop that grammar allows: one phrase again and again inside a string, the same
# member again and again, objects nested in objects. With these bounds: 3 of 120. A schema's strings
# and arrays get the same bounds where it sets none (61 of 120 answers to an open schema ran on; 15).
MAX_DEPTH = 4  # objects and arrays inside one another, the answer's own object counted
MAX_MEMBERS = 16  # members of one object, items of one array
MAX_CHARS = 200  # characters in one string, keys included
JSON_SCALARS = r"""
scalar ::= string | number | ("true" | "false" | "null") ws
string ::= "\"" char{0,%d} "\"" ws
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
number ::= "-"? ([0-9] | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,16})? ws
ws ::= | " " | "\n" [ \t]{0,20}
"""


def json_grammar(depth: int = MAX_DEPTH, members: int = MAX_MEMBERS, chars: int = MAX_CHARS) -> str:
    """GBNF for one JSON object: json.gbnf's rules, with every repetition a loop could fill bounded."""
    more = f"{{0,{members - 1}}}"  # after the first
    rules = ["root ::= object1"]
    for level in range(1, depth + 1):
        inner = f"value{level + 1}" if level < depth else "scalar"
        rules.append(
            f'object{level} ::= "{{" ws (string ":" ws {inner} ("," ws string ":" ws {inner}){more})? "}}" ws'
        )
        if level > 1:
            rules.append(f'array{level} ::= "[" ws ({inner} ("," ws {inner}){more})? "]" ws')
            rules.append(f"value{level} ::= object{level} | array{level} | scalar")
    return "\n".join(rules) + JSON_SCALARS % chars


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
    return checked_schema(parsed)


def checked_schema(parsed: Any, where: str = "--schema") -> dict[str, Any]:
    """A schema given as a value (a server's request): a JSON object that is a valid JSON Schema."""
    if not isinstance(parsed, dict):
        problem = "must be a JSON object (a JSON Schema)"
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


# JSON Schema assertions llama-cpp-python's converter ignores: a grammar from such a schema would let
# answers through that break it, so they are refused rather than half kept.
UNSUPPORTED = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minProperties",
        "maxProperties",
        "uniqueItems",
        "not",
        "if",
        "then",
        "else",
        "patternProperties",
        "propertyNames",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "contains",
        "minContains",
        "maxContains",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)


def _unsupported(schema: Any, where: str = "") -> tuple[str, str] | None:
    """The first assertion the grammar cannot enforce, and where: (keyword, path), or None."""
    if not isinstance(schema, dict):
        return None
    for key in schema:
        if key in UNSUPPORTED:
            return key, where or "the top level"
    subs: list[tuple[str, Any]] = []
    for key in ("properties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            subs += [(f"{where}/{key}/{k}", v) for k, v in schema[key].items()]
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            subs.append((f"{where}/{key}", schema[key]))
    for key in ("items", "prefixItems", "anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            subs += [(f"{where}/{key}/{i}", v) for i, v in enumerate(schema[key])]
    for path, sub in subs:
        found = _unsupported(sub, path.lstrip("/"))
        if found:
            return found
    return None


def schema_grammar(schema: dict[str, Any]) -> str:
    """GBNF for a schema, by llama-cpp-python's converter; InvalidSetting where it cannot express it."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    found = _unsupported(schema)
    if found is not None:
        raise _schema_error(
            f"llama.cpp's grammar cannot enforce {found[0]} (at {found[1]}); "
            "remove it, or use --format json and check the answer yourself"
        )
    try:
        grammar = json_schema_to_gbnf(json.dumps(_bounded(schema)))
    except Exception as exc:  # the converter raises plain exceptions (ValueError, KeyError, ...)
        raise _schema_error(f"llama.cpp's grammar cannot express it ({exc})") from None
    if not grammar.strip():
        raise _schema_error("llama.cpp's grammar cannot express it (empty grammar)")
    return "\n".join(_bounded_rule(line) for line in str(grammar).splitlines()) + "\n"


def _bounded(schema: Any) -> Any:
    """The schema with MAX_CHARS on each string and MAX_MEMBERS on each array it leaves open: the
    converter then bounds them (the answer is still checked against the schema as given)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in ("properties", "$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {name: _bounded(sub) for name, sub in out[key].items()}
    for key in ("items", "additionalProperties", "prefixItems", "anyOf", "oneOf", "allOf"):
        if isinstance(out.get(key), list):
            out[key] = [_bounded(sub) for sub in out[key]]
        elif key in out:
            out[key] = _bounded(out[key])
    if out.get("type") == "string" and "maxLength" not in out:
        out["maxLength"] = max(MAX_CHARS, out.get("minLength", 0))
    if out.get("type", "array") == "array" and isinstance(out.get("items"), dict) and "maxItems" not in out:
        out["maxItems"] = max(MAX_MEMBERS, out.get("minItems", 0))
    return out


def _bounded_rule(line: str) -> str:
    """One rule of the converter's, as runner uses it. Its char admits raw control characters, which
    JSON forbids (llama.cpp's own C++ converter excludes them, as its json.gbnf does); its rules for
    any string, object or array (where a schema leaves a part free) repeat without bound: bounded
    here as --format json's are, though not their nesting."""
    if line.startswith(LOOSE_CHAR):
        return STRICT_CHAR + line[len(LOOSE_CHAR) :]
    if line == LOOSE_STRING:
        return LOOSE_STRING.replace("char*", f"char{{0,{MAX_CHARS}}}")
    name = line.partition(" ::= ")[0]
    if name in ("object", "array") or name.endswith("additional-kvs"):
        return line.replace(")*", f"){{0,{MAX_MEMBERS - 1}}}")
    return line


LOOSE_CHAR = r'char ::= [^"\\] |'
STRICT_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] |'
LOOSE_STRING = r'string ::= "\"" char* "\"" space'
