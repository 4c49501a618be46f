"""`runner show` in process, on synthetic GGUF files (tests/synth.py): a file cut short is described
with a warning and marked as cut in the text and in --json, as `runner run` refuses it."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from runner.commands.show import show_model
from tests.synth import write_gguf

pytestmark = pytest.mark.fast


def test_a_truncated_file_is_said_to_be_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = write_gguf(tmp_path / "tiny.gguf", padding=1_000_000)
    data = whole.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 3])

    out = io.StringIO()
    show_model(str(whole), out=out)
    assert "(truncated" not in out.getvalue() and "is truncated" not in capsys.readouterr().err

    out = io.StringIO()
    show_model(str(cut), out=out)
    err = capsys.readouterr().err
    assert f"{cut} is truncated: 343.5 KB of the 1.0 MB its header describes (runner run refuses it" in err
    assert "size           343.5 KB (truncated: its header describes 1.0 MB)\n" in out.getvalue()

    out = io.StringIO()
    show_model(str(cut), out=out, as_json=True)
    shown = json.loads(out.getvalue())
    assert (shown["size_bytes"], shown["expected_bytes"], shown["complete"]) == (
        len(data) // 3,
        len(data),
        False,
    )
