"""Constrained output with the real model: JSON that always parses, a schema it always matches."""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import pytest

from runner.engine.answer import FINISH_STOP
from runner.engine.constrain import ConstraintError, constraint
from runner.engine.sampling import SamplingConfig
from runner.engine.template import Message
from runner.errors import InvalidSetting
from tests.conftest import run_cli

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "role": {"enum": ["engineer", "teacher", "artist", "other"]},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "languages", "employed"],
    "additionalProperties": False,
}
PROMPTS = [
    "Describe a software engineer.",
    "Tell me about your grandmother.",
    "Who wrote Hamlet?",
    "Write a poem about the sea.",  # nothing to do with a person: the grammar still holds
    "What is 2+2?",
    "Invent a character for a novel set in Paris.",
]


def tokens_for(engine, smollm2_path: Path, text: str) -> list[int]:
    from runner.engine.prompt import render_prompt
    from runner.gguf import read_header

    return render_prompt(engine, read_header(smollm2_path), [Message("user", text)]).tokens


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_schema_answers_always_parse_and_validate(engine, smollm2_path: Path, seed: int) -> None:
    rule = constraint(schema=json.dumps(PERSON))
    assert rule is not None
    sampling = SamplingConfig(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=seed)  # wide open
    for prompt in PROMPTS:
        result = engine.generate(
            tokens_for(engine, smollm2_path, prompt), sampling, max_tokens=200, grammar=rule.grammar
        )
        assert result.finish_reason == FINISH_STOP, (prompt, result.text)  # it closed, and said so
        value = json.loads(rule.check(result.text, result.finish_reason))
        jsonschema.validate(value, PERSON)


def test_without_the_grammar_the_same_prompts_are_not_json(engine, smollm2_path: Path) -> None:
    # the test above would pass vacuously if the model answered JSON anyway
    sampling = SamplingConfig(temperature=0)
    texts = [
        engine.generate(tokens_for(engine, smollm2_path, p), sampling, max_tokens=40).text for p in PROMPTS
    ]
    parsed = 0
    for text in texts:
        try:
            json.loads(text)
            parsed += 1
        except json.JSONDecodeError:
            pass
    assert parsed == 0, texts


def test_format_json_prints_one_object_and_nothing_else(smollm2_path: Path) -> None:
    done = run_cli(
        "run", str(smollm2_path), "Describe a cat.", "--format", "json", "--seed", "3", "--max-tokens", "300"
    )
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), dict)
    assert done.stdout.decode().startswith("{") and done.stdout.decode().endswith("}\n")  # no fences
    as_json = run_cli(
        "run", str(smollm2_path), "A cat.", "--format", "json", "--json", "--seed", "3", "--max-tokens", "300"
    )
    assert as_json.returncode == 0, as_json.stderr
    assert isinstance(json.loads(json.loads(as_json.stdout)["text"]), dict)


def test_a_gbnf_grammar_file(smollm2_path: Path, tmp_path: Path) -> None:
    grammar = tmp_path / "yesno.gbnf"
    grammar.write_text('root ::= ("yes" | "no")\n')
    done = run_cli("run", str(smollm2_path), "Is the sky blue?", "--grammar", str(grammar))
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() in ("yes\n", "no\n")


def test_an_answer_cut_before_its_json_closes_is_an_error_and_prints_nothing(smollm2_path: Path) -> None:
    story = '{"type":"object","properties":{"story":{"type":"string","minLength":40}},"required":["story"]}'
    done = run_cli("run", str(smollm2_path), "Tell a story.", "--schema", story, "--max-tokens", "5")
    assert (done.returncode, done.stdout) == (1, b"")
    assert (
        done.stderr.decode()
        .strip()
        .endswith("before its JSON closed; raise --max-tokens (or --ctx) for a longer answer")
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--schema", '{"type": "nope"}'], "--schema is not a valid JSON Schema"),
        (["--schema", "{not json"], "--schema is not JSON"),
        (["--schema", "/no/such/schema.json"], "--schema: cannot read /no/such/schema.json"),
        (["--schema", '{"$ref": "https://example.com/s.json"}'], "llama.cpp's grammar cannot express it"),
        (["--schema", '{"type": "string", "pattern": "^(?=a)b$"}'], "llama.cpp's grammar cannot express it"),
        (
            ["--schema", '{"properties": {"age": {"type": "integer", "maximum": 120}}}'],
            "cannot enforce maximum (at properties/age)",
        ),
        (["--format", "yaml"], "--format must be json"),
        (["--format", "json", "--schema", "{}"], "do not go together"),
        (["--grammar", "/no/such.gbnf"], "--grammar: cannot read /no/such.gbnf"),
    ],
)
def test_bad_constraints_are_one_line_and_exit_2_before_the_model_loads(args: list[str], words: str) -> None:
    start = time.perf_counter()
    done = run_cli("run", "/no/such/model.gguf", "Hi", *args)  # a model that would fail later
    assert done.returncode == 2, done.stderr
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines
    assert time.perf_counter() - start < 10


def test_a_grammar_llama_cpp_cannot_parse_is_exit_2(smollm2_path: Path, tmp_path: Path) -> None:
    grammar = tmp_path / "bad.gbnf"
    grammar.write_text('root ::= "unclosed\n')
    done = run_cli("run", str(smollm2_path), "Hi", "--grammar", str(grammar))
    assert done.returncode == 2
    assert "llama.cpp cannot parse the grammar" in done.stderr.decode()


def test_strings_in_a_schema_grammar_exclude_control_characters() -> None:
    from runner.engine.constrain import LOOSE_CHAR, STRICT_CHAR

    rule = constraint(schema=json.dumps(PERSON))
    assert rule is not None and STRICT_CHAR in rule.grammar and LOOSE_CHAR not in rule.grammar


def test_check_says_where_an_answer_breaks_the_schema() -> None:
    rule = constraint(schema=json.dumps(PERSON))
    assert rule is not None
    with pytest.raises(ConstraintError, match="at role"):
        rule.check('{"name": "A", "age": 5, "role": "king", "languages": [], "employed": true}', FINISH_STOP)
    with pytest.raises(InvalidSetting):
        constraint(format="xml")
