"""A one-shot run's weights loaded beside its imports (runner.engine.preload): only a load that already
went through the whole path, of the same file unchanged; the answer the same either way; a load begun
and never taken is freed when the command fails. Real processes, the real model."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

AHEAD = "load, begun beside the imports"


@pytest.fixture
def model_copy(smollm2_path: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "model.gguf"
    shutil.copyfile(smollm2_path, copy)
    return copy


def _run(model: Path, home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RUNNER_HOME": str(home)}
    args = ["run", str(model), "Name a colour.", "--temperature", "0", "--max-tokens", "12", "--verbose"]
    return subprocess.run(
        [sys.executable, "-m", "runner", *args, *extra], capture_output=True, text=True, env=env, input=""
    )


def test_the_second_same_run_takes_weights_loaded_beside_its_imports(
    model_copy: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    first = _run(model_copy, home)
    assert first.returncode == 0, first.stderr
    assert AHEAD not in first.stderr  # nothing is known of this file yet
    second = _run(model_copy, home)
    assert second.returncode == 0, second.stderr
    assert AHEAD in second.stderr, second.stderr
    assert second.stdout == first.stdout and first.stdout.strip()  # the same weights, the same answer


def test_a_changed_file_is_never_loaded_ahead(model_copy: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert _run(model_copy, home).returncode == 0
    stat = model_copy.stat()
    os.utime(model_copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # written since
    changed = _run(model_copy, home)
    assert changed.returncode == 0, changed.stderr
    assert AHEAD not in changed.stderr  # checked and planned again first: then remembered again
    assert AHEAD in _run(model_copy, home).stderr


def test_a_run_refused_after_the_load_began_frees_it_and_says_one_line(
    model_copy: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    assert _run(model_copy, home).returncode == 0
    refused = _run(model_copy, home, "--schema", "{not json")  # read once the load has begun
    assert refused.returncode == 2, refused.stderr
    assert refused.stdout == ""
    assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert AHEAD in _run(model_copy, home).stderr  # the record is still good


def test_a_load_begun_and_never_taken_is_stopped_and_freed(model_copy: Path, tmp_path: Path) -> None:
    """In process: what start() begins, finish() stops and frees; a second model loaded after the one
    taken (a draft model) leaves the record as it was; the plan meanwhile sees the memory as before."""
    from runner import host
    from runner.engine import preload
    from runner.engine.model import Model

    before = os.environ.get("RUNNER_HOME")
    os.environ["RUNNER_HOME"] = str(tmp_path / "home")
    try:
        preload.start(str(model_copy))  # nothing known of it yet: nothing begins
        assert preload._ahead is None
        Model(model_copy).close()  # the whole path's load: remembered
        [record] = (tmp_path / "home" / "cache" / "preload").glob("*.json")
        kept = record.read_text()
        preload.start(str(model_copy))
        ahead = preload._ahead
        assert ahead is not None and ahead.thread.ident is not None  # begun
        assert host.ram() == host.ram() and host._held is not None  # the plan's view held still
        preload.finish()
        assert preload._ahead is None and not ahead.thread.is_alive() and host._held is None
        preload.start(str(model_copy))
        taken = Model(model_copy)  # takes what began
        other = shutil.copyfile(model_copy, tmp_path / "draft.gguf")
        draft = Model(other)  # another file loaded after it: not remembered under this name
        assert record.read_text() == kept
        taken.close()
        draft.close()
    finally:
        preload.finish()
        if before is None:
            os.environ.pop("RUNNER_HOME", None)
        else:
            os.environ["RUNNER_HOME"] = before
