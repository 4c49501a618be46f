"""Every schema inside a JSON Schema, walked in place: what the constraint engine (bounds, checks,
recursion) and a forced tool call's schema (its $refs moved) both read a schema with."""

from __future__ import annotations

from typing import Any

MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema
DATA = ("enum", "const", "default", "examples", "required", "dependentRequired", "$comment")  # not schemas


def subschemas(schema: Any, where: str = "") -> Any:
    """(path, schema) for the schema and every schema inside it, in document order."""
    if not isinstance(schema, dict):
        return
    yield where, schema
    for key, value in schema.items():
        if key in DATA:
            continue
        if key in MAPS and isinstance(value, dict):
            for name, sub in value.items():
                yield from subschemas(sub, f"{where}/{key}/{name}")
        elif isinstance(value, dict):
            yield from subschemas(value, f"{where}/{key}")
        elif isinstance(value, list):
            for i, sub in enumerate(value):
                yield from subschemas(sub, f"{where}/{key}/{i}")
