"""The fake Hub's content: repos, commits and blobs as the Hub describes them."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

CHUNK = 1024 * 1024
EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Blob:
    """One file's content and the ids the Hub gives it; `source` is bytes or a Path streamed from disk."""

    size: int
    sha256: str
    oid: str  # git blob id: of the content, or of the LFS pointer file for LFS files
    lfs: bool
    pointer_size: int
    source: bytes | Path = field(repr=False)

    def chunks(self, start: int, end: int) -> Iterator[bytes]:
        """The bytes [start, end), in pieces of at most CHUNK; a Path is read as it goes, never whole."""
        if isinstance(self.source, bytes):
            for at in range(start, end, CHUNK):
                yield self.source[at : min(at + CHUNK, end)]
            return
        with open(self.source, "rb") as f:
            f.seek(start)
            left = end - start
            while left > 0:
                piece = f.read(min(CHUNK, left))
                if not piece:
                    raise OSError(f"{self.source} shrank while being served")
                left -= len(piece)
                yield piece


_digest_cache: dict[tuple[str, int, int], tuple[str, str]] = {}
_digest_lock = threading.Lock()


def digests(source: bytes | Path) -> tuple[int, str, str]:
    """(size, sha256, git blob sha1) of the content; a Path's digests are cached by (path, size, mtime)."""
    if isinstance(source, bytes):
        git = hashlib.sha1(b"blob %d\0" % len(source) + source).hexdigest()
        return len(source), hashlib.sha256(source).hexdigest(), git
    st = source.stat()
    key = (str(source.resolve()), st.st_size, st.st_mtime_ns)
    with _digest_lock:
        cached = _digest_cache.get(key)
    if cached is None:
        sha256, git = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % st.st_size)
        with open(source, "rb") as f:
            while piece := f.read(CHUNK):
                sha256.update(piece)
                git.update(piece)
        cached = (sha256.hexdigest(), git.hexdigest())
        with _digest_lock:
            _digest_cache[key] = cached
    return st.st_size, cached[0], cached[1]


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file that git stores in place of an LFS file."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class Commit:
    sha: str
    files: Mapping[str, Blob]
    parent: str | None
    title: str
    date: datetime


@dataclass
class Repo:
    repo_id: str
    private: bool
    gated: Literal["auto", "manual", False]
    downloads: int
    likes: int
    tags: list[str]
    trending_score: int
    created_at: datetime
    commits: dict[str, Commit] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag name -> commit sha


def head_commit(repo: Repo) -> Commit:
    """What a listing describes: main, else the newest commit."""
    sha = repo.refs.get("main")
    return repo.commits[sha] if sha else max(repo.commits.values(), key=lambda c: c.date)


def sort_value(repo: Repo, key: str) -> Any:
    values = {
        "downloads": repo.downloads,
        "likes": repo.likes,
        "createdAt": repo.created_at,
        "lastModified": head_commit(repo).date,
    }
    return values.get(key, repo.trending_score)


def resolve(repo: Repo, revision: str) -> Commit | None:
    """A branch, a tag, a full commit sha or a unique prefix of one (7 digits or more)."""
    sha = repo.refs.get(revision, revision)
    if sha in repo.commits:
        return repo.commits[sha]
    if len(revision) >= 7:
        found = [c for s, c in repo.commits.items() if s.startswith(revision.lower())]
        if len(found) == 1:
            return found[0]
    return None
