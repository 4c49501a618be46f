"""A one-shot run's weights loaded beside its start-up: the load begins as soon as the command line
is read, while Python imports the rest of runner and plans, instead of after both.

llama.cpp's model load is C that lets go of the GIL (ctypes), so it runs on the other core while the
main thread imports (~45 ms) and plans (~20 ms): on SmolLM2 that is most of its ~70 ms. Only a load
that already happened is done ahead, the same way:

- `start(model)`, right after the command line is read, looks up what the last run given the same
  model argument (and working directory) loaded: the file, its identity (device, inode, size,
  modification and change times) and the load's parameters. A record is written only after a load
  through the whole path, the file's header checked and the plan made (`loaded`), so a file is never
  read by llama.cpp ahead of runner's own checks: a changed file has another identity and no record.
- `take(path, params)`, where the engine loads, hands the weights over when the file and the
  parameters are the ones the plan asks for; otherwise they are freed and the engine loads as before.
- `finish()`, as the command ends: weights nobody took are freed, a load still running is stopped
  first (its progress callback returns false) and waited for, so no thread of llama.cpp's outlives
  the interpreter.

Done ahead only where it cannot cost what the plan is there to prevent: the CPU alone (nothing put on
a GPU before the plan says it fits), no RPC workers, a file under half the memory available now, and
an x86-64 or ARM64 POSIX machine (the progress callback below relies on its calling convention).

The load runs with llama.cpp's log muted in C (runner.engine.llamacpp.LLAMA_LOG.muted) and a progress
callback in C too: libc's strlen over a one-byte flag (1: go on, 0: stop), which reads the callback's
pointer argument and needs no GIL. A Python callback would take the GIL for every tensor, each time
waiting up to Python's 5 ms switch interval while the main thread imports.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import threading
from pathlib import Path
from typing import Any

from runner import host, interrupt, phases
from runner.engine.llamacpp import LLAMA_LOG, llama, supports_gpu_offload, workers_in_use

VERSION = 1
MEMORY_ENV = "RUNNER_MEMORY"  # runner.memory.devices's cap on the memory a plan counts
_MACHINES = ("x86_64", "amd64", "aarch64", "arm64")


class _Ahead:
    def __init__(self, record: dict[str, Any], params: Any, keep: Any) -> None:
        self.record = record
        self.params = params  # kept alive, with its device list, while llama.cpp reads them
        self.keep = keep
        self.go = ctypes.create_string_buffer(b"\x01", 2)  # strlen 1: go on; 0: stop
        self.handle: Any = None
        self.thread = threading.Thread(target=self._load, name="runner preload", daemon=True)

    def _load(self) -> None:
        lib = llama()
        with LLAMA_LOG.muted() as muted:
            if muted:  # never with the log heard: ~1,200 lines, each taking the GIL
                self.handle = lib.llama_model_load_from_file(os.fsencode(self.record["path"]), self.params)

    def stop(self) -> None:
        self.go[0] = b"\x00"
        if self.thread.ident is not None:  # started (a Ctrl-C may come between the two)
            self.thread.join()

    def wait(self) -> None:
        """Until the load ends; a Ctrl-C meanwhile (runner.interrupt's flag) stops it."""
        while self.thread.is_alive():
            self.thread.join(0.05)
            if interrupt.requested():
                self.stop()


_wanted: str | None = None  # the key of the model argument start() was given
_ahead: _Ahead | None = None


def _key(model: str) -> str:
    where = os.getcwd() if (os.sep in model or model.endswith(".gguf")) else ""
    return hashlib.sha256(f"{VERSION}\0{model}\0{where}".encode()).hexdigest()[:32]


def _record_path(key: str) -> Path:
    from runner.paths import cache_dir

    return cache_dir() / "preload" / f"{key}.json"


def _identity(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _build() -> str:
    from runner.engine.llamacpp import library_file

    found = library_file()
    identity = _identity(str(found)) if found is not None else None
    return f"{found}:{identity}"


def _signature(params: Any) -> list[Any] | None:
    """What of llama_model_params a record keeps and compares; None where it is not done ahead (a GPU
    offload, RPC workers, a vocabulary alone)."""
    if workers_in_use() or params.vocab_only:
        return None
    if params.tensor_buft_overrides or params.tensor_split or params.kv_overrides:
        return None
    devices = ctypes.cast(params.devices, ctypes.POINTER(ctypes.c_void_p)) if params.devices else None
    if not (devices is not None and devices[0] is None) and supports_gpu_offload():
        return None  # a build with a GPU backend: only a load told to use no device at all
    scalars = [
        [name, getattr(params, name)]
        for name, kind in params._fields_
        if kind in (ctypes.c_int32, ctypes.c_int, ctypes.c_bool, ctypes.c_uint32, ctypes.c_float)
    ]  # every flag and count llama_model_params has in this build: n_gpu_layers, load_mode, ...
    return [devices is not None and devices[0] is None, *scalars]


def start(model: str) -> None:
    """The command line named `model`: load what the last run with it loaded, on a thread, if the file
    is still that file. Never raises: at worst nothing is loaded ahead."""
    global _wanted, _ahead
    if os.name != "posix" or platform.machine().lower() not in _MACHINES or _ahead is not None:
        return
    try:
        _wanted = _key(model)
        ahead = _prepared(_wanted)
        if ahead is None:
            return
        host.hold()  # the plan sees the memory as it was before the weights below took any of it
        _ahead = ahead
        ahead.thread.start()
    except Exception:  # a deleted working directory, a library that will not load: nothing ahead
        return


def _prepared(key: str) -> _Ahead | None:
    record = json.loads(_record_path(key).read_text())
    path = record["path"]
    if _identity(path) != record["identity"] or record["build"] != _build():
        return None
    if os.environ.get(MEMORY_ENV):  # a cap on what plans may count: no load before the plan
        return None
    if record["identity"][2] * 2 > host.ram()[1]:
        return None
    from runner.engine.llamacpp import model_params

    lib = llama()
    params, keep = model_params(lib, 0, use_gpu=not record["params"][0])
    if _signature(params) != record["params"]:
        return None
    ahead = _Ahead(record, params, keep)
    params.progress_callback = ctypes.cast(ctypes.CDLL(None).strlen, lib.llama_progress_callback)
    params.progress_callback_user_data = ctypes.cast(ahead.go, ctypes.c_void_p)
    return ahead


def take(path: Path, params: Any) -> Any:
    """The weights loaded ahead, where they are `path`'s with these parameters (then the caller owns
    them); otherwise None, and what was loaded ahead is freed."""
    global _ahead, _wanted
    ahead = _ahead
    if ahead is None:
        return None
    ahead.wait()
    _ahead, _wanted = None, None  # the record stands as it is (a draft model's load is not it)
    host.release()
    same = os.path.realpath(path) == ahead.record["path"] and _signature(params) == ahead.record["params"]
    if ahead.handle and same:
        phases.loaded_ahead()
        return ahead.handle
    if ahead.handle:
        llama().llama_model_free(ahead.handle)
    return None


def loaded(path: Path, params: Any) -> None:
    """The engine loaded `path` with `params` through the whole path: remembered for the next start
    with the same model argument (the first load after start() only: a draft model's is not it)."""
    global _wanted
    signature = _signature(params)
    if signature is None:  # not one done ahead: the record waits for the load that is
        return
    key, _wanted = _wanted, None
    if key is None:
        return
    real = os.path.realpath(path)
    identity = _identity(real)
    if identity is None:
        return
    record = {"path": real, "identity": identity, "build": _build(), "params": signature}
    target = _record_path(key)
    try:
        if target.exists() and json.loads(target.read_text()) == record:
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(record))
        os.replace(partial, target)
    except (OSError, ValueError):
        return


def finish() -> None:
    """The command ends: a load nobody took is stopped, waited for and freed."""
    global _ahead, _wanted
    ahead, _wanted = _ahead, None
    if ahead is None:
        return
    with interrupt.deferred():  # a Ctrl-C now waits for the stopped load: no llama.cpp thread outlives us
        ahead.stop()
        _ahead = None
        host.release()
        if ahead.handle:
            llama().llama_model_free(ahead.handle)
