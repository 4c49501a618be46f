"""A fake Hugging Face Hub: a real HTTP server on 127.0.0.1 that the real `huggingface_hub` client talks to.

Stdlib only, so tests and scripts (the download benchmark) can both import it:

    from hubserver import FakeHub, pointed_at        # tests/ is on sys.path under pytest

    with FakeHub() as hub, pointed_at(hub.endpoint, cache_dir=tmp / "hub"):
        sha = hub.add_repo("user/tiny-GGUF", {"tiny.gguf": Path("model.gguf"), "README.md": b"# tiny"})
        path = huggingface_hub.hf_hub_download("user/tiny-GGUF", "tiny.gguf")
        hub.add_fault("tiny.gguf", "drop", drop_after=1_000_000)   # the next body is cut after 1 MB

What it answers, as the Hub does (model repos only):
    GET  /api/models?search=&filter=&author=&sort=&limit=&full=&expand=   (paginated, Link header)
    GET  /api/models/{repo}[/revision/{rev}][?blobs=true]   (siblings, sha; sizes, lfs sha256 with blobs)
    GET  /api/models/{repo}/tree/{rev}[/{path}]?recursive=&expand=
    POST /api/models/{repo}/paths-info/{rev}                 (form or JSON: paths, expand)
    HEAD/GET /{repo}/resolve/{rev}/{path}   small files: 200/206, ETag = quoted git blob id;
                                            LFS files: 302 to the CDN listener, X-Linked-Etag/-Size
    HEAD/GET {cdn_endpoint}/cdn-lfs/{sha256}/{path}   LFS bytes: Range, 206, 416, ETag = quoted sha256
Files named *.gguf (`lfs_suffixes`) or larger than `lfs_threshold` (10 MiB) are LFS. Xet is never
advertised (no X-Xet-* header, no xetHash), so huggingface_hub downloads over plain HTTP even with hf_xet.

Why the CDN is a second port: on the HEAD it sends before a download, huggingface_hub follows only
redirects that stay on the same origin (scheme, host, port), then reads X-Repo-Commit and the ETag from
the *final* response. The Hub's CDN is another host: the client stops at the 302, takes the metadata
from it, drops the Authorization header and GETs the Location. A second port is another origin, so the
exchange is the Hub's. `lfs_redirect="relative"` sends a relative Location instead: the client follows
it, finds no X-Repo-Commit on the CDN answer and fails (FileMetadataError), which is what that mode
shows; `lfs_redirect="none"` serves LFS bytes straight from /resolve.

Pointing huggingface_hub at it. huggingface_hub reads HF_ENDPOINT once, when `huggingface_hub.constants`
is imported, and derives HUGGINGFACE_CO_URL_TEMPLATE (hf_hub_url, hf_hub_download) from it; the
module-level functions (`huggingface_hub.model_info`, `list_models`, ...) are methods of one `HfApi()`
built at import time with that endpoint. So:
  * another process: `subprocess.run(..., env=hf_env(hub.endpoint, cache_dir))` (HF_ENDPOINT,
    HF_HUB_CACHE, a token path that does not exist; HF_TOKEN and HF_HUB_OFFLINE removed);
  * this process, huggingface_hub already imported: `with pointed_at(hub.endpoint, cache_dir):` patches
    constants.ENDPOINT, .HUGGINGFACE_CO_URL_TEMPLATE, .HF_HUB_CACHE, the token paths and the offline
    flag, and `huggingface_hub.hf_api.api.endpoint`; mirrors them in os.environ (for subprocesses);
    closes the shared HTTP client on entry and exit; restores everything on exit. Passing
    `endpoint=hub.endpoint` to hf_hub_download / HfApi(endpoint=...) also works, without patching;
  * pytest: `fake_hub = fake_hub_fixture()` in a conftest or test module: a started hub per test,
    pointed at, with its own cache (`hub_cache_dir()`), failing the test if the server itself crashed.
    `instant_backoff()` makes huggingface_hub's retry waits instant and records them.

Faults, per test: `hub.add_fault(match, kind, times=1, method=None, **params)`; `match` is a substring
of the decoded URL path, or a predicate on a RequestInfo. Kinds and their params:
    "status"      status=503, error_code=None, message=None, retry_after=None, headers=None
                  (gated: status=401 or 403, error_code="GatedRepo")
    "drop"        drop_after=N | "random" | callable(body_length) -> N; reset=False (True: RST, not FIN)
    "corrupt"     offset=0 (into the body), data=b"..." to overwrite, or length=1 bytes to bit-flip
    "stall"       seconds=S, after=0 (body bytes first; None: before the status line),
                  then="continue" | "drop"
    "disconnect"  close without answering; reset=False
Body faults (drop, corrupt, stall with `after` set) only fire on responses with a body (not HEAD, not
3xx): `add_fault("model.gguf", "drop", drop_after=N)` cuts the file's bytes, not the redirect before
them. `times=None` fires forever. Counters: `hub.requests` (method, path) -> n, `hub.bytes_sent`
path -> body bytes, `hub.ranges` [(path, Range)], `hub.log` (every RequestRecord), `hub.count(...)`,
`hub.sent(...)`.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import struct
import sys
import tempfile
import threading
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

FaultKind = Literal["status", "drop", "corrupt", "stall", "disconnect"]
LfsRedirect = Literal["cdn", "relative", "none"]

CHUNK = 1024 * 1024
_EPOCH = datetime(2024, 1, 1, tzinfo=timezone.utc)


# --- content ------------------------------------------------------------------------------------------------


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


def _digests(source: bytes | Path) -> tuple[int, str, str]:
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


def _head(repo: Repo) -> Commit:
    """What a listing describes: main, else the newest commit."""
    sha = repo.refs.get("main")
    return repo.commits[sha] if sha else max(repo.commits.values(), key=lambda c: c.date)


def _sort_value(repo: Repo, key: str) -> Any:
    values = {
        "downloads": repo.downloads,
        "likes": repo.likes,
        "createdAt": repo.created_at,
        "lastModified": _head(repo).date,
    }
    return values.get(key, repo.trending_score)


# --- requests, faults, records ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestInfo:
    """What a fault predicate sees: the method, the decoded path, the query, the headers (any case)."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Message


@dataclass
class Fault:
    match: str | Callable[[RequestInfo], bool]
    kind: FaultKind
    times: int | None
    method: str | None
    params: dict[str, Any]
    hits: int = 0

    @property
    def body(self) -> bool:
        """Whether it acts on a response body (else it acts before anything is sent)."""
        return self.kind in ("drop", "corrupt") or (self.kind == "stall" and self.params["after"] is not None)

    def applies(self, info: RequestInfo) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method is not None and self.method != info.method:
            return False
        return self.match in info.path if isinstance(self.match, str) else bool(self.match(info))


_FAULT_DEFAULTS: dict[str, dict[str, Any]] = {
    "status": {"status": 503, "error_code": None, "message": None, "retry_after": None, "headers": None},
    "drop": {"drop_after": 0, "reset": False},
    "corrupt": {"offset": 0, "data": None, "length": 1},
    "stall": {"seconds": 1.0, "after": 0, "then": "continue"},
    "disconnect": {"reset": False},
}


@dataclass
class RequestRecord:
    method: str
    path: str  # decoded, without the query
    query: str
    range: str | None
    authorization: bool
    port: int
    status: int | None = None
    bytes_sent: int = 0  # body bytes written to the socket
    fault: str | None = None  # kinds of the faults that fired, comma-separated


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    blob: Blob | None = None  # when set, the body is blob[start:end]
    start: int = 0
    end: int = 0

    @property
    def length(self) -> int:
        return self.end - self.start if self.blob is not None else len(self.body)

    def chunks(self) -> Iterator[bytes]:
        if self.blob is not None:
            yield from self.blob.chunks(self.start, self.end)
        elif self.body:
            yield self.body


def _error(status: int, code: str | None, message: str, **headers: str) -> Response:
    head = {"Content-Type": "application/json; charset=utf-8", "X-Error-Message": message, **headers}
    if code is not None:
        head["X-Error-Code"] = code
    return Response(status, head, json.dumps({"error": message}).encode())


def _json(data: Any, **headers: str) -> Response:
    return Response(
        200, {"Content-Type": "application/json; charset=utf-8", **headers}, json.dumps(data).encode()
    )


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _truthy(values: list[str] | None) -> bool:
    return bool(values) and values[-1].lower() in ("1", "true", "yes")


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None | Literal["unsatisfiable"]:
    """[start, end) of a single `bytes=` range; None when absent or not one we honour (serve it all)."""
    if not header or "," in header or not header.strip().lower().startswith("bytes="):
        return None
    first, _, last = header.strip()[6:].partition("-")
    try:
        if not first:  # suffix: the last N bytes
            n = int(last)
            return (max(size - n, 0), size) if n > 0 and size > 0 else "unsatisfiable"
        start = int(first)
        end = min(int(last) + 1, size) if last else size
    except ValueError:
        return None
    if start >= size or end <= start:
        return "unsatisfiable"
    return start, end


# --- the hub ------------------------------------------------------------------------------------------------


class FakeHub:
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
        self._blobs: dict[str, Blob] = {}  # sha256 -> blob, what the CDN serves
        self._faults: list[Fault] = []
        self._log: list[RequestRecord] = []
        self._errors: list[str] = []
        self._servers: list[_Server] = []
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
            self._servers = [_Server(("127.0.0.1", port), self) for port in self._ports]
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
                created_at=_EPOCH + timedelta(days=len(self._repos)),
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
            head = self._resolve(repo, parent) if parent is not None else None
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
            commit = self._resolve(self._repo_or_raise(repo_id), revision)
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
        date = _EPOCH + timedelta(days=30, hours=self._commit_counter)
        repo.commits[sha] = Commit(sha=sha, files=blobs, parent=parent, title=title, date=date)
        if branch is not None:
            repo.refs[branch] = sha
        return sha

    def _blob(self, name: str, content: bytes | Path | Blob) -> Blob:
        if isinstance(content, Blob):
            return content
        size, sha256, git_oid = _digests(content)
        lfs = name.endswith(self.lfs_suffixes) or size > self.lfs_threshold
        pointer = lfs_pointer(sha256, size)
        oid = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest() if lfs else git_oid
        blob = Blob(size=size, sha256=sha256, oid=oid, lfs=lfs, pointer_size=len(pointer), source=content)
        if lfs:
            self._blobs[sha256] = blob
        return blob

    @staticmethod
    def _resolve(repo: Repo, revision: str) -> Commit | None:
        """A branch, a tag, a full commit sha or a unique prefix of one (7 digits or more)."""
        sha = repo.refs.get(revision, revision)
        if sha in repo.commits:
            return repo.commits[sha]
        if len(revision) >= 7:
            found = [c for s, c in repo.commits.items() if s.startswith(revision.lower())]
            if len(found) == 1:
                return found[0]
        return None

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
        if kind not in _FAULT_DEFAULTS:
            raise ValueError(f"unknown fault kind {kind!r}, expected one of {sorted(_FAULT_DEFAULTS)}")
        unknown = set(params) - set(_FAULT_DEFAULTS[kind])
        if unknown:
            raise TypeError(f"{kind} fault takes {sorted(_FAULT_DEFAULTS[kind])}, not {sorted(unknown)}")
        if kind == "stall" and params.get("then", "continue") not in ("continue", "drop"):
            raise ValueError("a stall then does 'continue' or 'drop'")
        fault = Fault(
            match, kind, times, method.upper() if method else None, {**_FAULT_DEFAULTS[kind], **params}
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

    # routing: everything below returns a Response and never touches a socket

    def _route(
        self, method: str, raw_path: str, query: dict[str, list[str]], headers: Any, body: bytes
    ) -> Response:
        segments = [unquote(s) for s in raw_path.split("/")[1:]]
        if segments[:2] == ["api", "models"]:
            return self._api(method, segments[2:], query, headers, body)
        if segments and segments[0] == "cdn-lfs" and len(segments) >= 3:
            return self._cdn(segments[1], "/".join(segments[2:]), headers)
        for at in (2, 1):
            if len(segments) > at + 1 and segments[at] == "resolve":
                return self._resolve_file(
                    "/".join(segments[:at]), segments[at + 1], "/".join(segments[at + 2 :]), headers
                )
        return _error(404, None, "Not Found")

    def _api(self, method: str, segments: list[str], query: dict, headers: Any, body: bytes) -> Response:
        if not segments or segments == [""]:
            return self._search(query, headers)
        repo_id, rest = self._split_repo(segments)
        repo, denied = self._access(repo_id, headers, content=False)
        if denied is not None:
            return denied
        assert repo is not None
        if not rest or (rest[0] == "revision" and len(rest) == 2):
            revision = rest[1] if rest else "main"
            commit = self._resolve(repo, revision)
            if commit is None:
                return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return _json(
                self._model_json(repo, commit, blobs=_truthy(query.get("blobs")), expand=query.get("expand"))
            )
        if rest[0] in ("tree", "paths-info") and len(rest) >= 2:
            commit = self._resolve(repo, rest[1])
            if commit is None:
                return _error(404, "RevisionNotFound", f"Invalid rev id: {rest[1]}")
            if rest[0] == "tree":
                return self._tree(repo, commit, "/".join(rest[2:]).strip("/"), query)
            if method == "POST":
                return self._paths_info(repo, commit, headers, body)
        return _error(404, None, "Not Found")

    def _split_repo(self, segments: list[str]) -> tuple[str, list[str]]:
        """Repo ids are "name" or "owner/name": a known one wins, else two segments unless a verb follows."""
        if len(segments) >= 2 and "/".join(segments[:2]) in self._repos:
            return "/".join(segments[:2]), segments[2:]
        if segments[0] in self._repos or (
            len(segments) >= 2 and segments[1] in ("revision", "tree", "paths-info")
        ):
            return segments[0], segments[1:]
        return "/".join(segments[:2]), segments[2:]

    def _access(self, repo_id: str, headers: Any, content: bool) -> tuple[Repo | None, Response | None]:
        """The repo, or the Hub's answer instead: RepoNotFound (also for private), GatedRepo for files."""
        auth = headers.get("Authorization") or ""
        token = auth[7:] if auth.lower().startswith("bearer ") else None
        allowed = token is not None and token in self.allowed_tokens
        repo = self._repos.get(repo_id)
        if repo is None or (repo.private and not allowed):
            status = 404 if token is not None or repo is None else 401
            return None, _error(status, "RepoNotFound", "Repository not found")
        if content and repo.gated and not allowed:
            if token is None:
                message = (
                    f"Access to model {repo_id} is restricted. You must have access to it and be "
                    "authenticated to access it. Please log in."
                )
                return None, _error(401, "GatedRepo", message)
            message = (
                f"Access to model {repo_id} is restricted and you are not in the authorized list. "
                f"Visit https://huggingface.co/{repo_id} to ask for access."
            )
            return None, _error(403, "GatedRepo", message)
        return repo, None

    def _visible(self, repo: Repo, headers: Any) -> bool:
        return self._access(repo.repo_id, headers, content=False)[1] is None

    # model info and search

    def _model_json(self, repo: Repo, commit: Commit, *, blobs: bool, expand: list[str] | None) -> dict:
        siblings = []
        for name, blob in sorted(commit.files.items()):
            sibling: dict[str, Any] = {"rfilename": name}
            if blobs:
                sibling.update(blobId=blob.oid, size=blob.size)
                if blob.lfs:
                    sibling["lfs"] = {
                        "sha256": blob.sha256,
                        "size": blob.size,
                        "pointerSize": blob.pointer_size,
                    }
            siblings.append(sibling)
        data = {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0] if "/" in repo.repo_id else None,
            "sha": commit.sha,
            "lastModified": _iso(commit.date),
            "createdAt": _iso(repo.created_at),
            "private": repo.private,
            "disabled": False,
            "gated": repo.gated,
            "downloads": repo.downloads,
            "likes": repo.likes,
            "trendingScore": repo.trending_score,
            "tags": list(repo.tags),
            "library_name": "gguf" if "gguf" in repo.tags else None,
            "siblings": siblings,
            "usedStorage": sum(blob.size for blob in commit.files.values()),
        }
        if expand:
            keep = {"_id", "id", *expand}
            data = {key: value for key, value in data.items() if key in keep}
        return data

    def _search(self, query: dict[str, list[str]], headers: Any) -> Response:
        def wanted(repo: Repo) -> bool:
            search = (query.get("search") or [""])[-1].lower()
            author = (query.get("author") or [None])[-1]
            gated = query.get("gated")
            return (
                self._visible(repo, headers)
                and search in repo.repo_id.lower()
                and (author is None or repo.repo_id.startswith(f"{author}/"))
                and all(tag in repo.tags for tag in query.get("filter", []))
                and (gated is None or _truthy(gated) == bool(repo.gated))
            )

        full = _truthy(query.get("full"))
        with self._lock:
            items = []
            for repo in self._repos.values():
                if wanted(repo):
                    item = self._model_json(repo, _head(repo), blobs=False, expand=None)
                    if not full:  # a listing carries fewer fields than model_info, as on the Hub
                        for key in (
                            "sha",
                            "siblings",
                            "lastModified",
                            "gated",
                            "disabled",
                            "author",
                            "usedStorage",
                        ):
                            item.pop(key, None)
                    if query.get("expand"):
                        item = {k: v for k, v in item.items() if k in {"_id", "id", *query["expand"]}}
                    items.append((repo, item))
            sort = (query.get("sort") or ["trendingScore"])[-1]
            items.sort(key=lambda pair: _sort_value(pair[0], sort), reverse=True)  # the Hub sorts descending
        limit = int(query["limit"][-1]) if query.get("limit") else None
        rows = [item for _, item in items]
        if limit is not None:
            return _json(rows[:limit])
        return self._page(rows, query, "/api/models", self.page_size)

    def _page(self, rows: list, query: dict[str, list[str]], path: str, size: int) -> Response:
        """One page of `rows` from the `cursor` query value, with a Link rel="next" when more follow."""
        start = int((query.get("cursor") or ["0"])[-1])
        page = rows[start : start + size]
        if start + size >= len(rows):
            return _json(page)
        params = [(k, v) for k, values in query.items() if k != "cursor" for v in values]
        next_url = f"{self.endpoint}{quote(path)}?{urlencode([*params, ('cursor', str(start + size))])}"
        return _json(page, Link=f'<{next_url}>; rel="next"')

    # tree and paths-info

    def _entry(self, repo: Repo, commit: Commit, path: str, expand: bool) -> dict:
        blob = commit.files.get(path)
        if blob is None:  # a directory
            inside = sorted((p, b.oid) for p, b in commit.files.items() if p.startswith(path + "/"))
            tree_oid = hashlib.sha1(repr(inside).encode()).hexdigest()
            entry: dict[str, Any] = {"type": "directory", "oid": tree_oid, "size": 0, "path": path}
        else:
            entry = {"type": "file", "oid": blob.oid, "size": blob.size, "path": path}
            if blob.lfs:
                entry["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": blob.pointer_size}
        if expand:
            last = self._last_change(repo, commit, path)
            entry["lastCommit"] = {"id": last.sha, "title": last.title, "date": _iso(last.date)}
            if blob is not None:
                entry["securityFileStatus"] = {
                    "status": "safe",
                    "avScan": {"virusFound": False, "virusNames": None},
                    "pickleImportScan": None,
                }
        return entry

    def _last_change(self, repo: Repo, commit: Commit, path: str) -> Commit:
        def state(c: Commit) -> list:
            return sorted((p, b.oid) for p, b in c.files.items() if p == path or p.startswith(path + "/"))

        while commit.parent is not None and state(repo.commits[commit.parent]) == state(commit):
            commit = repo.commits[commit.parent]
        return commit

    @staticmethod
    def _directories(commit: Commit) -> set[str]:
        return {name.rsplit("/", i)[0] for name in commit.files for i in range(1, name.count("/") + 1)}

    def _tree(self, repo: Repo, commit: Commit, path: str, query: dict[str, list[str]]) -> Response:
        directories = self._directories(commit)
        if path and path not in directories:
            return _error(404, "EntryNotFound", f"{path} does not exist on {commit.sha}")
        prefix = f"{path}/" if path else ""
        below = [p for p in [*commit.files, *directories] if p.startswith(prefix)]
        if not _truthy(query.get("recursive")):
            below = [p for p in below if "/" not in p[len(prefix) :]]
        expand = _truthy(query.get("expand"))
        rows = [self._entry(repo, commit, p, expand) for p in sorted(below)]
        raw = f"/api/models/{repo.repo_id}/tree/{commit.sha}" + (f"/{path}" if path else "")
        return self._page(rows, query, raw, 50 if expand else self.page_size)

    def _paths_info(self, repo: Repo, commit: Commit, headers: Any, body: bytes) -> Response:
        if (headers.get("Content-Type") or "").startswith("application/json"):
            form = json.loads(body or b"{}")
            paths, expand = list(form.get("paths", [])), bool(form.get("expand"))
        else:
            fields = parse_qs(body.decode(), keep_blank_values=True)
            paths, expand = fields.get("paths", []), _truthy(fields.get("expand"))
        known = set(commit.files) | self._directories(commit)
        return _json(
            [self._entry(repo, commit, p.strip("/"), expand) for p in paths if p.strip("/") in known]
        )

    # files

    def _resolve_file(self, repo_id: str, revision: str, path: str, headers: Any) -> Response:
        repo, denied = self._access(repo_id, headers, content=True)
        if denied is not None:
            return denied
        assert repo is not None
        commit = self._resolve(repo, revision)
        if commit is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        blob = commit.files.get(path)
        if blob is None:
            return _error(404, "EntryNotFound", "Entry not found", **{"X-Repo-Commit": commit.sha})
        head = {"X-Repo-Commit": commit.sha, "Accept-Ranges": "bytes"}
        if not blob.lfs:
            return self._file_response(blob, headers, {**head, "ETag": f'"{blob.oid}"'})
        head.update(
            {"ETag": f'"{blob.sha256}"', "X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(blob.size)}
        )
        if self.lfs_redirect == "none":
            return self._file_response(blob, headers, head)
        location = f"/cdn-lfs/{blob.sha256}/{quote(path)}"
        if self.lfs_redirect == "cdn":
            location = self.cdn_endpoint + location
        head.update({"Location": location, "Content-Type": "text/plain; charset=utf-8"})
        return Response(302, head, f"Found. Redirecting to {location}".encode())

    def _cdn(self, sha256: str, path: str, headers: Any) -> Response:
        blob = self._blobs.get(sha256)
        if blob is None:
            return _error(404, None, "NoSuchKey")
        name = path.rsplit("/", 1)[-1]
        disposition = f"attachment; filename*=UTF-8''{quote(name)}; filename=\"{name}\";"
        return self._file_response(
            blob,
            headers,
            {"ETag": f'"{sha256}"', "Accept-Ranges": "bytes", "Content-Disposition": disposition},
        )

    @staticmethod
    def _file_response(blob: Blob, headers: Any, head: dict[str, str]) -> Response:
        head = {"Content-Type": "application/octet-stream", **head}
        wanted = _parse_range(headers.get("Range"), blob.size)
        if wanted == "unsatisfiable":
            return Response(416, {**head, "Content-Range": f"bytes */{blob.size}"})
        if wanted is None:
            return Response(200, head, blob=blob, start=0, end=blob.size)
        start, end = wanted
        return Response(
            206,
            {**head, "Content-Range": f"bytes {start}-{end - 1}/{blob.size}"},
            blob=blob,
            start=start,
            end=end,
        )


# --- the HTTP side ------------------------------------------------------------------------------------------


def _damage(piece: bytes, position: int, damage_at: list[tuple[int, bytes | None, int]]) -> bytes:
    """`piece` (the body bytes from `position`) with each (offset, overwrite, flip length) applied."""
    buf = bytearray(piece)
    for offset, data, flip in damage_at:
        end = offset + (len(data) if data is not None else flip)
        for i in range(max(offset, position), min(end, position + len(buf))):
            buf[i - position] = data[i - offset] if data is not None else buf[i - position] ^ 0xFF
    return bytes(buf)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck handler never keeps the interpreter alive
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], hub: FakeHub) -> None:
        self.hub = hub
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, OSError):  # the client went away, or a fault cut the connection
            return
        with self.hub._lock:
            self.hub._errors.append(traceback.format_exc())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        self.timeout = self.server.hub.request_timeout
        super().setup()
        with self.server.hub._lock:
            self.server.hub._connections.add(self.connection)

    def finish(self) -> None:
        with self.server.hub._lock:
            self.server.hub._connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        hub = self.server.hub
        split = urlsplit(self.path)
        query = parse_qs(split.query, keep_blank_values=True)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        info = RequestInfo(method, unquote(split.path), query, self.headers)
        record = RequestRecord(
            method=method,
            path=info.path,
            query=split.query,
            range=self.headers.get("Range"),
            authorization="Authorization" in self.headers,
            port=self.server.server_address[1],
        )
        with hub._lock:
            hub._log.append(record)

        for fault in hub._take_faults(info, body=False):
            record.fault = fault.kind
            if fault.kind == "disconnect":
                return self._cut(fault.params["reset"])
            if fault.kind == "stall":
                hub._stopping.wait(fault.params["seconds"])
                if fault.params["then"] == "drop" or hub._stopping.is_set():
                    return self._cut(False)
            if fault.kind == "status":
                return self._send(self._status_fault(fault.params), record, info)

        try:
            with hub._lock:
                response = hub._route(method, split.path, query, self.headers, body)
        except Exception:
            with hub._lock:
                hub._errors.append(traceback.format_exc())
            response = _error(500, None, "FakeHub crashed: see hub.server_errors")
        self._send(response, record, info)

    @staticmethod
    def _status_fault(params: dict[str, Any]) -> Response:
        status = params["status"]
        message = params["message"] or f"Injected HTTP {status}"
        extra = dict(params["headers"] or {})
        if params["retry_after"] is not None:
            extra["Retry-After"] = str(params["retry_after"])
        return _error(status, params["error_code"], message, **extra)

    def _send(self, response: Response, record: RequestRecord, info: RequestInfo) -> None:
        hub = self.server.hub
        record.status = response.status  # before the client can see it: counters never lag behind the client
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(response.length))
        self.send_header("X-Request-Id", f"Root={uuid.uuid4()}")
        self.end_headers()
        if info.method == "HEAD" or response.length == 0:
            return
        faults = [] if 300 <= response.status < 400 else hub._take_faults(info, body=True)
        if faults:
            record.fault = ",".join(filter(None, [record.fault, *(f.kind for f in faults)]))
        self._stream(response, faults, record)

    def _stream(self, response: Response, faults: list[Fault], record: RequestRecord) -> None:
        """Write the body, cutting, corrupting and stalling it where the faults say."""
        hub = self.server.hub
        length = response.length
        cut_at, reset = length + 1, False
        stalls: list[tuple[int, float, bool]] = []  # (offset, seconds, drop after)
        damage_at: list[tuple[int, bytes | None, int]] = []  # (offset, overwrite, flip length)
        for fault in faults:
            p = fault.params
            if fault.kind == "drop":
                n = p["drop_after"]
                if n == "random":
                    with hub._lock:
                        n = hub._rng.randrange(1, length) if length > 1 else 0
                elif callable(n):
                    n = n(length)
                if n < cut_at:
                    cut_at, reset = int(n), p["reset"]
            elif fault.kind == "stall":
                stalls.append((p["after"], p["seconds"], p["then"] == "drop"))
            else:
                damage_at.append((p["offset"], p["data"], p["length"]))
        stalls.sort()

        position = 0
        for chunk in response.chunks():
            while chunk:
                if stalls and stalls[0][0] <= position:
                    _, seconds, then_drop = stalls.pop(0)
                    hub._stopping.wait(seconds)
                    if then_drop or hub._stopping.is_set():
                        return self._cut(False)
                    continue
                if position >= cut_at:
                    return self._cut(reset)
                stop = min(len(chunk), cut_at - position, (stalls[0][0] - position) if stalls else len(chunk))
                piece, chunk = chunk[:stop], chunk[stop:]
                if damage_at:
                    piece = _damage(piece, position, damage_at)
                with hub._lock:
                    record.bytes_sent += len(piece)  # counted before it is written, for the same reason
                self.wfile.write(piece)
                position += len(piece)
        if position >= cut_at:
            self._cut(reset)

    def _cut(self, reset: bool) -> None:
        """End the connection mid-response: a FIN (the client sees a short body) or, with `reset`, an RST."""
        self.close_connection = True
        try:
            if reset:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.rfile.close()
                self.connection.close()
            else:
                self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


# --- pointing huggingface_hub at it -------------------------------------------------------------------------

_DROPPED_ENV = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_OIDC_RESOURCE",
)
_NO_TOKEN_PATH = Path(tempfile.gettempdir()) / f"fakehub-no-token-{os.getpid()}" / "token"


def hf_env(endpoint: str, cache_dir: Path | str | None = None, base: Mapping[str, str] | None = None) -> dict:
    """Environment for a process whose huggingface_hub should use `endpoint` (and `cache_dir`), no token."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _DROPPED_ENV}
    env.update(HF_ENDPOINT=endpoint, HF_TOKEN_PATH=str(_NO_TOKEN_PATH), HF_HUB_DISABLE_TELEMETRY="1")
    if cache_dir is not None:
        env["HF_HUB_CACHE"] = str(cache_dir)
    return env


@contextmanager
def pointed_at(endpoint: str, cache_dir: Path | str | None = None) -> Iterator[None]:
    """Point this process's (already imported) huggingface_hub, and its future subprocesses, at `endpoint`."""
    from huggingface_hub import constants, hf_api
    from huggingface_hub.utils import _http

    patches: dict[str, Any] = {
        "ENDPOINT": endpoint,
        "HUGGINGFACE_CO_URL_TEMPLATE": endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        "HF_TOKEN_PATH": str(_NO_TOKEN_PATH),
        "HF_STORED_TOKENS_PATH": str(_NO_TOKEN_PATH.with_name("stored_tokens")),
        "HF_HUB_OFFLINE": False,
        "HF_HUB_DISABLE_TELEMETRY": True,
    }
    if cache_dir is not None:
        patches["HF_HUB_CACHE"] = str(cache_dir)
    saved_constants = {name: getattr(constants, name) for name in patches}
    saved_endpoint = hf_api.api.endpoint
    saved_env = dict(os.environ)
    _http.close_session()
    try:
        for name, value in patches.items():
            setattr(constants, name, value)
        hf_api.api.endpoint = endpoint
        os.environ.clear()
        os.environ.update(hf_env(endpoint, cache_dir, base=saved_env))
        yield
    finally:
        _http.close_session()
        for name, value in saved_constants.items():
            setattr(constants, name, value)
        hf_api.api.endpoint = saved_endpoint
        os.environ.clear()
        os.environ.update(saved_env)


@contextmanager
def instant_backoff() -> Iterator[list[float]]:
    """Make huggingface_hub's retry waits instant; yields the seconds it asked to wait, in order.

    Its backoff (1, 2, 4, 8, 8 s: 23 s before giving up on an unreachable Hub) and its 1 s pause before
    resuming a cut download both go through `time.sleep` in huggingface_hub.utils._http and .file_download.
    """
    from types import SimpleNamespace

    from huggingface_hub import file_download
    from huggingface_hub.utils import _http

    waits: list[float] = []
    fake_time = SimpleNamespace(sleep=waits.append)
    saved = _http.time, file_download.time
    _http.time = file_download.time = fake_time  # type: ignore[assignment]
    try:
        yield waits
    finally:
        _http.time, file_download.time = saved


def hub_cache_dir() -> Path:
    """The huggingface_hub cache the process uses now (the fixture's own, inside fake_hub_fixture)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def fake_hub_fixture(*, scope: str = "function", name: str | None = None, **hub_options: Any) -> Any:
    """A pytest fixture: a started FakeHub that huggingface_hub points at, with a fresh cache; stopped after.

    # conftest.py
    from hubserver import fake_hub_fixture
    fake_hub = fake_hub_fixture()                  # or fake_hub_fixture(scope="module", lfs_threshold=...)
    """
    import pytest

    @pytest.fixture(scope=scope, name=name)  # type: ignore[call-overload]
    def fake_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
        cache = tmp_path_factory.mktemp("hf-hub-cache")
        with FakeHub(**hub_options) as hub, pointed_at(hub.endpoint, cache_dir=cache):
            yield hub
        hub.raise_server_errors()

    return fake_hub
