"""The Hub's HTTP API as the fake answers it: model info, search, tree, paths-info, resolve and the CDN.

Everything here returns a Response and never touches a socket; FakeHub inherits it (HubApi)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal
from urllib.parse import parse_qs, quote, unquote, urlencode

from tests.fakehub.repos import Blob, Commit, Repo, head_commit, resolve, sort_value


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


def error_response(status: int, code: str | None, message: str, **headers: str) -> Response:
    head = {"Content-Type": "application/json; charset=utf-8", "X-Error-Message": message, **headers}
    if code is not None:
        head["X-Error-Code"] = code
    return Response(status, head, json.dumps({"error": message}).encode())


def json_response(data: Any, **headers: str) -> Response:
    return Response(
        200, {"Content-Type": "application/json; charset=utf-8", **headers}, json.dumps(data).encode()
    )


def iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def truthy(values: list[str] | None) -> bool:
    return bool(values) and values[-1].lower() in ("1", "true", "yes")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | Literal["unsatisfiable"]:
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


class HubApi:
    """The routes; the state they read (repos, blobs, settings) is FakeHub's."""

    def route(
        self, method: str, raw_path: str, query: dict[str, list[str]], headers: Any, body: bytes
    ) -> Response:
        segments = [unquote(s) for s in raw_path.split("/")[1:]]
        if segments[:2] == ["api", "models"]:
            return self._api(method, segments[2:], query, headers, body)
        if segments and segments[0] in ("simple", "packages"):  # a PyPI index beside the Hub
            return self._pypi(segments)
        if segments and segments[0] == "cdn-lfs" and len(segments) >= 3:
            return self._cdn(segments[1], "/".join(segments[2:]), headers)
        for at in (2, 1):
            if len(segments) > at + 1 and segments[at] == "resolve":
                return self._resolve_file(
                    "/".join(segments[:at]), segments[at + 1], "/".join(segments[at + 2 :]), headers
                )
        return error_response(404, None, "Not Found")

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
            commit = resolve(repo, revision)
            if commit is None:
                return error_response(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return json_response(
                self._model_json(repo, commit, blobs=truthy(query.get("blobs")), expand=query.get("expand"))
            )
        if rest[0] in ("tree", "paths-info") and len(rest) >= 2:
            commit = resolve(repo, rest[1])
            if commit is None:
                return error_response(404, "RevisionNotFound", f"Invalid rev id: {rest[1]}")
            if rest[0] == "tree":
                return self._tree(repo, commit, "/".join(rest[2:]).strip("/"), query)
            if method == "POST":
                return self._paths_info(repo, commit, headers, body)
        return error_response(404, None, "Not Found")

    def _pypi(self, segments: list[str]) -> Response:
        """PEP 503's simple index (/simple/{project}/) and the files it links (/packages/{file})."""
        packages: dict[str, dict[str, bytes]] = getattr(self, "packages", {})
        if segments[0] == "simple" and len(segments) >= 2 and segments[1] in packages:
            links = "".join(
                f'<a href="/packages/{name}#sha256={hashlib.sha256(data).hexdigest()}">{name}</a>\n'
                for name, data in packages[segments[1]].items()
            )
            html = f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()
            return Response(200, {"Content-Type": "text/html; charset=utf-8"}, html)
        if segments[0] == "packages" and len(segments) == 2:
            for files in packages.values():
                if segments[1] in files:
                    return Response(200, {"Content-Type": "application/octet-stream"}, files[segments[1]])
        return Response(404, {"Content-Type": "text/html"}, b"<html><body>Not Found</body></html>")

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
            return None, error_response(status, "RepoNotFound", "Repository not found")
        if content and repo.gated and not allowed:
            if token is None:
                message = (
                    f"Access to model {repo_id} is restricted. You must have access to it and be "
                    "authenticated to access it. Please log in."
                )
                return None, error_response(401, "GatedRepo", message)
            message = (
                f"Access to model {repo_id} is restricted and you are not in the authorized list. "
                f"Visit https://huggingface.co/{repo_id} to ask for access."
            )
            return None, error_response(403, "GatedRepo", message)
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
            "lastModified": iso(commit.date),
            "createdAt": iso(repo.created_at),
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
                and (gated is None or truthy(gated) == bool(repo.gated))
            )

        full = truthy(query.get("full"))
        with self._lock:
            items = []
            for repo in self._repos.values():
                if wanted(repo):
                    item = self._model_json(repo, head_commit(repo), blobs=False, expand=None)
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
            items.sort(key=lambda pair: sort_value(pair[0], sort), reverse=True)  # the Hub sorts descending
        limit = int(query["limit"][-1]) if query.get("limit") else None
        rows = [item for _, item in items]
        if limit is not None:
            return json_response(rows[:limit])
        return self._page(rows, query, "/api/models", self.page_size)

    def _page(self, rows: list, query: dict[str, list[str]], path: str, size: int) -> Response:
        """One page of `rows` from the `cursor` query value, with a Link rel="next" when more follow."""
        start = int((query.get("cursor") or ["0"])[-1])
        page = rows[start : start + size]
        if start + size >= len(rows):
            return json_response(page)
        params = [(k, v) for k, values in query.items() if k != "cursor" for v in values]
        next_url = f"{self.endpoint}{quote(path)}?{urlencode([*params, ('cursor', str(start + size))])}"
        return json_response(page, Link=f'<{next_url}>; rel="next"')

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
            entry["lastCommit"] = {"id": last.sha, "title": last.title, "date": iso(last.date)}
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
            return error_response(404, "EntryNotFound", f"{path} does not exist on {commit.sha}")
        prefix = f"{path}/" if path else ""
        below = [p for p in [*commit.files, *directories] if p.startswith(prefix)]
        if not truthy(query.get("recursive")):
            below = [p for p in below if "/" not in p[len(prefix) :]]
        expand = truthy(query.get("expand"))
        rows = [self._entry(repo, commit, p, expand) for p in sorted(below)]
        raw = f"/api/models/{repo.repo_id}/tree/{commit.sha}" + (f"/{path}" if path else "")
        return self._page(rows, query, raw, 50 if expand else self.page_size)

    def _paths_info(self, repo: Repo, commit: Commit, headers: Any, body: bytes) -> Response:
        if (headers.get("Content-Type") or "").startswith("application/json"):
            form = json.loads(body or b"{}")
            paths, expand = list(form.get("paths", [])), bool(form.get("expand"))
        else:
            fields = parse_qs(body.decode(), keep_blank_values=True)
            paths, expand = fields.get("paths", []), truthy(fields.get("expand"))
        known = set(commit.files) | self._directories(commit)
        return json_response(
            [self._entry(repo, commit, p.strip("/"), expand) for p in paths if p.strip("/") in known]
        )

    # files

    def _resolve_file(self, repo_id: str, revision: str, path: str, headers: Any) -> Response:
        repo, denied = self._access(repo_id, headers, content=True)
        if denied is not None:
            return denied
        assert repo is not None
        commit = resolve(repo, revision)
        if commit is None:
            return error_response(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        blob = commit.files.get(path)
        if blob is None:
            return error_response(404, "EntryNotFound", "Entry not found", **{"X-Repo-Commit": commit.sha})
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
            return error_response(404, None, "NoSuchKey")
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
        wanted = parse_range(headers.get("Range"), blob.size)
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
