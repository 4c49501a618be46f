"""A vision model's projector (an `mmproj-*.gguf` beside its model on the Hub): which one goes with a
model, fetched with it, and found again in the cache.

The pick follows llama.cpp's `-hf` (common/download.cpp, find_best_sibling) for where to look: a
GGUF whose path holds "mmproj", in the model's folder or one above it, the deepest first. Among
those it takes the one of the model's own quant, else F16, else Q8_0, else (as llama.cpp does for
every pick) the quant closest in bits to the model's. llama.cpp takes the closest in bits at once,
so a Q4_K_M model gets a Q8_0 projector over an F16 one; runner prefers F16, the precision the
projector was trained in, where no projector of the model's quant is offered.

The pairing is recorded the way the cache records a pulled model: the projector's file lies in the
same snapshot as the model, and the same rule, over the files cached there, finds it again. A
catalog entry may pin its projector's file (`mmproj` in models.toml).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from runner.errors import ModelNotFound
from runner.hub import fetch
from runner.hub.catalog import CatalogEntry
from runner.hub.quants import Choice, RepoFile, matches, quant_of
from runner.hub.refs import HubRef

KEYWORD = "mmproj"
PREFERRED = ("F16", "Q8_0")  # after the model's own quant


def is_projector(path: str) -> bool:
    return path.lower().endswith(".gguf") and KEYWORD in path.lower()


def _folder(path: str) -> str:
    return path.rsplit("/", 1)[0] + "/" if "/" in path else ""


def _bits(quant: str | None) -> int:
    """Q4_K_M -> 4, F16 -> 16, BF16 -> 16 (llama.cpp's extract_quant_bits); 0 without a number."""
    found = re.search(r"\d+", quant or "")
    return int(found.group()) if found else 0


def choose_projector(
    files: Sequence[RepoFile], model: str, *, entry: CatalogEntry | None = None
) -> RepoFile | None:
    """The projector that goes with the model at path `model` in a repo listing, or None."""
    if entry is not None and entry.mmproj is not None:
        return next((f for f in files if f.path.lower() == entry.mmproj.lower()), None)
    here = _folder(model)
    found = sorted((f for f in files if is_projector(f.path) and here.startswith(_folder(f.path))), key=_key)
    if not found:
        return None
    depth = max(_folder(f.path).count("/") for f in found)
    found = [f for f in found if _folder(f.path).count("/") == depth]
    quant = quant_of(model)
    for tag in (quant, *PREFERRED):
        hit = next((f for f in found if tag and quant_of(f.path) == tag), None)
        if hit is not None:
            return hit
    return min(found, key=lambda f: abs(_bits(quant_of(f.path)) - _bits(quant)))


def _key(f: RepoFile) -> str:
    return f.path


def snapshot_of(path: Path) -> Path | None:
    """The Hugging Face cache snapshot folder a model's path lies in (…/snapshots/<commit>/…), or None."""
    for folder in path.parents:
        if folder.parent.name == "snapshots":
            return folder
    return None


def cached_projector(model: Path, entry: CatalogEntry | None = None) -> Path | None:
    """The projector pulled with the model at `model` (a path in a cached snapshot), or None."""
    snapshot = snapshot_of(model)
    if snapshot is None:
        return None
    files = [
        RepoFile(p.relative_to(snapshot).as_posix())
        for p in sorted(snapshot.rglob("*.gguf"))
        if p.exists() and is_projector(p.name)  # a link whose blob was removed is not cached
    ]
    picked = choose_projector(files, model.relative_to(snapshot).as_posix(), entry=entry)
    return snapshot / picked.path if picked is not None else None


def pick_in_repo(files: Sequence[RepoFile], ref: HubRef, model: str | None) -> RepoFile:
    """The projector --mmproj REF names in its repo's listing: its file, the projector of its quant,
    or the one that goes with `model` (the file the model was loaded from, its quant decides)."""
    projectors = [f for f in files if is_projector(f.path)]
    if ref.file is not None:
        hit = next((f for f in files if f.path.lower() == ref.file.lower()), None)
        if hit is None:
            raise ModelNotFound(f"{ref.repo} has no file {ref.file}; {_offer(projectors)}")
        return hit
    if ref.quant is not None and ref.entry is None:
        hits = [f for f in projectors if matches(ref.quant, f.path)]
        if len(hits) != 1:
            what = "several projectors" if hits else "no projector"
            raise ModelNotFound(f"{ref.repo} has {what} of quant {ref.quant}; {_offer(projectors)}")
        return hits[0]
    entry_file = ref.entry.file if ref.entry is not None else None
    picked = choose_projector(files, entry_file or model or "", entry=ref.entry)
    if picked is None:
        raise ModelNotFound(f"{ref.display}: {_offer(projectors)}")
    return picked


def _offer(projectors: list[RepoFile]) -> str:
    if not projectors:
        return "the repo offers no projector (mmproj-*.gguf)"
    return "its projectors: " + ", ".join(f.path for f in projectors)


def pull_projector(ref: HubRef, commit: str, file: RepoFile, *, quiet: bool = False) -> Path:
    """The projector's file downloaded into the model's snapshot, verified as every download is."""
    fetch.check_disk_space(ref, commit, Choice((file,), quant_of(file.path)))
    return fetch.download_file(ref, commit, file, quiet=quiet)
