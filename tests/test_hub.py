"""Models from a real HTTP Hub on loopback, through the real huggingface_hub client."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from runner.errors import AccessDenied, DownloadError, IntegrityError, ModelNotFound
from runner.hub.catalog import load_catalog
from runner.hub.fetch import cached_path, locate, pull
from runner.hub.refs import resolve
from tests.fakehub import FakeHub, fake_hub_fixture, hf_env, instant_backoff
from tests.synth import write_gguf

fake_hub = fake_hub_fixture()


def blob(name: str, size: int = 200_000) -> bytes:
    """Distinct bytes per name (the Hub deduplicates equal blobs)."""
    seed = random.Random(name)
    return b"GGUF" + bytes(seed.getrandbits(8) for _ in range(size - 4))


QUANTS = {
    "tiny-Q2_K.gguf": blob("q2"),
    "tiny-Q4_K_M.gguf": blob("q4km"),
    "tiny-Q8_0.gguf": blob("q8"),
    "mmproj-tiny-f16.gguf": blob("mm"),
    "README.md": b"# tiny\n",
}


def ref(text: str):
    return resolve(text, load_catalog())


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.fast
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("user/tiny-GGUF", "tiny-Q4_K_M.gguf"),
        ("user/tiny-GGUF:q8_0", "tiny-Q8_0.gguf"),
        ("user/tiny-GGUF:tiny-Q2_K.gguf", "tiny-Q2_K.gguf"),
        ("hf.co/user/tiny-GGUF:Q2_K", "tiny-Q2_K.gguf"),
        ("huggingface.co/user/tiny-GGUF", "tiny-Q4_K_M.gguf"),
        ("https://huggingface.co/user/tiny-GGUF/blob/main/tiny-Q8_0.gguf", "tiny-Q8_0.gguf"),
    ],
)
def test_every_reference_form_downloads_the_right_file(fake_hub: FakeHub, text: str, expected: str) -> None:
    commit = fake_hub.add_repo("user/tiny-GGUF", QUANTS)
    path = locate(ref(text))
    assert path.name == expected
    assert path.read_bytes() == QUANTS[expected]
    assert f"snapshots/{commit}/" in path.as_posix()  # the standard Hugging Face cache layout
    assert fake_hub.count("mmproj") == 0


@pytest.mark.fast
def test_a_revision_pins_the_commit_and_blobs_are_shared(fake_hub: FakeHub) -> None:
    first = fake_hub.add_repo("user/tiny-GGUF", QUANTS)
    second = fake_hub.add_revision("user/tiny-GGUF", {"tiny-Q8_0.gguf": blob("q8-v2")})
    old = locate(ref(f"user/tiny-GGUF:Q8_0@{first}"))
    new = locate(ref("user/tiny-GGUF:Q8_0"))
    assert old.read_bytes() == QUANTS["tiny-Q8_0.gguf"] and new.read_bytes() == blob("q8-v2")
    assert f"/{second}/" in new.as_posix()
    q4_old = locate(ref(f"user/tiny-GGUF@{first}"))
    q4_new = pull(ref("user/tiny-GGUF")).path
    assert q4_old.resolve() == q4_new.resolve()  # one blob, two snapshots


@pytest.mark.fast
def test_split_models_fetch_every_shard_and_load_from_the_first(fake_hub: FakeHub) -> None:
    shards = {f"Q8_0/big-Q8_0-0000{i}-of-00003.gguf": blob(f"s{i}") for i in (1, 2, 3)}
    fake_hub.add_repo("user/big-GGUF", {**shards, "big-Q4_0.gguf": blob("q4")})
    pulled = pull(ref("user/big-GGUF:Q8_0"))
    assert [p.name for p in pulled.paths] == [f"big-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert pulled.path.name.endswith("00001-of-00003.gguf")
    assert all(p.exists() for p in pulled.paths)


@pytest.mark.fast
def test_a_quant_that_matches_nothing_lists_the_offer(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("user/tiny-GGUF", QUANTS)
    with pytest.raises(ModelNotFound, match=r"has no Q5_K_M file; it offers: Q2_K 200.0 KB, Q4_K_M"):
        pull(ref("user/tiny-GGUF:Q5_K_M"))


@pytest.mark.fast
def test_unknown_repo_and_revision(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("user/tiny-GGUF", QUANTS)
    with pytest.raises(ModelNotFound, match="no repo user/missing on the Hub"):
        pull(ref("user/missing"))
    with pytest.raises(ModelNotFound, match="has no revision nope"):
        pull(ref("user/tiny-GGUF@nope"))


@pytest.fixture(autouse=True)
def _instant_retries(monkeypatch: pytest.MonkeyPatch):
    from runner import retry

    waits: list[float] = []
    monkeypatch.setattr(retry, "sleep", waits.append)
    with instant_backoff():
        yield waits


@pytest.mark.fast
def test_wrong_bytes_are_caught_and_removed(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("user/tiny-GGUF", QUANTS)
    fake_hub.add_fault("tiny-Q4_K_M.gguf", "corrupt", offset=1000, data=b"evil")
    with pytest.raises(IntegrityError, match="does not match"):
        pull(ref("user/tiny-GGUF"))
    assert cached_path(ref("user/tiny-GGUF")) is None  # nothing left that a later run would trust
    assert locate(ref("user/tiny-GGUF")).read_bytes() == QUANTS["tiny-Q4_K_M.gguf"]  # next try is clean


@pytest.mark.fast
def test_twenty_drops_at_random_offsets_resume_and_never_leave_a_corrupt_file(fake_hub: FakeHub) -> None:
    data = blob("big", 3_000_000)
    fake_hub.add_repo("user/drop-GGUF", {"drop-Q4_K_M.gguf": data})
    rng = random.Random(20)
    cuts: list[int] = []

    def cut(length: int) -> int:  # a random offset into what this request still has to send
        cuts.append(rng.randrange(1, min(length, 140_000)))
        return cuts[-1]

    fake_hub.add_fault("cdn-lfs", "drop", drop_after=cut, times=20)
    path = pull(ref("user/drop-GGUF")).path
    assert sha(path.read_bytes()) == sha(data)
    assert fake_hub.count("cdn-lfs", "GET") == 21
    assert fake_hub.sent("cdn-lfs") == len(data)  # every byte crossed the wire once: nothing fetched twice
    ranges = [r for p, r in fake_hub.ranges if "cdn-lfs" in p]
    assert len(ranges) == 20 and ranges[0] == f"bytes={cuts[0]}-"


@pytest.mark.fast
def test_an_interrupted_pull_continues_in_a_later_run(fake_hub: FakeHub) -> None:
    data = blob("resume", 2_000_000)
    fake_hub.add_repo("user/resume-GGUF", {"resume-Q4_K_M.gguf": data})
    # the first answer is cut after 1,234,567 bytes, every later one before its first byte
    fake_hub.add_fault("cdn-lfs", "drop", drop_after=lambda n: 1_234_567 if n == len(data) else 0, times=None)
    with pytest.raises(DownloadError, match="run the same command again to resume"):
        pull(ref("user/resume-GGUF"))
    assert cached_path(ref("user/resume-GGUF")) is None  # the partial file is not trusted
    fake_hub.clear_faults()
    fake_hub.reset_counters()
    path = pull(ref("user/resume-GGUF")).path
    assert sha(path.read_bytes()) == sha(data)
    assert fake_hub.sent("cdn-lfs") == len(data) - 1_234_567


@pytest.mark.fast
def test_gated_repo_says_how_to_get_access(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("org/gated-GGUF", {"g-Q4_K_M.gguf": blob("g")}, gated=True)
    with pytest.raises(AccessDenied, match="is gated and no token is set.*accept its terms"):
        pull(ref("org/gated-GGUF"))
    monkeypatch.setenv("HF_TOKEN", "hf_not_allowed")
    with pytest.raises(AccessDenied, match="is gated and your token has no access yet"):
        pull(ref("org/gated-GGUF"))
    fake_hub.allowed_tokens.add("hf_allowed")
    monkeypatch.setenv("HF_TOKEN", "hf_allowed")
    assert pull(ref("org/gated-GGUF")).path.read_bytes() == blob("g")


@pytest.mark.fast
def test_rate_limits_and_server_errors_are_retried(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("user/tiny-GGUF", QUANTS)
    fake_hub.add_fault("tiny-Q4_K_M.gguf", "status", status=503, times=2, method="GET")
    fake_hub.add_fault("/api/models/user/tiny-GGUF", "status", status=429, retry_after=1, times=1)
    path = pull(ref("user/tiny-GGUF")).path
    assert path.read_bytes() == QUANTS["tiny-Q4_K_M.gguf"]
    assert fake_hub.count("tiny-Q4_K_M.gguf", "GET") + fake_hub.count("cdn-lfs", "GET") >= 3


@pytest.mark.fast
def test_a_cached_model_needs_no_network_even_with_the_hub_gone(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("user/tiny-GGUF", QUANTS)
    path = locate(ref("user/tiny-GGUF:Q2_K"))
    fake_hub.stop()
    assert locate(ref("user/tiny-GGUF:Q2_K")) == path
    assert locate(ref("hf.co/user/tiny-GGUF:tiny-Q2_K.gguf")) == path
    with pytest.raises(DownloadError, match="cannot be reached"):
        locate(ref("user/tiny-GGUF:Q8_0"))  # not cached: fails fast and says why


@pytest.mark.fast
def test_offline_uses_only_the_cache(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub.add_repo("user/tiny-GGUF", QUANTS)
    path = locate(ref("user/tiny-GGUF"))
    fake_hub.reset_counters()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert locate(ref("user/tiny-GGUF")) == path
    with pytest.raises(DownloadError, match="offline"):
        locate(ref("user/tiny-GGUF:Q8_0"))
    assert fake_hub.count() == 0


def test_two_processes_pulling_at_once_end_with_one_good_copy(fake_hub: FakeHub, tmp_path: Path) -> None:
    data = blob("shared", 4_000_000)
    fake_hub.add_repo("user/race-GGUF", {"race-Q4_K_M.gguf": data})
    fake_hub.add_fault("cdn-lfs", "stall", seconds=0.5, after=1_000_000, then="continue", times=2)
    code = (
        "from runner.hub.fetch import pull; from runner.hub.refs import HubRef; "
        "print(pull(HubRef('user/race-GGUF')).path)"
    )
    from huggingface_hub import constants

    env = hf_env(fake_hub.endpoint, constants.HF_HUB_CACHE)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    paths = {Path(out.decode().strip()) for out, _ in outs}
    assert len(paths) == 1
    path = paths.pop()
    assert sha(path.read_bytes()) == sha(data)
    blobs = list((path.parents[2] / "blobs").iterdir())
    assert [b.name for b in blobs] == [sha(data)]  # the lock is huggingface_hub's, under .locks/
    assert list((path.parents[3] / ".locks" / path.parents[2].name).glob("*.lock"))


@pytest.mark.fast
def test_not_enough_disk_space_is_said_before_downloading(fake_hub: FakeHub, monkeypatch) -> None:
    fake_hub.add_repo("user/tiny-GGUF", QUANTS)
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda _p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(DownloadError, match="needs 200.0 KB but .* has 1.0 KB free"):
        pull(ref("user/tiny-GGUF"))
    assert fake_hub.count("tiny-Q4_K_M.gguf", "GET") == 0


@pytest.mark.fast
def test_catalog_entry_pins_its_bytes(fake_hub: FakeHub, tmp_path: Path, monkeypatch) -> None:
    fake_hub.add_repo("user/tiny-GGUF", QUANTS)
    monkeypatch.setenv("RUNNER_HOME", str(tmp_path))
    (tmp_path / "models.toml").write_text(
        f'[models.tiny]\nrepo = "user/tiny-GGUF"\nfile = "tiny-Q8_0.gguf"\nsha256 = "{"1" * 64}"\n'
    )
    with pytest.raises(IntegrityError, match="not the file models.toml pins"):
        locate(ref("tiny"))
    os.environ.pop("RUNNER_HOME", None)


def _cli(fake_hub: FakeHub, *args: str) -> subprocess.CompletedProcess[bytes]:
    from huggingface_hub import constants

    env = hf_env(fake_hub.endpoint, constants.HF_HUB_CACHE)
    return subprocess.run([sys.executable, "-m", "runner", *args], env=env, capture_output=True, timeout=120)


def test_pull_prints_size_and_path_per_file_and_list_downloads_nothing(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    from runner.ui import human_bytes

    shards = {
        f"Q8_0/big-Q8_0-0000{i}-of-00002.gguf": write_gguf(tmp_path / f"s{i}.gguf", layers=i) for i in (1, 2)
    }
    q4 = write_gguf(tmp_path / "q4.gguf", layers=3)
    fake_hub.add_repo("user/big-GGUF", {**shards, "big-Q4_K_M.gguf": q4, "mmproj-big-f16.gguf": blob("m")})
    sizes = [p.stat().st_size for p in shards.values()]
    listed = _cli(fake_hub, "pull", "user/big-GGUF", "--list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.decode().splitlines() == [
        f"Q8_0    {human_bytes(sum(sizes)):>9}  Q8_0/big-Q8_0-00001-of-00002.gguf (2 shards)",
        f"Q4_K_M  {human_bytes(q4.stat().st_size):>9}  big-Q4_K_M.gguf",
    ]
    assert fake_hub.count("cdn-lfs") == 0
    done = _cli(fake_hub, "pull", "hf.co/user/big-GGUF:q8_0")
    assert done.returncode == 0, done.stderr
    *lines, projector = done.stdout.decode().splitlines()
    assert [line.split("\t")[0] for line in lines] == [human_bytes(n) for n in sizes]
    assert [Path(line.split("\t")[1]).name for line in lines] == [Path(p).name for p in shards]
    assert projector.split("\t") == [
        human_bytes(200_000),
        str(Path(lines[0].split("\t")[1]).parent.parent / "mmproj-big-f16.gguf"),
    ]
    assert b"Q8_0 at" in done.stderr
    # its projector: random bytes, not a GGUF
    assert b"takes no images or audio in runner yet: " in done.stderr
    missing = _cli(fake_hub, "pull", "user/big-GGUF:Q3_K_S")
    assert missing.returncode == 2
    assert missing.stderr.decode().strip() == (
        "runner: error: user/big-GGUF has no Q3_K_S file; it offers: "
        f"Q8_0 {human_bytes(sum(sizes))}, Q4_K_M {human_bytes(q4.stat().st_size)}"
    )


def test_pull_refuses_what_will_not_fit_before_downloading(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo("user/tiny-GGUF", {"tiny-Q4_K_M.gguf": write_gguf(tmp_path / "t.gguf")})
    refused = _cli(fake_hub, "pull", "user/tiny-GGUF", "--ctx", "2000000000")
    assert refused.returncode == 1
    assert b"does not fit in RAM" in refused.stderr and b"--force loads it anyway" in refused.stderr
    assert fake_hub.sent("cdn-lfs") < 100_000  # the header only
    assert cached_path(ref("user/tiny-GGUF")) is None


def test_progress_bar_on_a_terminal_and_quiet_otherwise(fake_hub: FakeHub) -> None:
    import pty

    from huggingface_hub import constants

    fake_hub.add_repo("user/bar-GGUF", {"bar-Q8_0.gguf": blob("bar", 3_000_000)})
    fake_hub.add_fault("cdn-lfs", "stall", seconds=0.6, after=1_000_000, then="continue")
    leader, follower = pty.openpty()
    env = {**hf_env(fake_hub.endpoint, constants.HF_HUB_CACHE), "COLUMNS": "100", "TERM": "xterm"}
    code = (
        "from runner.hub.fetch import pull; from runner.hub.refs import HubRef; "
        "pull(HubRef('user/bar-GGUF', file='bar-Q8_0.gguf'))"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    screen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        screen += chunk
    proc.wait(timeout=60)
    os.close(leader)
    assert proc.returncode == 0
    text = screen.decode(errors="replace")
    assert "bar-Q8_0.gguf" in text and "MB" in text and "/s" in text  # name, bytes and rate
    quiet = _cli(fake_hub, "pull", "user/bar-GGUF:Q8_0")  # stderr is a pipe here
    assert b"\r" not in quiet.stderr and b"/s" not in quiet.stderr


def test_run_refuses_what_will_not_fit_before_downloading(fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.add_repo(
        "user/tiny-GGUF", {"tiny-Q4_K_M.gguf": write_gguf(tmp_path / "t.gguf", padding=8_000_000)}
    )
    refused = _cli(fake_hub, "run", "user/tiny-GGUF", "hi", "--ctx", "2000000000")
    assert refused.returncode == 1
    assert b"does not fit in RAM" in refused.stderr
    assert fake_hub.sent("cdn-lfs") <= 1 << 20  # one block of the header, not the 8 MB of weights
    assert cached_path(ref("user/tiny-GGUF")) is None


@pytest.mark.fast
def test_a_refusal_names_smaller_quants_of_the_repo_that_fit(
    fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runner.errors import WontFit
    from runner.gguf import read_header
    from runner.loader import open_model
    from runner.memory import devices
    from runner.memory.devices import Machine
    from runner.memory.estimate import Load, estimate

    big = write_gguf(tmp_path / "big.gguf", padding=40_000_000)
    small = write_gguf(tmp_path / "small.gguf", layers=3, padding=4_000_000)
    fake_hub.add_repo("user/two-GGUF", {"two-Q8_0.gguf": big, "two-Q4_K_M.gguf": small})
    need = {p: estimate(read_header(p), Load(n_ctx=4096)).host_rss_bytes for p in (big, small)}
    ram = int((need[small] + need[big]) / 2 / 0.9)  # room for the small one only, after the 10% margin
    monkeypatch.setattr(devices, "probe", lambda **_: Machine(ram, ram))
    with pytest.raises(WontFit) as refused:
        open_model("user/two-GGUF:Q8_0")
    assert "a smaller quant: user/two-GGUF:Q4_K_M" in str(refused.value)
    assert cached_path(ref("user/two-GGUF:Q8_0")) is None  # nothing downloaded
