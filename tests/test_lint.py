"""The one lint step, run with the suite so CI runs it: ruff check, ruff format --check, mypy, the
layer contracts (import-linter, as pyproject.toml's [tool.importlinter] sets them), and test files
that import no other test file."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = [sys.executable, "-c", "import importlinter.cli as c; c.lint_imports_command()"]


def test_ruff_check_and_format() -> None:
    for args in (["check", "."], ["format", "--check", "."]):
        done = subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_mypy() -> None:
    """Types as pyproject.toml's [tool.mypy] sets them (runner/, as Python 3.10 reads it)."""
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LINT_IMPORTS, "--no-cache"], cwd=root, capture_output=True, text=True)


def test_imports_point_down_only() -> None:
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def copy_of_runner(root: Path) -> None:
    """runner's code and its contracts under root, to break on purpose."""
    shutil.copytree(ROOT / "runner", root / "runner", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root)


def add_import(module: Path, statement: str) -> None:
    """A function-level import, as runner's lazy imports are: the contracts see those too."""
    module.write_text(module.read_text() + f"\n\ndef _added() -> None:\n    {statement}\n")


def test_an_import_up_a_layer_is_caught(tmp_path: Path) -> None:
    """The contracts can fail: the planner asking the engine for its dry run directly (the import
    this layout removed) breaks the layers, a command importing another breaks their independence."""
    copy_of_runner(tmp_path)
    add_import(tmp_path / "runner" / "memory" / "plan.py", "from runner.engine.llamacpp import dry_run")
    add_import(tmp_path / "runner" / "commands" / "fit.py", "from runner.commands.run import run_once")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "runner.memory.plan -> runner.engine.llamacpp" in done.stdout
    assert "runner.commands.fit -> runner.commands.run" in done.stdout
    assert "2 broken" in done.stdout


def test_an_import_cycle_is_caught(tmp_path: Path) -> None:
    """The prompt cache asking for the engine back (the cycle the engine's protocols removed) is a
    cycle between siblings and an import up the engine's own layers: both contracts say so."""
    copy_of_runner(tmp_path)
    add_import(tmp_path / "runner" / "engine" / "promptcache.py", "from runner.engine.engine import Engine")
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "No cycles are allowed in runner.engine" in done.stdout
    assert "runner.engine.promptcache is not allowed to import runner.engine.engine" in done.stdout
    assert "2 broken" in done.stdout


def test_an_api_importing_another_is_caught(tmp_path: Path) -> None:
    """The server's APIs share through runner.serve.shared only: OpenAI's translation borrowing
    Ollama's breaks their independence (and the server's layers, where they sit side by side)."""
    copy_of_runner(tmp_path)
    add_import(
        tmp_path / "runner" / "serve" / "openai" / "serving.py", "from runner.serve.ollama.serving import now"
    )
    done = lint_imports(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "runner.serve.openai.serving -> runner.serve.ollama.serving" in done.stdout
    assert "The APIs never import each other" in done.stdout
    assert "2 broken" in done.stdout


def imported_test_module(name: str | None) -> str | None:
    """The test module an import names (tests.test_x, test_x as tests/ on sys.path reads it), else None."""
    last = (name or "").split(".")
    if last[0] == "tests":
        last = last[1:]
    return last[0] if len(last) == 1 and last[0].startswith("test_") else None


def cross_test_imports(source: str) -> list[str]:
    """The test modules a test file's source imports, anywhere in it (function-level imports too):
    what test files share belongs in tests/helpers.py, tests/serving.py or tests/synth.py."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [m for alias in node.names if (m := imported_test_module(alias.name))]
        elif isinstance(node, ast.ImportFrom):
            if m := imported_test_module(node.module):
                found.append(m)
            elif node.module in (None, "tests"):  # from tests import test_x, from . import test_x
                found += [m for alias in node.names if (m := imported_test_module(alias.name))]
    return found


@pytest.mark.fast
def test_no_test_file_imports_another() -> None:
    """Importing a test file imports its tests and fixtures too (pytest may collect them twice, and
    a fixture's scope is the wrong module's): shared helpers live in their own modules."""
    found = {
        path.name: imports
        for path in sorted((ROOT / "tests").glob("test_*.py"))
        if (imports := cross_test_imports(path.read_text()))
    }
    assert found == {}


@pytest.mark.fast
def test_a_test_file_importing_another_is_caught() -> None:
    """The check can fail: each way of importing another test file is named, the shared modules are not."""
    source = """
from tests.test_chat import GREEDY, spawn
import tests.test_manage
from tests import test_memory, serving
from . import test_hub
from .test_faults import gguf
import test_plan


def later() -> None:
    from tests.test_signals import fake_hub
"""
    assert sorted(cross_test_imports(source)) == [
        "test_chat",
        "test_faults",
        "test_hub",
        "test_manage",
        "test_memory",
        "test_plan",
        "test_signals",
    ]
    shared = """
from tests.conftest import run_cli
from tests.helpers import GREEDY, llama_like
from tests.serving import QUESTIONS
from tests.synth import write_gguf
from tests.fakehub import FakeHub
from tests import helpers
import synth
"""
    assert cross_test_imports(shared) == []


@pytest.mark.fast
def test_every_module_is_under_500_lines() -> None:
    """A module of 500 lines or more holds more than one concern (docs/development.md): split it by one."""
    long = {
        str(path.relative_to(ROOT)): n
        for path in sorted((ROOT / "runner").rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) >= 500
    }
    assert long == {}, long
