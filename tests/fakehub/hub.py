"""FakeHub: repos, faults and counters behind two loopback listeners, the Hub and its CDN."""

from __future__ import annotations

import hashlib
import random
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from tests.fakehub.api import HubApi
from tests.fakehub.faults import FAULT_DEFAULTS, Fault, FaultKind, RequestInfo, RequestRecord
from tests.fakehub.repos import EPOCH, Blob, Commit, Repo, digests, lfs_pointer, resolve
from tests.fakehub.server import Server

LfsRedirect = Literal["cdn", "relative", "none"]


class FakeHub(HubApi):
    """Repos, faults and counters behind two loopback listeners: the Hub (`endpoint`) and its CDN."""

    def __init__(
        self,
        *,
        lfs_suffixes: Iterable[str] = (".gguf",),
        lfs_threshold: int = 10 * 1024 * 1024,
        lfs_redirect: LfsRedirect = "cdn",
        page_size: int = 1000,
        request_timeout: float = 30.0,
        seed: int = 0,
    ) -> None:
        self.lfs_suffixes = tuple(lfs_suffixes)
        self.lfs_threshold = lfs_threshold
        self.lfs_redirect = lfs_redirect
        self.page_size = page_size
        self.request_timeout = request_timeout  # socket timeout of every connection: no handler waits longer
        self.allowed_tokens: set[str] = set()  # bearer tokens that may read private and gated repos
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._repos: dict[str, Repo] = {}
        self.packages: dict[str, dict[str, bytes]] = {}  # PyPI: project -> wheel file name -> bytes
        self._blobs: dict[str, Blob] = {}  # sha256 -> blob, what the CDN serves
        self._faults: list[Fault] = []
        self._log: list[RequestRecord] = []
        self._errors: list[str] = []
        self._servers: list[Server] = []
        self._threads: list[threading.Thread] = []
        self._connections: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._ports = (0, 0)
        self._commit_counter = 0

    # lifecycle

    def start(self) -> FakeHub:
        """Listen on 127.0.0.1 (port 0 the first time, the same ports again after stop())."""
        with self._lock:
            if self._servers:
                return self
            self._stopping.clear()
            self._servers = [Server(("127.0.0.1", port), self) for port in self._ports]
            self._ports = tuple(server.server_address[1] for server in self._servers)  # type: ignore[assignment]
            for server in self._servers:
                thread = threading.Thread(
                    target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name="fake-hub"
                )
                thread.start()
                self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Close the listeners and every open connection: from now on connections are refused."""
        with self._lock:
            servers, self._servers = self._servers, []
            threads, self._threads = self._threads, []
            self._stopping.set()  # wakes stalled responses
        for server in servers:
            server.shutdown()
            server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout=5)

    @property
    def running(self) -> bool:
        return bool(self._servers)

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        """http://127.0.0.1:PORT, what HF_ENDPOINT should be."""
        if not self._ports[0]:
            raise RuntimeError("FakeHub is not started")
        return f"http://127.0.0.1:{self._ports[0]}"

    @property
    def cdn_endpoint(self) -> str:
        return f"http://127.0.0.1:{self._ports[1]}"

    # content

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes | Path],
        revision_sha: str | None = None,
        branch: str = "main",
        gated: bool | Literal["auto", "manual"] = False,
        private: bool = False,
        downloads: int = 0,
        likes: int = 0,
        tags: Iterable[str] | None = None,
        trending_score: int = 0,
        title: str = "Initial commit",
    ) -> str:
        """Create a model repo with one commit on `branch`; returns the commit sha.

        `tags` are the model's tags (search filters); None gives ["gguf"] when a file ends in .gguf.
        """
        if tags is None:
            tags = ["gguf"] if any(name.endswith(".gguf") for name in files) else []
        with self._lock:
            if repo_id in self._repos:
                raise ValueError(f"{repo_id} already exists: use add_revision")
            self._repos[repo_id] = Repo(
                repo_id=repo_id,
                private=private,
                gated="auto" if gated is True else gated,
                downloads=downloads,
                likes=likes,
                tags=list(tags),
                trending_score=trending_score,
                created_at=EPOCH + timedelta(days=len(self._repos)),
            )
            return self._commit(repo_id, dict(files), revision_sha, branch, None, title)

    def add_revision(
        self,
        repo_id: str,
        files: Mapping[str, bytes | Path | None],
        revision_sha: str | None = None,
        branch: str | None = "main",
        parent: str | None = "main",
        tag: str | None = None,
        title: str = "Update",
    ) -> str:
        """Add a commit: `parent`'s files (None: none), updated by `files` (a None value deletes that file).

        Moves `branch` to it (None: the commit is reachable only by sha, or by `tag`); returns its sha.
        Unchanged files keep their blob, so two revisions share it, as on the Hub.
        """
        with self._lock:
            repo = self._repo_or_raise(repo_id)
            head = resolve(repo, parent) if parent is not None else None
            if parent is not None and head is None:
                raise ValueError(f"{repo_id} has no revision {parent!r}")
            base: dict[str, Any] = dict(head.files) if head is not None else {}
            for name, content in files.items():
                if content is None:
                    base.pop(name, None)
                else:
                    base[name] = content
            sha = self._commit(repo_id, base, revision_sha, branch, head.sha if head else None, title)
            if tag is not None:
                repo.refs[tag] = sha
            return sha

    def set_ref(self, repo_id: str, ref: str, sha: str) -> None:
        """Point a branch or tag at an existing commit."""
        with self._lock:
            repo = self._repo_or_raise(repo_id)
            if sha not in repo.commits:
                raise ValueError(f"{repo_id} has no commit {sha}")
            repo.refs[ref] = sha

    def file(self, repo_id: str, path: str, revision: str = "main") -> Blob:
        """The blob served for a file (its sha256, size, git oid, whether LFS)."""
        with self._lock:
            commit = resolve(self._repo_or_raise(repo_id), revision)
            if commit is None:
                raise KeyError(revision)
            return commit.files[path]

    def _repo_or_raise(self, repo_id: str) -> Repo:
        repo = self._repos.get(repo_id)
        if repo is None:
            raise KeyError(f"no repo {repo_id}")
        return repo

    def _commit(
        self,
        repo_id: str,
        files: dict[str, Any],
        sha: str | None,
        branch: str | None,
        parent: str | None,
        title: str,
    ) -> str:
        repo = self._repos[repo_id]
        blobs = {name: self._blob(name, content) for name, content in files.items()}
        self._commit_counter += 1
        if sha is None:
            seed = f"{repo_id}\n{parent}\n{self._commit_counter}\n" + "".join(
                f"{name}\0{blob.oid}\n" for name, blob in sorted(blobs.items())
            )
            sha = hashlib.sha1(seed.encode()).hexdigest()
        if len(sha) != 40 or any(c not in "0123456789abcdef" for c in sha):
            raise ValueError(f"a commit sha is 40 lowercase hex digits, not {sha!r}")
        date = EPOCH + timedelta(days=30, hours=self._commit_counter)
        repo.commits[sha] = Commit(sha=sha, files=blobs, parent=parent, title=title, date=date)
        if branch is not None:
            repo.refs[branch] = sha
        return sha

    def _blob(self, name: str, content: bytes | Path | Blob) -> Blob:
        if isinstance(content, Blob):
            return content
        size, sha256, git_oid = digests(content)
        lfs = name.endswith(self.lfs_suffixes) or size > self.lfs_threshold
        pointer = lfs_pointer(sha256, size)
        oid = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest() if lfs else git_oid
        blob = Blob(size=size, sha256=sha256, oid=oid, lfs=lfs, pointer_size=len(pointer), source=content)
        if lfs:
            self._blobs[sha256] = blob
        return blob

    def add_wheel(self, project: str, version: str, members: dict[str, bytes]) -> str:
        """A wheel of `members` on the PyPI index at {endpoint}/simple/; returns its file name."""
        import io
        import zipfile

        dist = project.replace("-", "_")
        name = f"{dist}-{version}-py3-none-any.whl"
        info = f"{dist}-{version}.dist-info"
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as wheel:
            for member, data in members.items():
                wheel.writestr(member, data)
            metadata = f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
            wheel.writestr(f"{info}/METADATA", metadata)
            wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            wheel.writestr(f"{info}/RECORD", "")
        with self._lock:
            self.packages.setdefault(project.lower().replace("_", "-"), {})[name] = buf.getvalue()
        return name

    # faults

    def add_fault(
        self,
        match: str | Callable[[RequestInfo], bool],
        kind: FaultKind,
        times: int | None = 1,
        *,
        method: str | None = None,
        **params: Any,
    ) -> Fault:
        """Misbehave on the next `times` matching requests (None: all of them); see the module docstring."""
        if kind not in FAULT_DEFAULTS:
            raise ValueError(f"unknown fault kind {kind!r}, expected one of {sorted(FAULT_DEFAULTS)}")
        unknown = set(params) - set(FAULT_DEFAULTS[kind])
        if unknown:
            raise TypeError(f"{kind} fault takes {sorted(FAULT_DEFAULTS[kind])}, not {sorted(unknown)}")
        if kind == "stall" and params.get("then", "continue") not in ("continue", "drop"):
            raise ValueError("a stall then does 'continue' or 'drop'")
        fault = Fault(
            match, kind, times, method.upper() if method else None, {**FAULT_DEFAULTS[kind], **params}
        )
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _take_faults(self, info: RequestInfo, body: bool) -> list[Fault]:
        """Fire the faults that apply: the first one acting before the response, or every body fault."""
        with self._lock:
            fired = []
            for fault in self._faults:
                if fault.body == body and fault.applies(info):
                    fault.hits += 1
                    fired.append(fault)
                    if not body:
                        break
            return fired

    # counters

    @property
    def log(self) -> list[RequestRecord]:
        """Every request so far, in arrival order (copies)."""
        with self._lock:
            return [replace(record) for record in self._log]

    @property
    def requests(self) -> Counter[tuple[str, str]]:
        """(method, decoded path) -> number of requests."""
        return Counter((r.method, r.path) for r in self.log)

    @property
    def bytes_sent(self) -> Counter[str]:
        """Decoded path -> body bytes written (partial bodies included: what a client really received)."""
        sent: Counter[str] = Counter()
        for record in self.log:
            sent[record.path] += record.bytes_sent
        return sent

    @property
    def ranges(self) -> list[tuple[str, str]]:
        """(path, Range header) of every request that asked for a range."""
        return [(r.path, r.range) for r in self.log if r.range]

    def count(self, path_contains: str = "", method: str | None = None) -> int:
        return sum(1 for r in self.log if path_contains in r.path and method in (None, r.method))

    def sent(self, path_contains: str = "") -> int:
        """Body bytes sent for paths containing `path_contains` (a file name: its resolve and CDN paths)."""
        return sum(r.bytes_sent for r in self.log if path_contains in r.path)

    def reset_counters(self) -> None:
        with self._lock:
            self._log.clear()

    @property
    def server_errors(self) -> list[str]:
        """Tracebacks of exceptions in the server itself (a bug here, not a fault): tests want it empty."""
        with self._lock:
            return list(self._errors)

    def raise_server_errors(self) -> None:
        errors = self.server_errors
        if errors:
            raise AssertionError("FakeHub failed while serving:\n" + "\n".join(errors))
