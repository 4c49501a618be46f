"""Resumable, verified downloads of a Hub file into the standard Hugging Face cache.

huggingface_hub 2.4 resumes a cut download only within one call, from a 10 MiB boundary, deletes its
partial file when the call fails (so Ctrl-C and a new run start from zero), and checks only the size.
runner keeps huggingface_hub for everything else (metadata, auth headers, its HTTP session, the cache
layout) and moves the bytes itself:
  - a partial file `blobs/<sha256>.incomplete` survives failures and Ctrl-C; the next attempt, in the
    same run or a later one, asks for the bytes from where it stopped, so a drop costs nothing twice;
  - the sha256 is computed as the bytes arrive and checked against the Hub's LFS sha256 before the file
    takes its trusted name (`blobs/<sha256>`, linked from `snapshots/<commit>/<path>`);
  - a partial file whose bytes turn out wrong (the sha256 fails after a resume) is fetched again from
    zero, once, by the same call;
  - a file lock per blob where huggingface_hub keeps its own (`.locks/models--…/<sha256>.lock`): two
    processes pulling the same model end with one good copy, and `hf cache` tools see a clean cache.
Transient faults follow runner.retry's policy.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner import retry, ui
from runner.errors import DownloadError, IntegrityError

CHUNK = 1 << 20


def repo_dir(repo: str) -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--"))


def lock_path(repo: str, sha256: str) -> Path:
    """huggingface_hub's lock for a blob (file_download.py: locks_dir / repo folder / blob.lock)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE) / ".locks" / ("models--" + repo.replace("/", "--")) / f"{sha256}.lock"


def is_commit(revision: str) -> bool:
    return len(revision) == 40 and all(c in "0123456789abcdef" for c in revision)


def fetch(
    repo: str,
    commit: str,
    path: str,
    *,
    size: int,
    sha256: str,
    revision: str | None,
    progress: Callable[[int, int], Callable[[int], None]] | None = None,
) -> Path:
    """The snapshot path of repo@commit/path, downloaded (or resumed) and verified if not yet cached.

    progress(total, already) returns the callable told each new chunk's length.
    """
    from filelock import FileLock

    root = repo_dir(repo)
    blob = root / "blobs" / sha256
    link = root / "snapshots" / commit / path
    blob.parent.mkdir(parents=True, exist_ok=True)
    link.parent.mkdir(parents=True, exist_ok=True)  # as huggingface_hub: a repo folder always has one
    lock = lock_path(repo, sha256)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):
        if not blob.exists():
            _download(repo, commit, path, blob, size=size, sha256=sha256, progress=progress)
    _link(blob, link)
    branch = revision or "main"
    if not is_commit(branch):  # a branch or tag: record the commit it pointed at, as huggingface_hub does
        ref = root / "refs" / branch
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    return link


def _download(
    repo: str,
    commit: str,
    path: str,
    blob: Path,
    *,
    size: int,
    sha256: str,
    progress: Callable[[int, int], Callable[[int], None]] | None,
) -> None:
    partial = blob.with_name(blob.name + ".incomplete")
    digest, have = _resume_state(partial, size)
    advance = progress(size, have) if progress else None
    digest = _receive(repo, commit, path, partial, digest, have, size, advance)
    if digest.hexdigest() != sha256 and have:  # the earlier attempt's bytes were wrong: once from zero
        ui.warn(f"{path}: the partial file an earlier attempt left had wrong bytes; fetching it again")
        partial.unlink(missing_ok=True)
        digest = _receive(repo, commit, path, partial, hashlib.sha256(), 0, size, None)
    if digest.hexdigest() != sha256:
        partial.unlink(missing_ok=True)
        raise IntegrityError(
            f"{path}: sha256 {digest.hexdigest()[:16]}… does not match the Hub's {sha256[:16]}…; "
            "the file was removed"
        )
    os.replace(partial, blob)


def _receive(
    repo: str,
    commit: str,
    path: str,
    partial: Path,
    digest: Any,
    have: int,
    size: int,
    advance: Callable[[int], None] | None,
) -> Any:
    """Append the file's bytes from `have` to `size` to the partial file; return the running sha256."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    url = hf_hub_url(repo, path, revision=commit, endpoint=constants.ENDPOINT)
    backoff = retry.Backoff()
    transient = retry.transient_errors()
    while have < size:
        before = have
        try:
            headers = build_hf_headers()
            if have:
                headers["Range"] = f"bytes={have}-"
            timeout = constants.HF_HUB_DOWNLOAD_TIMEOUT
            with get_session().stream(
                "GET", url, headers=headers, follow_redirects=True, timeout=timeout
            ) as response:
                retry.check_status(response)
                _raise_for_status(response)
                if have and response.status_code != 206:  # the server ignored Range: start over
                    digest, have = hashlib.sha256(), 0
                    partial.unlink(missing_ok=True)
                with partial.open("ab") as out:
                    for chunk in response.iter_bytes():  # as received: a cut loses no byte already here
                        if have + len(chunk) > size:
                            partial.unlink(missing_ok=True)
                            raise IntegrityError(
                                f"{path}: the Hub sent more than the {size:,} bytes it declared"
                            )
                        out.write(chunk)
                        digest.update(chunk)
                        have += len(chunk)
                        if advance:
                            advance(len(chunk))
        except transient as exc:
            if not backoff.again(exc, progressed=have > before):
                raise DownloadError(
                    f"{repo}/{path}: {exc or type(exc).__name__} (stopped at {have:,} of {size:,} bytes; "
                    "run the same command again to resume)"
                ) from exc
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise DownloadError(
                f"{repo}/{path}: no space left on the device of {partial.parent} (stopped at {have:,} of "
                f"{size:,} bytes, kept: free some space and run the same command again to resume)"
            ) from exc
    return digest


def _raise_for_status(response: Any) -> None:
    """huggingface_hub's own translation (gated, not found …); it needs the body of an error response."""
    from huggingface_hub.utils import hf_raise_for_status

    if response.status_code >= 400:
        response.read()
        hf_raise_for_status(response)


def _resume_state(partial: Path, size: int) -> tuple[Any, int]:
    """The hash and length of what an earlier attempt left; one larger than the file is discarded."""
    digest = hashlib.sha256()
    if not partial.exists():
        return digest, 0
    have = partial.stat().st_size
    if have > size:
        partial.unlink()
        return digest, 0
    with partial.open("rb") as f:
        left = have  # no further: what is not a regular file may read on forever
        while left and (block := f.read(min(CHUNK, left))):
            digest.update(block)
            left -= len(block)
    return digest, have


def _link(blob: Path, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        if link.resolve() == blob.resolve():
            return
        link.unlink()
    try:
        os.symlink(os.path.relpath(blob, link.parent), link)
    except OSError:  # no symlinks (some Windows setups): the cache layout allows a copy
        import shutil

        shutil.copyfile(blob, link)
