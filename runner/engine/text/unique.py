"""`uniqueItems` (what Pydantic writes for every `set[...]` field) held where a token mask can hold it.

A mask decides each token from what came before; it cannot remember every item to refuse a repeat of
any one. It can where the items are a few fixed values (an enum, a const, booleans): the array is then
one of the subsets of those values, each written in the values' own order (a set has none, so one order
loses no answer), at most 2^MAX_SET_VALUES of them. Any other uniqueItems is refused before a model
loads, with the way around it (a list, de-duplicated by the caller). Called on constrain.py's bounded
copy of a schema, never on the schema as given, against which every answer is still checked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runner.engine.text.schemawalk import subschemas

MAX_SET_VALUES = 8  # an enum's values a set may take: 256 subsets at most (llguidance compiles it in ~10 ms)
WORKAROUND = (
    "for a Pydantic set[...] field, declare it list[...] and de-duplicate the answer, or remove uniqueItems"
)


def enforce_unique(schema: dict[str, Any], resolve: Callable[[str], Any]) -> str | None:
    """Each `uniqueItems` of the schema rewritten in place as the subsets of its items' values; the
    problem (with where) for the first one that cannot be, None when every one is held. `resolve`:
    what a local $ref points at."""
    for path, sub in list(subschemas(schema)):
        if "uniqueItems" not in sub:
            continue
        if sub["uniqueItems"] is not True:  # false asks nothing
            del sub["uniqueItems"]
            continue
        where = path.lstrip("/") or "the top level"
        values = _values(sub.get("items"), resolve)
        if values is None or len(values) > MAX_SET_VALUES or "anyOf" in sub or "prefixItems" in sub:
            return (
                f"runner's constraint engine (llguidance) cannot enforce uniqueItems (at {where}) "
                f"on items other than at most {MAX_SET_VALUES} fixed values (an enum, booleans); {WORKAROUND}"
            )
        _as_subsets(sub, values)
    return None


def _values(items: Any, resolve: Callable[[str], Any]) -> list[Any] | None:
    """The few values the items can take (an enum, a const, booleans, through local $refs), or None."""
    for _ in range(16):  # a $ref to a $ref ...
        if not isinstance(items, dict) or not isinstance(items.get("$ref"), str):
            break
        ref = items["$ref"]
        items = resolve(ref) if ref.startswith("#") else None
    if not isinstance(items, dict):
        return None
    if "const" in items:
        return [items["const"]]
    if isinstance(items.get("enum"), list):
        unique: list[Any] = []
        for value in items["enum"]:
            if value not in unique:
                unique.append(value)
        return unique
    if items.get("type") == "boolean":
        return [False, True]
    return None


def _as_subsets(sub: dict[str, Any], values: list[Any]) -> None:
    """The array schema `sub` (in place) as anyOf every subset of `values` its minItems and maxItems
    allow, each in the values' order; the other types it allowed (`["array", "null"]`) stay a branch."""
    low = sub.pop("minItems", 0)
    high = sub.pop("maxItems", len(values))
    low = low if isinstance(low, int) and not isinstance(low, bool) else 0
    high = high if isinstance(high, int) and not isinstance(high, bool) else len(values)
    types = sub.pop("type", None)
    for key in ("items", "uniqueItems", "contains", "minContains", "maxContains"):
        sub.pop(key, None)
    branches: list[Any] = []
    for mask in range(1 << len(values)):
        picked = [value for i, value in enumerate(values) if mask >> i & 1]
        if low <= len(picked) <= high:
            n = len(picked)
            branches.append(
                {
                    "type": "array",
                    "prefixItems": [{"const": value} for value in picked],
                    "items": False,
                    "minItems": n,
                    "maxItems": n,
                }
            )
    others = [t for t in (types if isinstance(types, list) else [types]) if t not in (None, "array")]
    if others:
        branches.append({"type": others})
    sub["anyOf"] = branches
