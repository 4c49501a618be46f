"""One retry policy for every request runner makes to the Hub: listings, header reads, downloads, search.

A transient fault (a connection dropped or reset, a read timeout, HTTP 408/429/500/502/503/504) is
tried again; an attempt that brought new bytes resets the count and resumes at once from them; one
that brought nothing waits 1, 2, 4, then 8 s (or the server's Retry-After, at most 60 s) first. After
TRIES attempts in a row that brought nothing, the path gives up: at most 15 s of backoff (plus any
Retry-After) and TRIES read timeouts (HF_HUB_DOWNLOAD_TIMEOUT, huggingface_hub's 10 s by default)
before the one-line error, however the faults are spread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
TRIES = 5  # attempts in a row that bring no new byte before giving up
FIRST_WAIT_S = 1.0
MAX_WAIT_S = 8.0
MAX_RETRY_AFTER_S = 60.0
sleep: Callable[[float], None] = time.sleep  # tests make waits instant and record them


class TransientStatus(Exception):
    """A status worth asking again for (RETRY_STATUS); carries the server's Retry-After, if any."""

    def __init__(self, status: int, retry_after: str | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry_after = retry_after


class Backoff:
    """Counts attempts that brought nothing and waits between them; see the module's docstring."""

    def __init__(self) -> None:
        self.failures = 0
        self._wait = FIRST_WAIT_S

    def again(self, exc: BaseException, *, progressed: bool = False) -> bool:
        """After a transient failure: True once it has waited as due, False when it is time to give up."""
        if progressed:
            self.failures, self._wait = 0, FIRST_WAIT_S
            return True
        self.failures += 1
        if self.failures >= TRIES:
            return False
        retry_after = exc.retry_after if isinstance(exc, TransientStatus) else None
        if retry_after is not None and retry_after.strip().isdigit():
            sleep(min(float(retry_after), MAX_RETRY_AFTER_S))
        else:
            sleep(self._wait)
            self._wait = min(self._wait * 2, MAX_WAIT_S)
        return True


def check_status(response: Any) -> None:
    """Raise TransientStatus for a status worth retrying (the body is left unread)."""
    if response.status_code in RETRY_STATUS:
        raise TransientStatus(response.status_code, response.headers.get("Retry-After"))


def transient_errors() -> tuple[type[BaseException], ...]:
    """What a retry may cure: TransientStatus and the HTTP stack's network errors (httpx2 under
    huggingface_hub 2.x, httpx before), timeouts included."""
    import importlib

    for name in ("httpx2", "httpx"):
        try:
            module: Any = importlib.import_module(name)
        except ImportError:
            continue
        return (TransientStatus, module.TransportError, module.StreamError)
    return (TransientStatus, ConnectionError, TimeoutError)


def retrying(call: Callable[[], Any], *, status_of: Callable[[BaseException], Any] | None = None) -> Any:
    """call() under the policy, for a request that returns nothing partial (an API call): status_of
    maps an exception to (status, Retry-After) for HTTP errors the client raises itself."""
    backoff = Backoff()
    transient = transient_errors()
    while True:
        try:
            return call()
        except transient as exc:
            if not backoff.again(exc):
                raise
        except Exception as exc:
            found = status_of(exc) if status_of is not None else None
            if found is None or found[0] not in RETRY_STATUS:
                raise
            if not backoff.again(TransientStatus(*found)):
                raise
