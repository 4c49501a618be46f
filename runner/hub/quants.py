"""Which file of a Hub repo is the model: quant tags, split shards, and the files that are not models.

Pure functions over a repo's file listing, so the rules are tested with hand-picked names. They follow
llama.cpp's own `-hf user/repo[:quant]` (common/download.cpp of the pinned engine): a tag matches a
path case-insensitively when followed by '.' or '-'; no tag means Q4_K_M, else Q8_0, else the first
model file; split models load from shard 1; mmproj, imatrix and draft/speculative files are never the
model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from runner.errors import ModelNotFound
from runner.ui import human_bytes

DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-", "draft")

_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])("
    r"I?Q[1-8]_K(?:_[SMLX]{1,2})?|IQ[1-4]_(?:XXS|XS|NL|S|M)|Q[1-8]_[01]|TQ[12]_0|MXFP4(?:_MOE)?|"
    r"UD-[A-Z0-9_]+|BF16|F16|FP16|F32|FP32"
    r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RepoFile:
    path: str
    size: int | None = None
    sha256: str | None = None  # the LFS sha256 the Hub declares


@dataclass(frozen=True)
class Choice:
    """The model's files (shards in order; the first is what llama.cpp loads) and its quant tag."""

    files: tuple[RepoFile, ...]
    quant: str | None

    @property
    def primary(self) -> RepoFile:
        return self.files[0]

    @property
    def size(self) -> int | None:
        sizes = [f.size for f in self.files]
        return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1].lower()
    return name.endswith(".gguf") and not any(word in name for word in NOT_MODELS)


def split_info(path: str) -> tuple[str, int, int] | None:
    """(prefix, index, count) for 'name-00001-of-00003.gguf', else None."""
    match = _SPLIT.match(path)
    if not match:
        return None
    return match["prefix"], int(match["index"]), int(match["count"])


def quant_of(path: str) -> str | None:
    """The quant tag in a file name ('Q4_K_M'), upper-cased, or None."""
    name = path.rsplit("/", 1)[-1]
    found = _QUANT.findall(name) or _QUANT.findall(path)
    return found[-1].upper() if found else None


def shards_of(files: Sequence[RepoFile], primary: RepoFile) -> tuple[RepoFile, ...]:
    """Every shard of primary's split model, in order; a missing shard is an error, not a half model."""
    info = split_info(primary.path)
    if info is None:
        return (primary,)
    prefix, _, count = info
    by_index = {}
    for f in files:
        other = split_info(f.path)
        if other and other[0] == prefix and other[2] == count:
            by_index[other[1]] = f
    missing = [i for i in range(1, count + 1) if i not in by_index]
    if missing:
        raise ModelNotFound(f"{primary.path}: shard(s) {', '.join(map(str, missing))} of {count} are missing")
    return tuple(by_index[i] for i in range(1, count + 1))


def _models(files: Iterable[RepoFile]) -> list[RepoFile]:
    """One entry per model: plain files and the first shard of split ones."""
    out = []
    for f in files:
        if not is_model_file(f.path):
            continue
        info = split_info(f.path)
        if info is None or info[1] == 1:
            out.append(f)
    return out


def matches(tag: str, path: str) -> bool:
    """Whether user/repo:TAG names this path: TAG, case-insensitively, then '.' or '-' (llama.cpp's rule)."""
    return re.search(re.escape(tag) + r"[.-]", path, re.IGNORECASE) is not None


def choose(
    files: Sequence[RepoFile], repo: str, *, quant: str | None = None, file: str | None = None
) -> Choice:
    """The model a reference names in a repo listing, or an error that lists what the repo offers."""
    models = _models(files)
    if file is not None:
        exact = [f for f in files if f.path == file or f.path.lower() == file.lower()]
        if not exact:
            raise ModelNotFound(f"{repo} has no file {file}; {describe_offer(files)}")
        return Choice(shards_of(files, exact[0]), quant_of(exact[0].path))
    if not models:
        raise ModelNotFound(f"{repo} has no GGUF model files")
    if quant is not None:
        hits = [f for f in models if matches(quant, f.path)]
        if len(hits) == 1:
            return Choice(shards_of(files, hits[0]), quant_of(hits[0].path) or quant.upper())
        if not hits:
            raise ModelNotFound(f"{repo} has no {quant} file; {describe_offer(files)}")
        names = ", ".join(f.path for f in hits)
        raise ModelNotFound(
            f"{quant} matches several files in {repo} ({names}); name one with {repo}:FILE.gguf"
        )
    for tag in DEFAULT_TAGS:
        hits = [f for f in models if matches(tag, f.path)]
        if hits:
            return Choice(shards_of(files, hits[0]), tag)
    return Choice(shards_of(files, models[0]), quant_of(models[0].path))


def offer(files: Sequence[RepoFile]) -> list[Choice]:
    """Every model in the listing with its shards, for `pull --list` and error messages."""
    return [Choice(shards_of(files, f), quant_of(f.path)) for f in _models(files)]


def describe_offer(files: Sequence[RepoFile]) -> str:
    choices = offer(files)
    if not choices:
        return "it offers no GGUF model files"
    parts = []
    for c in choices:
        size = f" {human_bytes(c.size)}" if c.size else ""
        parts.append(f"{c.quant or c.primary.path}{size}")
    return "it offers: " + ", ".join(parts)
