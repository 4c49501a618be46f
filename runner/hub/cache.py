"""The models in the Hugging Face cache and in runner's mirror cache: what `runner list` shows and
`runner rm` removes.

The Hugging Face cache is read with huggingface_hub's own scanner and changed only through its deletion
strategies: a snapshot link goes, its blob only when no other cached revision links to it, and a
revision left empty goes with its refs. The mirror cache holds catalog models fetched from PyPI, as
mirrors/<sha256>/<file>; those are listed under their catalog alias.

"Last used" is the file's access time, as `hf cache ls` reports it (on a relatime mount it moves at most
once a day); a file not read since it was written was never used: null.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from runner import ui
from runner.errors import UsageError
from runner.hub.catalog import Catalog, CatalogEntry
from runner.hub.projectors import choose_projector
from runner.hub.quants import RepoFile, is_model_file, matches, quant_of, split_info
from runner.hub.refs import HubRef, LocalRef, ModelRef
from runner.paths import cache_dir


@dataclass(frozen=True)
class CachedModel:
    """One model (every shard of a split one) in one cached revision, or one mirror-cache file."""

    reference: str  # what `runner run` takes to use exactly this copy
    repo: str | None
    revision: str | None  # the commit (a catalog entry's pinned revision for a mirror copy)
    file: str  # path in the repo of the file llama.cpp loads (the first shard)
    quant: str | None
    size_bytes: int
    last_used: float | None
    paths: tuple[Path, ...]
    source: str  # "hub" (the Hugging Face cache) or "mirror" (runner's cache of PyPI mirrors)
    refs: frozenset[str] = field(default=frozenset(), repr=False)  # branches and tags at this revision
    missing_shards: int = 0
    projector: Path | None = None  # a vision model's projector, pulled with it (runner.hub.projectors)

    def to_json(self) -> dict[str, Any]:
        used = self.last_used
        return {
            "reference": self.reference,
            "repo": self.repo,
            "revision": self.revision,
            "file": self.file,
            "quant": self.quant,
            "size_bytes": self.size_bytes,
            "last_used": None if used is None else _iso(used),
            "path": str(self.paths[0]),
            "source": self.source,
            "projector": None if self.projector is None else str(self.projector),
        }


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def cached_models(catalog: Catalog, *, warn: bool = False) -> list[CachedModel]:
    models = _hub_models(catalog, warn=warn) + _mirror_models(catalog)
    if warn:
        for m in models:
            if m.missing_shards:
                ui.warn(f"{m.reference} is missing {m.missing_shards} shard(s): pull it again or rm it")
    return sorted(models, key=lambda m: (m.reference.lower(), m.source))


def _hub_models(catalog: Catalog, *, warn: bool) -> list[CachedModel]:
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(constants.HF_HUB_CACHE)
    except CacheNotFound:
        return []
    if warn:
        for problem in info.warnings:  # a repo the scanner finds damaged is left out whole
            ui.warn(f"skipped a damaged entry of the Hugging Face cache: {problem}")
    revisions = [
        (repo.repo_id, rev) for repo in info.repos if repo.repo_type == "model" for rev in repo.revisions
    ]
    return [m for repo_id, rev in revisions for m in _revision_models(catalog, repo_id, rev)]


def _revision_models(catalog: Catalog, repo: str, rev: Any) -> Iterator[CachedModel]:
    """The models of one cached revision (huggingface_hub's CachedRevisionInfo)."""
    files = {f.file_path.relative_to(rev.snapshot_path).as_posix(): f for f in rev.files}
    groups = _group_models(files)
    firsts = [group[0] for group in groups]
    listing = [RepoFile(p) for p in files if files[p].file_path.exists()]
    for group in groups:
        infos = [files[p] for p in group]
        split = split_info(group[0])
        used = [f.blob_last_accessed for f in infos if f.blob_last_accessed >= f.blob_last_modified]
        reference = _reference(catalog, repo, rev.commit_hash, rev.refs, group[0], firsts)
        projector = choose_projector(listing, group[0], entry=catalog.get(reference))
        yield CachedModel(
            reference=reference,
            repo=repo,
            revision=rev.commit_hash,
            file=group[0],
            quant=quant_of(group[0]),
            size_bytes=sum(f.size_on_disk for f in infos),
            last_used=max(used, default=None),
            paths=tuple(f.file_path for f in infos),
            source="hub",
            refs=frozenset(rev.refs),
            missing_shards=split[2] - len(group) if split else 0,
            projector=rev.snapshot_path / projector.path if projector is not None else None,
        )


def _group_models(paths: Iterable[str]) -> list[list[str]]:
    """Model files by model, in order: a plain file alone, the shards of a split model together."""
    groups: dict[str, list[str]] = defaultdict(list)
    for path in sorted(paths):
        if is_model_file(path):
            split = split_info(path)
            groups[f"{split[0]}-of-{split[2]}" if split else path].append(path)
    return list(groups.values())


def _reference(
    catalog: Catalog, repo: str, commit: str, refs: frozenset[str], file: str, models: list[str]
) -> str:
    """The catalog alias that names exactly this file, else user/repo:QUANT (or :FILE) [@revision].

    QUANT only when it names this file alone among the revision's models, as `runner run` chooses.
    """
    for entry in catalog.entries.values():
        if _is_entry(entry, repo, commit, refs, file):
            return entry.name
    quant = quant_of(file)
    tag = quant if quant and [m for m in models if matches(quant, m)] == [file] else file
    at = "" if "main" in refs else "@" + (min(refs) if refs else commit)
    return f"{repo}:{tag}{at}"


def _is_entry(entry: CatalogEntry, repo: str, commit: str, refs: frozenset[str], file: str) -> bool:
    """Whether an alias pins exactly this file: its repo, its file and its revision (main if none)."""
    at_revision = entry.revision == commit or (entry.revision or "main") in refs
    return entry.repo.lower() == repo.lower() and entry.file == file and at_revision


def _mirror_models(catalog: Catalog) -> list[CachedModel]:
    """Files in mirrors/<sha256>/: under the alias whose sha256 they have, else under their path."""
    by_sha = {e.sha256: e for e in catalog.entries.values() if e.sha256}
    models = []
    for path in sorted((cache_dir() / "mirrors").glob("*/*.gguf")):
        entry, st = by_sha.get(path.parent.name), path.stat()
        models.append(
            CachedModel(
                reference=entry.name if entry else str(path),
                repo=entry.repo if entry else None,
                revision=entry.revision if entry else None,
                file=entry.file if entry and entry.file else path.name,
                quant=quant_of(path.name),
                size_bytes=st.st_size,
                last_used=st.st_atime if st.st_atime >= st.st_mtime else None,
                paths=(path,),
                source="mirror",
            )
        )
    return models


def find(ref: ModelRef, models: list[CachedModel]) -> list[CachedModel]:
    """The cached models a reference names: one model, perhaps in both caches; several is an error."""
    if isinstance(ref, LocalRef):
        target = _real(ref.path)
        return [m for m in models if any(_real(p) == target for p in m.paths)]
    hits = [m for m in models if _names(ref, m)]
    if ref.revision is None and any("main" in m.refs for m in hits):
        hits = [m for m in hits if "main" in m.refs or m.source == "mirror"]
    names = sorted({m.reference for m in hits})
    if len(names) > 1:
        raise UsageError(f"{ref.display} names several cached models ({', '.join(names)}): name one")
    return hits


def _real(path: Path) -> Path:
    """The absolute path with its folders resolved, the file itself not (a snapshot link stays a link)."""
    return Path(os.path.abspath(path)).parent.resolve() / path.name


def _names(ref: HubRef, m: CachedModel) -> bool:
    if ref.entry is not None:
        return m.reference == ref.entry.name
    if m.repo is None or m.repo.lower() != ref.repo.lower():
        return False
    rev = ref.revision
    if rev is not None and rev not in m.refs and not (m.revision or "").startswith(rev):
        return False
    if ref.file is not None:
        return m.file.lower() == ref.file.lower()
    return ref.quant is None or matches(ref.quant, m.file)


def delete_hub_files(models: list[CachedModel]) -> tuple[int, int]:
    """Unlink the models' snapshot links, and blobs nothing else links; (bytes freed, bytes kept)."""
    if not models:
        return 0, 0
    from huggingface_hub import constants, scan_cache_dir

    paths = {p for m in models for p in m.paths}
    info = scan_cache_dir(constants.HF_HUB_CACHE)
    files = [f for repo in info.repos for rev in repo.revisions for f in rev.files if f.file_path in paths]
    strategy = info.delete_files(*files)
    strategy.execute()
    gone = strategy.blobs | strategy.files  # a file that is its own blob (no symlinks) goes with its entry
    blobs = {f.blob_path: f.size_on_disk for f in files}
    kept = sum(size for blob, size in blobs.items() if blob not in gone)
    touched = {m.revision for m in models}
    info = scan_cache_dir(constants.HF_HUB_CACHE)
    revisions = [rev for repo in info.repos for rev in repo.revisions if rev.commit_hash in touched]
    # A revision with nothing left: its snapshot and refs go too (the whole repo, if it was the last).
    if empty := [rev.commit_hash for rev in revisions if not rev.files]:
        info.delete_revisions(*empty).execute()
    return strategy.expected_freed_size, kept


def delete_mirror_copy(m: CachedModel) -> int:
    path = m.paths[0]
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".lock").unlink(missing_ok=True)
    with suppress(OSError):  # something else lives there (another download in progress)
        path.parent.rmdir()
    return m.size_bytes
