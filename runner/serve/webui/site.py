"""The chat page as the app mounts it: GET / for a browser, its static files, its conversation API."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from runner.serve.backend import Backend
from runner.serve.webui import routes as api
from runner.serve.webui.conversations import Conversations
from runner.serve.webui.page import STATIC, Assets, wants_page

if TYPE_CHECKING:
    from runner.serve.webui.tools import PageTools


class WebUI:
    """The page over one backend and one store (runner.serve.app.create_app's `webui`)."""

    def __init__(
        self, backend: Backend, store: Conversations, max_body: int, tools: PageTools | None = None
    ) -> None:
        self.assets = Assets()
        self._routes = api.routes(backend, store, max_body, tools)

    def wanted(self, request: Request) -> bool:
        return wants_page(request)

    def index(self, request: Request) -> Response:
        return self.assets.page(request)

    def routes(self) -> list[Route]:
        return [Route(STATIC + "{name}", self.assets.static, methods=["GET"]), *self._routes]


def open_path(method: str, path: str) -> bool:
    """What answers without the key: the page's static files (the page asks for the key itself)."""
    return method in ("GET", "HEAD") and path.startswith(STATIC)
