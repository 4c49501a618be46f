"""Where a header's bytes come from: RangeSource, random access to a file's bytes, and its three
kinds: BytesSource (bytes in memory), FileSource (a local file) and HTTPSource (a remote file read
with HTTP Range requests, through huggingface_hub's session, in growing cached blocks). httpx and
huggingface_hub are imported only when a URL is read.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from runner import retry
from runner.errors import DownloadError, ModelNotFound
from runner.gguf.header import UINT64_MAX, GGUFError

if TYPE_CHECKING:
    import httpx2

_CONTENT_RANGE = re.compile(r"bytes (?:(\d+)-\d+|\*)/(\d+|\*)")  # "bytes A-B/N", "bytes */N"


class RangeSource(Protocol):
    """Random access to the bytes of a file, local or remote."""

    name: str  # for messages

    def read_at(self, offset: int, size: int) -> bytes:
        """The bytes at [offset, offset + size); fewer at the end of the file."""
        ...

    @property
    def size(self) -> int | None:
        """The file's total size, when known."""
        ...


class BytesSource:
    """Header bytes already in memory; size_known=False acts like a server that gives no size."""

    def __init__(self, data: bytes, size_known: bool = True, name: str = "<bytes>") -> None:
        self.name = name
        self.data = data
        self.size_known = size_known

    @property
    def size(self) -> int | None:
        return len(self.data) if self.size_known else None

    def read_at(self, offset: int, size: int) -> bytes:
        return self.data[offset : offset + size]


class FileSource:
    """A local file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.name = str(path)
        try:
            st = self.path.stat()
        except OSError:
            raise ModelNotFound(f"no such file: {self.name}") from None
        if stat.S_ISDIR(st.st_mode):
            raise ModelNotFound(f"{self.name} is a directory, not a model file (a .gguf)")
        self.size: int = st.st_size
        self.stat = st

    def read_at(self, offset: int, size: int) -> bytes:
        try:
            with self.path.open("rb") as f:
                f.seek(offset)
                return f.read(size)
        except OSError as exc:
            raise GGUFError(f"cannot read {self.name}: {exc.strerror}") from exc


class HTTPSource:
    """A remote file read with HTTP Range requests, in growing blocks that are cached.

    Uses huggingface_hub's HTTP session (its proxies, offline mode, redirects); a URL on
    the Hub endpoint gets the Hub's headers (HF_TOKEN) unless headers are given.
    """

    def __init__(self, url: str, headers: dict[str, str] | None = None, block_size: int = 1 << 20) -> None:
        self.name = url
        self.url = url
        self.headers = dict(_hub_headers(url) if headers is None else headers)
        self.headers["Accept-Encoding"] = "identity"  # offsets into the file, not into a gzip stream
        self.size: int | None = None  # known from the first response
        self._block = block_size
        self._max_block = 16 * block_size
        self._data = b""  # cached bytes of the file from _start on
        self._start = 0

    def read_at(self, offset: int, size: int) -> bytes:
        if self.size is not None:
            size = max(0, min(size, self.size - offset))
        cached_end = self._start + len(self._data)
        if size and not self._start <= offset <= offset + size <= cached_end:
            # Extend the cache when the read continues it, else start a new one at offset.
            extend = bool(self._data) and self._start <= offset <= cached_end
            begin = cached_end if extend else offset
            chunk = self._fetch(begin, max(offset + size - begin, self._block))
            self._block = min(2 * self._block, self._max_block)
            self._data, self._start = (self._data + chunk, self._start) if extend else (chunk, offset)
        i = offset - self._start
        return self._data[i : i + size]

    def _fetch(self, start: int, length: int) -> bytes:
        """Up to length bytes at start; records the file's size. A transient fault (runner.retry) is
        asked again for the bytes still missing, from where the cut body stopped."""
        import httpx2  # here, as huggingface_hub: ~0.1 s to import, paid only to read a URL
        from huggingface_hub import constants
        from huggingface_hub.errors import HfHubHTTPError
        from huggingface_hub.utils import get_session

        got = bytearray()
        backoff = retry.Backoff()
        transient = retry.transient_errors()
        while True:
            begin, before = start + len(got), len(got)
            headers = {**self.headers, "Range": f"bytes={begin}-{start + length - 1}"}
            timeout = constants.HF_HUB_DOWNLOAD_TIMEOUT
            try:
                with get_session().stream(
                    "GET", self.url, headers=headers, timeout=timeout, follow_redirects=True
                ) as resp:
                    retry.check_status(resp)
                    skip = self._body_skip(resp, begin)
                    for chunk in resp.iter_bytes():
                        if skip:  # a server that ignored Range sends the file from its start
                            cut = min(skip, len(chunk))
                            chunk, skip = chunk[cut:], skip - cut
                        got += chunk
                        if len(got) >= length:
                            break
                return bytes(got[:length])
            except transient as exc:
                if not backoff.again(exc, progressed=len(got) > before):
                    raise DownloadError(f"cannot read {self.name}: {exc or type(exc).__name__}") from exc
            except HfHubHTTPError:  # gated, a refused token: the hub layer says what to do
                raise
            except (httpx2.HTTPError, OSError) as exc:  # OSError includes the Hub's offline mode
                raise DownloadError(f"cannot read {self.name}: {exc}") from exc

    def _body_skip(self, resp: httpx2.Response, start: int) -> int:
        """Record the file's size; return how many body bytes come before start."""
        status = resp.status_code
        match = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", ""))
        total = int(match[2]) if match and match[2] != "*" else None
        if status == 206 and match and match[1] is not None and int(match[1]) == start:
            self.size = total
            return 0
        if status == 416:  # the range starts at or past the end: skip the whole body
            self.size = total
            return UINT64_MAX
        if status == 200:  # Range ignored: the body is the whole file
            length = resp.headers.get("Content-Length", "")
            self.size = int(length) if length.isdigit() else None
            return start
        if status == 404:
            raise ModelNotFound(f"no such file: {self.name} (HTTP 404)")
        if status in (401, 403):  # huggingface_hub's own errors (gated, ...): the hub layer words them
            from huggingface_hub.utils import hf_raise_for_status

            resp.read()
            hf_raise_for_status(resp)
        bad_range = " with a bad Content-Range" if status == 206 else ""
        raise DownloadError(f"cannot read {self.name}: HTTP {status} {resp.reason_phrase}{bad_range}")


def _hub_headers(url: str) -> dict[str, str]:
    """The Hub's headers (user agent, token) for a URL on the Hub endpoint, else none."""
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers

    return build_hf_headers() if urlsplit(url).netloc == urlsplit(constants.ENDPOINT).netloc else {}


def open_source(source: str | os.PathLike[str] | RangeSource) -> RangeSource:
    """A path or an http(s) URL as its source; a RangeSource as it is."""
    if isinstance(source, str) and source.startswith(("http://", "https://")):
        return HTTPSource(source)
    if isinstance(source, (str, os.PathLike)):
        return FileSource(source)
    return source
