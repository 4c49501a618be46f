"""What a plain `runner run` imports: none of what only other paths need (issue 56's start-up: each
module a plain run loads is paid by every script that calls it once per file). Checked in a process
of its own through sys.modules at exit, not by timing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

NOT_FOR_A_PLAIN_RUN = (
    "mcp",  # --mcp's SDK
    "anyio",
    "runner.tools",
    "runner.commands.agent",
    "runner.store",  # the conversation store: chat, run -c
    "sqlite3",
    "runner.serve",  # runner serve
    "starlette",
    "uvicorn",
    "pydantic",
    "httpx",
    "PIL",  # images: --image
    "miniaudio",  # audio: MP3, FLAC, Ogg, resampling (runner.audio_codecs)
    "llguidance",  # schemas: --schema, --format json
    "numpy",  # logprobs, --quality
    "jsonschema",
    "prompt_toolkit",  # the chat's line editing
    "huggingface_hub",  # a path or a cached model needs no Hub
)

PROBE = """
import atexit, sys
watched = {watched!r}
def said():
    print(sorted(m for m in sys.modules if m.startswith(watched)), file=sys.stderr)
atexit.register(said)
sys.argv = ["runner", "run", {model!r}, "Hi", "--max-tokens", "1"]
from runner.cli.app import main
main()
"""


def test_a_plain_run_imports_nothing_it_does_not_use(smollm2_path: Path) -> None:
    code = PROBE.format(watched=NOT_FOR_A_PLAIN_RUN, model=str(smollm2_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, input="")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
    # and the probe sees what it watches: a run with --format json loads llguidance
    guided = code.replace('"--max-tokens", "1"]', '"--max-tokens", "1", "--format", "json"]')
    shown = subprocess.run([sys.executable, "-c", guided], capture_output=True, text=True, input="")
    assert "llguidance" in shown.stderr.strip().splitlines()[-1], shown.stderr
