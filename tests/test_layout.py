"""The shape of the code, checked from its syntax (no model, no process): the one door into the engine
(a Job made in one place, a Result's JSON in one place), and functions short enough to read.

The long-function check is a ratchet: LONG names the functions still over the limit, each a known
debt; a new one fails, and so does one that was shortened without leaving the list."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

RUNNER = Path(__file__).resolve().parent.parent / "runner"
MAX_LINES = 80  # a function's lines, decorators apart
LONG: set[str] = set()  # any still over MAX_LINES, each a known debt: take one off when it is split


def modules() -> list[tuple[str, ast.Module]]:
    return [
        (str(path.relative_to(RUNNER.parent)), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(RUNNER.rglob("*.py"))
    ]


def calls_to(name: str) -> list[str]:
    """Where in runner/ a call to `name` (a bare name or an attribute) is made: path:line."""
    found = []
    for where, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
                if called == name:
                    found.append(f"{where}:{node.lineno}")
    return found


def test_a_job_is_made_in_one_place() -> None:
    """Request -> Job happens in runner.engine.request.to_job alone: no door builds its own."""
    sites = calls_to("Job")
    assert len(sites) == 1 and sites[0].startswith("runner/engine/request.py:"), sites


def test_a_result_becomes_json_in_one_place() -> None:
    """timings_json is called by result_json and by the server's view of a Result, nothing else
    rounds a Result's timings: every edge shows the same field names."""
    sites = {site.split(":")[0] for site in calls_to("timings_json")}
    assert sites <= {"runner/engine/answer.py", "runner/serve/backend.py"}, sites
    rounding = []  # round(t.ttft_s, 4) and the like, on a Timings (`t`, `*.timings`) outside answer.py
    for where, tree in modules():
        if where == "runner/engine/answer.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "round" and node.args:
                value = getattr(node.args[0], "value", None)
                if getattr(value, "id", None) == "t" or getattr(value, "attr", None) == "timings":
                    rounding.append(f"{where}:{node.lineno} {ast.unparse(node)}")
    assert not rounding, rounding


def test_no_function_is_longer_than_it_can_be_read() -> None:
    long = set()
    for where, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                if node.end_lineno - node.lineno + 1 > MAX_LINES:
                    long.add(f"{where}:{node.name}")
    assert long - LONG == set(), f"over {MAX_LINES} lines: split them"
    assert LONG - long == set(), "split: take them off LONG"


MAX_PUBLIC = 25  # public methods (properties included) a class may have: more is more than one concern
LOAD_PATH = ("loader.py", "settings.py", "projector.py", "memory/", "engine/llamacpp.py", "engine/engine.py")
LOAD_PATH += ("engine/model.py", "engine/context.py")
MAX_PARAMS = 6  # a load-path function's parameters, self apart: more travel in a LoadSettings or a Placement


def test_no_class_has_more_public_methods_than_one_concern_needs() -> None:
    crowded = {}
    for where, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                public = [
                    f.name
                    for f in node.body
                    if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and not f.name.startswith("_")
                ]
                if len(public) > MAX_PUBLIC:
                    crowded[f"{where}:{node.name}"] = len(public)
    assert not crowded, crowded


def test_the_load_path_takes_its_settings_whole() -> None:
    """From the flags to llama.cpp (runner.settings.LoadSettings, runner.engine.llamacpp.Placement), no
    function takes more than MAX_PARAMS parameters: loose keywords are how the six signatures drifted."""
    wide = {}
    for where, tree in modules():
        inside = where.removeprefix("runner/")
        if not inside.startswith(LOAD_PATH):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                names = names[1:] if names[:1] in (["self"], ["cls"]) else names
                if len(names) > MAX_PARAMS:
                    wide[f"{where}:{node.name}"] = len(names)
    assert not wide, wide
