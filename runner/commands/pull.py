"""`runner pull`: fetch a model ahead of use, or list what a repo offers."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from runner import projector as vision
from runner import ui
from runner.errors import RunnerError, UsageError
from runner.hub import fetch
from runner.hub.catalog import load_catalog
from runner.hub.headers import read_remote
from runner.hub.projectors import cached_projector, choose_projector, pull_projector
from runner.hub.quants import choose, offer
from runner.hub.refs import HubRef, LocalRef, resolve
from runner.loader import plan_for, smaller_quants
from runner.memory.plan import check_asked
from runner.settings import LoadSettings


def pull_model(
    model: str,
    *,
    out: TextIO,
    quiet: bool = False,
    offline: bool = False,
    ctx: int | None = None,
    force: bool = False,
) -> None:
    """Download (or find cached) every file MODEL needs; one line per file on stdout: size and path.

    Before downloading, the model's header is read on the Hub and the memory plan made: what will not
    fit this machine at ctx is refused (unless forced) before a byte of weights moves.
    """
    check_asked(ctx=ctx, gpu_layers=None)
    ref = resolve(model, load_catalog())
    if isinstance(ref, LocalRef):
        raise UsageError(f"{model} is a local file; pull takes an alias or a Hub repo")
    if ref.entry is not None and ref.entry.mirror is not None and (offline or fetch.hub_unreachable()):
        path = fetch.locate(ref, offline=offline)  # pinned bytes: the cache or the mirror will do
        out.write(f"{ui.human_bytes(path.stat().st_size)}\t{path}\n")
        return
    if offline:
        path = fetch.locate(ref, offline=True)
        out.write(f"{ui.human_bytes(path.stat().st_size)}\t{path}\n")
        projector = cached_projector(path, ref.entry)
        if projector is not None:
            out.write(f"{ui.human_bytes(projector.stat().st_size)}\t{projector}\n")
        return
    commit, files = fetch.remote_listing(ref)
    choice = choose(files, ref.repo, quant=ref.quant, file=ref.file)
    if fetch.cached_path(ref) is None:
        model_headers = read_remote(ref, commit, choice, quiet=True)
        smaller = smaller_quants(ref, model_headers.size, ctx=ctx, kv_type=None)
        plan_for(model_headers.merged, ref.display, LoadSettings(ctx=ctx, force=force), smaller=smaller)
    pulled = fetch.pull(ref, quiet=quiet)
    ui.info(f"{ref.display}: {pulled.choice.quant or pulled.choice.primary.path} at {pulled.commit[:12]}")
    for file, path in zip(pulled.choice.files, pulled.paths, strict=True):
        out.write(f"{ui.human_bytes(file.size or path.stat().st_size)}\t{path}\n")
    picked = choose_projector(files, pulled.choice.primary.path, entry=ref.entry)
    if picked is not None:  # a vision or audio model: its projector with it, as llama.cpp's -hf fetches it
        projector = pull_projector(ref, pulled.commit, picked, quiet=quiet)
        out.write(f"{ui.human_bytes(picked.size or projector.stat().st_size)}\t{projector}\n")
        _check_projector(projector, pulled.path, ref.display)


def _check_projector(projector: Path, model: Path, name: str) -> None:
    """Say now, not at the first image or clip, when the pinned libmtmd cannot use the projector."""
    from runner.gguf import read_header
    from runner.gguf.audio_projector import AudioProjectorInfo, OmniProjectorInfo

    try:
        info = vision.check(projector, read_header(model))
    except RunnerError as exc:
        ui.warn(f"{name} takes no images or audio in runner yet: {exc}")
        return
    kind, takes = "a vision model", "--image takes images"
    if isinstance(info, OmniProjectorInfo):
        kind, takes = "a vision and audio model", "--image takes images, --audio takes clips"
    elif isinstance(info, AudioProjectorInfo):
        kind, takes = "an audio model", "--audio takes clips"
    ui.info(f"{name}: {kind}, its projector {projector.name} beside it ({takes})")


def list_quants(model: str, *, out: TextIO) -> None:
    """The repo's models (one row each, shards counted once) without downloading anything."""
    ref = resolve(model, load_catalog())
    if not isinstance(ref, HubRef):
        raise UsageError(f"{model} is a local file; --list takes a Hub repo")
    commit, files = fetch.remote_listing(HubRef(ref.repo, revision=ref.revision))
    choices = offer(files)
    width = max([len(c.quant or "?") for c in choices] + [5])
    for choice in choices:
        size = ui.human_bytes(choice.size) if choice.size is not None else "?"
        shards = f" ({len(choice.files)} shards)" if len(choice.files) > 1 else ""
        out.write(f"{(choice.quant or '?'):<{width}}  {size:>9}  {choice.primary.path}{shards}\n")
    if not choices:
        ui.warn(f"{ref.repo} at {commit[:12]} has no GGUF model files")
