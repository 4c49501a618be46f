"""The one lint step, run with the suite so CI runs it: ruff check, ruff format --check, mypy, and the
layer contracts (import-linter, as pyproject.toml's [tool.importlinter] sets them)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

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
