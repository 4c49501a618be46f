"""A fake Hugging Face Hub: a real HTTP server on 127.0.0.1 that the real `huggingface_hub` client talks to.

Stdlib only (pytest for the fixture alone), so tests and scripts (the download benchmark) both use it:

    from tests.fakehub import FakeHub, pointed_at

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
    GET  /simple/{project}/, /packages/{wheel}     a PyPI index (PEP 503) of add_wheel()'s wheels
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
    "trickle"     rate=1024 bytes/s, for_bytes=None (the whole body; N: its first N bytes, then full speed)
Body faults (drop, corrupt, stall with `after` set) only fire on responses with a body (not HEAD, not
3xx): `add_fault("model.gguf", "drop", drop_after=N)` cuts the file's bytes, not the redirect before
them. `times=None` fires forever. Counters: `hub.requests` (method, path) -> n, `hub.bytes_sent`
path -> body bytes, `hub.ranges` [(path, Range)], `hub.log` (every RequestRecord), `hub.count(...)`,
`hub.sent(...)`.

Files: repos.py (content), faults.py (faults and request records), api.py (the routes), hub.py
(FakeHub: state, lifecycle, counters), server.py (the sockets), client.py (pointing huggingface_hub).
"""

from tests.fakehub.client import fake_hub_fixture, hf_env, hub_cache_dir, instant_backoff, pointed_at
from tests.fakehub.faults import Fault, RequestInfo, RequestRecord
from tests.fakehub.hub import FakeHub
from tests.fakehub.repos import Blob, lfs_pointer

__all__ = [
    "Blob",
    "FakeHub",
    "Fault",
    "RequestInfo",
    "RequestRecord",
    "fake_hub_fixture",
    "hf_env",
    "hub_cache_dir",
    "instant_backoff",
    "lfs_pointer",
    "pointed_at",
]
