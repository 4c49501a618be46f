"""The page's static files, served from the package (runner/serve/webui/static): nothing from another
origin, nothing built at install time. Each asset is named by its content's hash (app.1a2b3c4d.js),
so it is cached for a year and a new runner's page is never mixed with an old one's; the page itself
is never cached. Each is gzipped once, at start, for the browsers that take it. The page's
Content-Security-Policy allows scripts, styles and requests from this origin only, and no inline script.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from importlib.resources import files

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

STATIC = "/runner/static/"
ASSETS = ("app.js", "markdown.js", "style.css", "icon.svg")
TYPES = {"js": "text/javascript; charset=utf-8", "css": "text/css; charset=utf-8", "svg": "image/svg+xml"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
YEAR = "public, max-age=31536000, immutable"


@dataclass(frozen=True)
class Asset:
    body: bytes
    zipped: bytes
    media: str
    cache: str


class Assets:
    """The page and its files, read from the package once."""

    def __init__(self) -> None:
        folder = files("runner.serve.webui") / "static"
        self.by_name: dict[str, Asset] = {}
        names: dict[str, str] = {}
        for name in ASSETS:
            body = (folder / name).read_bytes()
            stem, ext = name.rsplit(".", 1)
            hashed = f"{stem}.{hashlib.sha256(body).hexdigest()[:12]}.{ext}"
            names[name] = STATIC + hashed
            self.by_name[hashed] = _asset(body, TYPES[ext], YEAR)
        html = (folder / "index.html").read_text(encoding="utf-8")
        for name, url in names.items():
            html = html.replace(f"{{{{{name}}}}}", url)
        self.index = _asset(html.encode("utf-8"), "text/html; charset=utf-8", "no-cache")

    def page(self, request: Request) -> Response:
        return _send(request, self.index, SECURITY)

    async def static(self, request: Request) -> Response:
        found = self.by_name.get(request.path_params["name"])
        if found is None:
            return PlainTextResponse("no such file", status_code=404)
        return _send(request, found, {"X-Content-Type-Options": "nosniff"})


def _asset(body: bytes, media: str, cache: str) -> Asset:
    return Asset(body, gzip.compress(body, 9, mtime=0), media, cache)


def _send(request: Request, asset: Asset, headers: dict[str, str]) -> Response:
    zipped = "gzip" in request.headers.get("accept-encoding", "")
    out = {**headers, "Cache-Control": asset.cache, "Vary": "Accept-Encoding"}
    if zipped:
        out["Content-Encoding"] = "gzip"
    return Response(asset.zipped if zipped else asset.body, media_type=asset.media, headers=out)


def wants_page(request: Request) -> bool:
    """A browser asking for the page (Accept names HTML); Ollama's clients probing / get the text."""
    return "text/html" in request.headers.get("accept", "")
