"""--mmproj: a vision projector (an mmproj GGUF) beside a model, for images in its prompts, or an
audio projector, for audio clips (runner.gguf.audio_projector checks those; docs/audio.md).

A projector file is untrusted like a model, and the pinned libmtmd aborts or crashes the process on a
malformed one, so its header is read by the bounded reader and checked against what clip.cpp expects
of its projector type (runner.gguf.projector) before libmtmd opens it; its width must be the model's.
Before the model loads, the plan counts what libmtmd will allocate for it (memory(); runner.memory.
projector); then the engine attaches it (runner.engine.vision), on the GPU only where the plan put
layers there.

Which projector (find()): --mmproj's file, or its Hub reference (user/repo:FILE.gguf, user/repo:QUANT,
user/repo, an alias), cached or fetched as a model reference is; without --mmproj, the projector
pulled with the model (runner.hub.projectors).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner import ui
from runner.errors import DownloadError, InvalidModelFile, ModelNotFound, RunnerError, UsageError
from runner.gguf import GGUFHeader, read_header
from runner.hub.refs import HubRef, LocalRef, ModelRef


def attach(engine: Any, mmproj: str | Path, header: GGUFHeader) -> None:
    """The projector at mmproj checked against the model's header, then attached to its engine; the
    engine closed if it cannot be (the caller has no model to close then)."""
    try:
        path = _file(mmproj)
        check(path, header)
        engine.attach_projector(path)
    except BaseException:
        engine.close()
        raise


def check(path: str | Path, header: GGUFHeader | None) -> Any:
    """The projector's facts (runner.gguf.projector.ProjectorInfo, an audio projector's
    runner.gguf.audio_projector.AudioProjectorInfo, or both: OmniProjectorInfo), or one line saying
    why not; its width checked against the model's where its header is given."""
    width = header.arch_get("embedding_length") if header is not None else None
    return _checked(read_header(path), width if isinstance(width, int) else None)


def _checked(projector: GGUFHeader, width: int | None) -> Any:
    from runner.gguf import audio_projector as audio
    from runner.gguf.projector import check_projector, read_key_types

    if audio.is_audio_projector(projector):
        return audio.check_audio_projector(projector, read_key_types(projector.source), text_n_embd=width)
    if audio.is_omni_projector(projector):
        return audio.check_omni_projector(projector, read_key_types(projector.source), text_n_embd=width)
    return check_projector(projector, text_n_embd=width)


def memory(mmproj: str | Path, header: GGUFHeader | None = None) -> Any:
    """What libmtmd will allocate for the projector at mmproj (a file, or the Hub URL of one not
    downloaded: its header read remotely), checked first (runner.memory.projector.ProjectorMemory:
    its weights and its encoder's compute buffer, either place the plan may put them)."""
    from runner.gguf.audio_projector import AudioProjectorInfo, OmniProjectorInfo
    from runner.memory.audio_projector import estimate_audio_projector, estimate_omni_projector
    from runner.memory.projector import estimate_projector

    remote = isinstance(mmproj, str) and mmproj.startswith(("http://", "https://"))
    projector = read_header(mmproj if remote else _file(mmproj))
    width = header.arch_get("embedding_length") if header is not None else None
    info = _checked(projector, width if isinstance(width, int) else None)
    if isinstance(info, AudioProjectorInfo):
        return estimate_audio_projector(projector, info)
    if isinstance(info, OmniProjectorInfo):
        return estimate_omni_projector(projector, estimate_projector(projector, info.vision), info.audio)
    return estimate_projector(projector, info)


def _file(mmproj: str | Path) -> Path:
    path = Path(mmproj).expanduser()
    if not path.is_file():
        raise UsageError(f"--mmproj {mmproj}: no such file")
    return path


def planned(mmproj: str | None, ref: ModelRef, *, paired: bool, needed: bool, offline: bool) -> str | None:
    """The projector a load plans with: a path, or the Hub URL of one not downloaded yet (its header
    read remotely; fetched() downloads it once the plan fits, so a pair that will not fit is refused
    before either file comes). `needed`: the prompt has images, so one is fetched if the cache has
    none, and having none is the error."""
    found = find(mmproj, ref, paired=paired, offline=offline, download=False, fetch_missing=needed)
    if found is None and needed:
        raise _no_projector(ref, offline)
    return found


def _no_projector(ref: ModelRef, offline: bool) -> RunnerError:
    """Why a prompt with images has no projector: a local model names none, a cached Hub model was
    pulled without one; a Hub model not cached, with the Hub out of reach, has neither file here,
    and that is the cause to say (the projector is not the model's only missing file)."""
    if isinstance(ref, LocalRef):
        return UsageError("--image needs the model's vision projector: give --mmproj FILE|REF")
    from runner.hub import fetch

    reason = fetch.why_not_online(offline or fetch.env_offline())
    if reason is not None and fetch.local_copy(ref) is None:
        if not reason.startswith("runner is offline"):
            reason = f"the Hugging Face Hub cannot be reached ({reason})"
        return DownloadError(f"{ref.display} is not in the cache, nor its vision projector, and {reason}")
    return UsageError(
        f"--image needs the model's vision projector; none was pulled with {ref.display}: "
        "give --mmproj FILE|REF"
    )


def fetched(found: str | None) -> str | None:
    """planned()'s projector as a file: downloaded now where it was on the Hub (the file the plan
    read, at the commit it read it), verified as every download is."""
    if not isinstance(found, OnHub):
        return found
    from runner.hub.projectors import pull_projector

    return str(pull_projector(found.ref, found.commit, found.file))


class OnHub(str):
    """The Hub URL of a projector not downloaded (read remotely: its header), with what fetches it."""

    ref: HubRef
    commit: str
    file: Any


def pulled_with(model: str) -> str | None:
    """The projector pulled with `model`, from the cache alone (None: none, or not a Hub model)."""
    from runner.hub.catalog import load_catalog
    from runner.hub.refs import resolve

    return find(None, resolve(model, load_catalog()), paired=True, offline=True)


def find(
    mmproj: str | None,
    ref: ModelRef,
    *,
    paired: bool,
    offline: bool = False,
    download: bool = True,
    fetch_missing: bool = False,
) -> str | None:
    """The projector to use with the model `ref` names: a local path, or (download False) the Hub
    URL of one not cached, whose header is read remotely; None: none.

    `mmproj` (--mmproj) a file, else a Hub reference: cached, else fetched (download) or read on
    the Hub. Without it and with `paired`, the projector pulled with the model (from its snapshot);
    when none is cached, fetched with a model that is not cached yet (it is fetched too), or with
    `fetch_missing` for a cached model pulled without one (run --image: the caller needs images). A
    pulled projector runner cannot use (its type, its keys) is said and left out, the model served
    as text alone; with `fetch_missing`, that is the error."""
    from runner.hub import fetch

    offline = offline or fetch.env_offline()
    if mmproj is not None:
        return _named(mmproj, ref, offline=offline, download=download)
    if not paired or not isinstance(ref, HubRef):
        return None
    found = _pulled(ref, offline=offline, download=download, fetch_missing=fetch_missing)
    if found is None or fetch_missing:
        return found
    try:
        check(found, None)
    except InvalidModelFile as exc:  # a file runner cannot use; a Hub that fails to answer is the error
        ui.warn(f"{ref.display} takes no images or audio in runner yet: {exc}")
        return None
    return found


def _pulled(ref: HubRef, *, offline: bool, download: bool, fetch_missing: bool) -> str | None:
    """find()'s projector pulled with the model, or fetched (see there)."""
    from runner.hub import fetch
    from runner.hub.projectors import cached_projector, choose_projector, pull_projector
    from runner.hub.quants import choose

    local = fetch.local_copy(ref)
    if local is not None:
        found = cached_projector(local, ref.entry)
        if found is not None or not fetch_missing:
            return str(found) if found is not None else None
    if fetch.why_not_online(offline) is not None:
        return None
    try:
        commit, files = fetch.remote_listing(ref)
    except RunnerError:
        if local is None:
            raise
        return None  # the cached model runs without the Hub; its repo's listing is not to be had
    model = choose(files, ref.repo, quant=ref.quant, file=ref.file).primary.path
    picked = choose_projector(files, model, entry=ref.entry)
    if picked is None:
        return None
    if not download:
        return _on_hub(ref, commit, picked)
    return str(pull_projector(ref, commit, picked))


def _named(mmproj: str, model: ModelRef, *, offline: bool, download: bool) -> str:
    """--mmproj FILE or REF: a local path, or the Hub URL of a projector not downloaded."""
    from runner.hub import fetch
    from runner.hub.catalog import load_catalog
    from runner.hub.projectors import pick_in_repo, pull_projector
    from runner.hub.refs import resolve

    try:
        ref = resolve(mmproj, load_catalog())
    except ModelNotFound:
        raise UsageError(f"--mmproj {mmproj}: no such file, nor a Hub reference (user/repo:FILE)") from None
    if isinstance(ref, LocalRef):
        return str(_file(ref.path))
    name = _model_file(model)
    listing = fetch.cached_listing(ref.repo, ref.revision)
    if listing is not None:
        snapshot, files = listing
        try:
            return str(snapshot / pick_in_repo(files, ref, name).path)
        except ModelNotFound:  # not among the cached files: the Hub's listing decides
            pass
    reason = fetch.why_not_online(offline)
    if reason is not None:
        raise DownloadError(f"--mmproj {ref.display} is not in the cache and {reason}")
    commit, files = fetch.remote_listing(ref)
    picked = pick_in_repo(files, ref, name)
    if not download:
        return _on_hub(ref, commit, picked)
    return str(pull_projector(ref, commit, picked))


def _model_file(ref: ModelRef) -> str | None:
    """The model's file name as far as it is known without the Hub: its quant picks a projector."""
    if isinstance(ref, LocalRef):
        return ref.path.name
    from runner.hub import fetch

    local = fetch.local_copy(ref)
    if local is not None:
        return local.name
    if ref.file is not None:
        return ref.file
    from runner.hub.quants import DEFAULT_TAGS

    return f"model-{ref.quant or DEFAULT_TAGS[0]}.gguf"


def _on_hub(ref: HubRef, commit: str, file: Any) -> OnHub:
    from huggingface_hub import constants, hf_hub_url

    url = OnHub(hf_hub_url(ref.repo, file.path, revision=commit, endpoint=constants.ENDPOINT))
    url.ref, url.commit, url.file = ref, commit, file
    return url
