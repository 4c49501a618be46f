"""Pointing huggingface_hub at the fake Hub: another process's environment, this process's constants,
instant retry waits, and the pytest fixture."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.fakehub.hub import FakeHub

_DROPPED_ENV = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_OIDC_RESOURCE",
)
_NO_TOKEN_PATH = Path(tempfile.gettempdir()) / f"fakehub-no-token-{os.getpid()}" / "token"


def hf_env(endpoint: str, cache_dir: Path | str | None = None, base: Mapping[str, str] | None = None) -> dict:
    """Environment for a process whose huggingface_hub should use `endpoint` (and `cache_dir`), no token."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _DROPPED_ENV}
    env.update(HF_ENDPOINT=endpoint, HF_TOKEN_PATH=str(_NO_TOKEN_PATH), HF_HUB_DISABLE_TELEMETRY="1")
    if cache_dir is not None:
        env["HF_HUB_CACHE"] = str(cache_dir)
    return env


@contextmanager
def pointed_at(endpoint: str, cache_dir: Path | str | None = None) -> Iterator[None]:
    """Point this process's (already imported) huggingface_hub, and its future subprocesses, at `endpoint`."""
    from huggingface_hub import constants, hf_api
    from huggingface_hub.utils import _http

    patches: dict[str, Any] = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_TOKEN_PATH": str(_NO_TOKEN_PATH),
        "HF_STORED_TOKENS_PATH": str(_NO_TOKEN_PATH.with_name("stored_tokens")),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
    }
    if cache_dir is not None:
        patches["HF_HUB_CACHE"] = str(cache_dir)
    saved_constants = {name: getattr(constants, name) for name in patches}
    saved_endpoint = hf_api.api.endpoint
    saved_env = dict(os.environ)
    _http.close_session()
    try:
        for name, value in patches.items():
            setattr(constants, name, value)
        hf_api.api.endpoint = endpoint
        os.environ.clear()
        os.environ.update(hf_env(endpoint, cache_dir, base=saved_env))
        yield
    finally:
        _http.close_session()
        for name, value in saved_constants.items():
            setattr(constants, name, value)
        hf_api.api.endpoint = saved_endpoint
        os.environ.clear()
        os.environ.update(saved_env)


@contextmanager
def instant_backoff() -> Iterator[list[float]]:
    """Make huggingface_hub's retry waits instant; yields the seconds it asked to wait, in order.

    Its backoff (1, 2, 4, 8, 8 s: 23 s before giving up on an unreachable Hub) and its 1 s pause before
    resuming a cut download both go through `time.sleep` in huggingface_hub.utils._http and .file_download.
    """
    from types import SimpleNamespace

    from huggingface_hub import file_download
    from huggingface_hub.utils import _http

    waits: list[float] = []
    fake_time = SimpleNamespace(sleep=waits.append)
    saved = _http.time, file_download.time
    _http.time = file_download.time = fake_time  # type: ignore[assignment]
    try:
        yield waits
    finally:
        _http.time, file_download.time = saved


def hub_cache_dir() -> Path:
    """The huggingface_hub cache the process uses now (the fixture's own, inside fake_hub_fixture)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def fake_hub_fixture(*, scope: str = "function", name: str | None = None, **hub_options: Any) -> Any:
    """A pytest fixture: a started FakeHub that huggingface_hub points at, with a fresh cache; stopped after.

    # conftest.py
    from tests.fakehub import fake_hub_fixture
    fake_hub = fake_hub_fixture()                  # or fake_hub_fixture(scope="module", lfs_threshold=...)
    """
    import pytest

    @pytest.fixture(scope=scope, name=name)  # type: ignore[call-overload]
    def fake_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
        cache = tmp_path_factory.mktemp("hf-hub-cache")
        with FakeHub(**hub_options) as hub, pointed_at(hub.endpoint, cache_dir=cache):
            yield hub
        hub.raise_server_errors()

    return fake_hub
