"""`runner rm`: remove a cached model after asking, with its projector unless another model uses it;
data another cached file shares stays."""

from __future__ import annotations

from dataclasses import replace

from runner import ui
from runner.errors import ModelNotFound, UsageError
from runner.hub.cache import CachedModel, cached_models, delete_hub_files, delete_mirror_copy, find
from runner.hub.catalog import load_catalog
from runner.hub.refs import resolve


def remove_model(model: str, *, yes: bool, interactive: bool) -> None:
    """Remove every cached copy of MODEL after asking (unless yes); say on stderr what was freed."""
    catalog = load_catalog()
    cached = cached_models(catalog)
    targets = find(resolve(model, catalog), cached)
    if not targets:
        raise ModelNotFound(f"{model} is not in the cache (runner list shows what is)")
    what = targets[0].reference
    size = sum(m.size_bytes for m in targets)
    copies = f", {len(targets)} copies" if len(targets) > 1 else ""
    if not yes:
        if not interactive:
            raise UsageError(f"not removing {what} without confirmation (stdin is not a terminal): pass -y")
        if not ui.confirm(f"Remove {what} ({ui.human_bytes(size)}{copies})?"):
            ui.info("nothing removed")
            return
    hub = [_with_projector(m, cached, targets) for m in targets if m.source == "hub"]
    freed, kept = delete_hub_files(hub)
    freed += sum(delete_mirror_copy(m) for m in targets if m.source == "mirror")
    stays = f"; {ui.human_bytes(kept)} stays, other cached files use the same data" if kept else ""
    ui.info(f"removed {what}{copies}: freed {ui.human_bytes(freed)}{stays}")


def _with_projector(m: CachedModel, cached: list[CachedModel], targets: list[CachedModel]) -> CachedModel:
    """The model's files, and its projector (pulled with it) where no other cached model uses it."""
    if m.projector is None or any(o.projector == m.projector for o in cached if o not in targets):
        return m
    return replace(m, paths=(*m.paths, m.projector))
