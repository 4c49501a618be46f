"""The corpus of real schemas (tests/data/schemas/: Pydantic models from popular projects' docs, OpenAI's
and Anthropic's function-calling and structured-output examples, the conformance case), each with its
source and its expected result: enforced (SmolLM2's greedy answer finishes and validates against the
schema as given, formats included where jsonschema checks them) or refused (one line naming the
keyword and where, before any model loads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.engine.answer import FINISH_STOP
from runner.engine.prompt import render_prompt
from runner.engine.text.constrain import constraint, mismatch
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.template import Message
from runner.errors import InvalidSetting
from runner.gguf import read_header

CORPUS = Path(__file__).parent / "data" / "schemas"
ENTRIES = sorted(CORPUS.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    entry = json.loads(path.read_text())
    assert entry["expect"] in ("enforced", "refused") and entry["source"] and entry["prompt"], path.name
    return entry


@pytest.mark.fast
def test_the_corpus_has_what_the_issue_names() -> None:
    names = {p.stem for p in ENTRIES}
    assert {"conformance_ranges", "instructor_user", "instructor_nested"} <= names
    assert len([p for p in ENTRIES if load(p)["expect"] == "enforced"]) >= 20


@pytest.mark.model
@pytest.mark.parametrize("path", ENTRIES, ids=[p.stem for p in ENTRIES])
def test_each_schema_is_enforced_or_refused_as_expected(engine, smollm2_path: Path, path: Path) -> None:
    entry = load(path)
    text = json.dumps(entry["schema"])
    if entry["expect"] == "refused":
        with pytest.raises(InvalidSetting) as refused:
            constraint(schema=text)
        message = str(refused.value)
        assert entry["words"] in message and "\n" not in message, message
        return
    rule = constraint(schema=text)
    assert rule is not None and rule.guide is not None
    header = read_header(smollm2_path)
    prompt = render_prompt(engine, header, [Message("user", entry["prompt"])]).tokens
    result = engine.generate(
        prompt, SamplingConfig(temperature=0), max_tokens=entry.get("max_tokens", 300), guide=rule.guide
    )
    assert result.error is None, result.error  # the mask never left the model without a token
    if entry.get("greedy", "").startswith("runs on"):  # recursion and open arrays: a small model's loop
        assert result.finish_reason == "length", result.text  # said, not hidden: the CLI exits 1
        return
    assert result.finish_reason == FINISH_STOP, result.text  # it closed within the bounds
    assert mismatch(json.loads(result.text), entry["schema"]) is None, result.text
