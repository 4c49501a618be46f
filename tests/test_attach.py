"""`/image PATH` in process (runner.commands.attach.Attachments; the engine only needs a projector to
be there): the same image attached twice goes once, and the chat says so."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from runner.commands.attach import Attachments
from tests.helpers import random_png

pytestmark = pytest.mark.fast


def test_the_same_image_twice_is_attached_once_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    photo, copy, other = tmp_path / "photo.png", tmp_path / "copy.png", tmp_path / "other.png"
    photo.write_bytes(random_png(1))
    copy.write_bytes(random_png(1))  # the same bytes under another name: the same image
    other.write_bytes(random_png(2))
    attached = Attachments(SimpleNamespace(vision=object()))
    attached.attach(str(photo))
    assert "attached photo.png" in capsys.readouterr().err
    attached.attach(str(photo))
    assert "photo.png is already attached; it goes once with your next message" in capsys.readouterr().err
    attached.attach(str(copy))
    said = capsys.readouterr().err
    assert "copy.png is already attached (as photo.png: the same image)" in said
    attached.attach(str(other))
    assert [Path(r.path).name for r in attached.pending] == ["photo.png", "other.png"]
    assert attached.show() == "the next message carries photo.png, other.png"
