"""A model's GGUF headers without downloading it: the local file, the caches, or HTTP range reads.

`show`, `fit` and `pull`'s fit check read headers here, so a 40 GB model is judged from a few MB.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from runner import ui
from runner.errors import DownloadError
from runner.gguf import GGUFHeader, HTTPSource, read_header
from runner.hub import fetch
from runner.hub.quants import Choice, RepoFile, choose, shards_of
from runner.hub.refs import HubRef, LocalRef


@dataclass(frozen=True)
class ModelHeaders:
    headers: tuple[GGUFHeader, ...]  # one per shard, in order
    source: str  # the first shard's path or URL
    size: int  # bytes of every shard
    path: Path | None = None  # the local first shard, when there is one

    @property
    def merged(self) -> GGUFHeader:
        """One header for the whole model: the first shard's metadata, every shard's tensors.

        Offsets are shifted past the earlier shards, so byte ranges add up as they do on disk.
        """
        first = self.headers[0]
        if len(self.headers) == 1:
            return first
        tensors, base = [], 0
        for header in self.headers:
            tensors += [dataclasses.replace(t, offset=t.offset + base) for t in header.tensors]
            base += header.data_size
        return dataclasses.replace(first, tensors=tuple(tensors), file_size=self.size)


def read_model(ref: LocalRef | HubRef, *, offline: bool = False) -> ModelHeaders:
    """The headers of every shard, from disk when the model is here, else from the Hub."""
    if isinstance(ref, LocalRef):
        return read_local(ref.path)
    local = fetch.local_copy(ref)
    if local is not None:
        return read_local(local)
    offline = offline or fetch.env_offline()
    reason = fetch.why_not_online(offline)
    if reason is None:
        commit, files = fetch.remote_listing(ref)
        return read_remote(ref, commit, choose(files, ref.repo, quant=ref.quant, file=ref.file))
    guess = fetch.cached_guess(ref, reason)
    if guess is not None:
        return read_local(guess)
    if offline:
        raise DownloadError(f"{ref.display} is not in the cache and {reason}")
    raise DownloadError(f"cannot read {ref.display}: the Hugging Face Hub cannot be reached ({reason})")


def read_local(path: Path) -> ModelHeaders:
    listing = [RepoFile(p.name) for p in path.parent.glob("*.gguf")] if path.parent.is_dir() else []
    shards = [path.with_name(f.path) for f in shards_of(listing, RepoFile(path.name))]
    headers = tuple(read_header(p) for p in shards)
    return ModelHeaders(headers, str(shards[0]), sum(p.stat().st_size for p in shards), shards[0])


def read_remote(ref: HubRef, commit: str, choice: Choice, *, quiet: bool = False) -> ModelHeaders:
    from huggingface_hub import constants, hf_hub_url

    if not quiet:
        ui.info(f"reading the header of {ref.repo}/{choice.primary.path} on the Hub; nothing is downloaded")
    urls = [hf_hub_url(ref.repo, f.path, revision=commit, endpoint=constants.ENDPOINT) for f in choice.files]
    with fetch.hub_errors(ref):  # a gated repo, a refused token: said as the download path says them
        headers = tuple(read_header(HTTPSource(url)) for url in urls)
    size = choice.size if choice.size is not None else sum(h.file_size or 0 for h in headers)
    return ModelHeaders(headers, urls[0], size)
