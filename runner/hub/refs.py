"""What does the user mean by MODEL? One resolver for every command.

Forms, in the order they are tried:
  ./model.gguf, /abs/model.gguf, ~/m.gguf   a local file (a path that exists always wins)
  smollm2                                   an alias from models.toml
  https://huggingface.co/u/r/blob/REV/f.gguf  a file URL on the Hub (blob or resolve)
  hf.co/u/r[:TAG]  huggingface.co/u/r[:TAG]   the same as u/r[:TAG]
  user/repo[:TAG][@REV]                     a Hub repo; TAG is a quant (Q4_K_M) or a file name (*.gguf)
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from runner.errors import ModelNotFound
from runner.hub.catalog import Catalog, CatalogEntry

_REPO = r"[A-Za-z0-9][\w.-]*/[\w.-]+"
_URL = re.compile(
    rf"^https?://(?:www\.)?(?:huggingface\.co|hf\.co)/(?P<repo>{_REPO})"
    r"/(?:blob|resolve)/(?P<rev>[^/]+)/(?P<file>.+\.gguf)(?:\?.*)?$",
    re.IGNORECASE,
)
_HUB_PREFIX = re.compile(r"^(?:https?://)?(?:www\.)?(?:huggingface\.co|hf\.co)/", re.IGNORECASE)
_HUB = re.compile(rf"^(?P<repo>{_REPO}?)(?:@(?P<rev1>[^:@]+))?(?::(?P<tag>[^@]+))?(?:@(?P<rev2>[^:@]+))?$")


@dataclass(frozen=True)
class LocalRef:
    path: Path

    @property
    def display(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class HubRef:
    """A model on the Hub. `file` is exact; `quant` is matched against the repo's file names."""

    repo: str
    revision: str | None = None
    file: str | None = None
    quant: str | None = None
    entry: CatalogEntry | None = None

    @property
    def display(self) -> str:
        if self.entry is not None:
            return self.entry.name
        tag = self.file or self.quant
        return self.repo + (f":{tag}" if tag else "") + (f"@{self.revision}" if self.revision else "")


ModelRef = LocalRef | HubRef


def _looks_like_path(text: str) -> bool:
    return text.startswith(("/", "./", "../", "~", ".\\")) or (
        text.lower().endswith(".gguf") and ":" not in text and text.count("/") != 1
    )


def from_entry(entry: CatalogEntry) -> HubRef:
    return HubRef(repo=entry.repo, revision=entry.revision, file=entry.file, quant=entry.quant, entry=entry)


def resolve(text: str, catalog: Catalog) -> ModelRef:
    text = text.strip()
    if not text:
        raise ModelNotFound("MODEL is empty: give an alias, a .gguf path or a Hub repo (user/repo:QUANT)")
    path = Path(text).expanduser()
    if path.exists():
        return LocalRef(path)
    if _looks_like_path(text):
        raise ModelNotFound(f"no such file: {text}")
    entry = catalog.get(text)
    if entry is not None:
        return from_entry(entry)
    if match := _URL.match(text):
        return HubRef(repo=match["repo"], revision=match["rev"], file=match["file"])
    bare = _HUB_PREFIX.sub("", text)
    if "/" in bare and (match := _HUB.match(bare)):
        if match["rev1"] and match["rev2"]:
            raise ModelNotFound(f"{text}: give the revision once (user/repo:QUANT@REV)")
        tag = match["tag"]
        is_file = tag is not None and tag.lower().endswith(".gguf")
        return HubRef(
            repo=match["repo"],
            revision=match["rev1"] or match["rev2"],
            file=tag if is_file else None,
            quant=None if is_file else tag,
        )
    raise ModelNotFound(_unknown_alias(text, catalog))


def _unknown_alias(text: str, catalog: Catalog) -> str:
    close = difflib.get_close_matches(text.lower(), list(catalog.entries), n=3, cutoff=0.6)
    named = f"{', '.join(close[:-1])} or {close[-1]}" if len(close) > 1 else "".join(close)
    hint = f"; did you mean {named}?" if close else ""
    return (
        f"unknown model {text!r}{hint} (MODEL is an alias from models.toml, a .gguf path, "
        "or a Hub repo such as user/repo:Q4_K_M)"
    )
