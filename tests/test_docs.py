"""Docs that cannot drift: the README's commands are the ones CI and the CLI really run."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _block_after(marker: str) -> str:
    return README.split(marker, 1)[1].split("```", 2)[1].split("\n", 1)[1]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    command = _block_after("<!-- test-command").strip()
    assert command.endswith("python -m pytest")
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1] == command


def test_readme_shows_the_real_help() -> None:
    assert _block_after("<!-- runner --help -->") == run_cli("--help", env={"COLUMNS": "80"}).stdout.decode()
