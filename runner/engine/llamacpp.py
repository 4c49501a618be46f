"""llama.cpp itself, through llama-cpp-python's ctypes bindings: the library loaded once with its log
routed, what the installed build can do, the parameters the engine loads with, and a dry run of a load.

Only the low-level API: llama-cpp-python's high-level `Llama` (and numpy) is never imported.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import interrupt
from runner.errors import EngineError
from runner.host import physical_cores


class _LlamaLog:
    """llama.cpp's log: silenced (kept in a short ring for error messages) unless echo is on."""

    def __init__(self) -> None:
        self.echo = False
        self.recent: deque[str] = deque(maxlen=32)
        self.listeners: list[Any] = []  # callables(level, text), e.g. the memory benchmark
        self.callback: Any = None
        self._muting = 0  # calls under muted() now, on any thread (a load ahead: runner.engine.preload)
        self._unmuted = threading.Condition()

    def __call__(self, level: int, text: bytes, _user_data: Any) -> None:
        message = text.decode("utf-8", errors="replace")
        self.recent.append(message)
        for listener in self.listeners:
            listener(level, message)
        if self.echo:
            os.write(2, text)

    @contextlib.contextmanager
    def muted(self) -> Iterator[bool]:
        """llama.cpp's log sent nowhere in C, for a call that logs a lot: a model load writes ~1,200
        lines, and each would call into Python and take the GIL, so no other Python thread could run
        beside the load (the chat template's compile does: runner.engine.text.template.compile_ahead).
        Yields whether it muted: not while the log is echoed (--debug) or listened to. The lines are
        lost, so a caller that fails under it and wants llama.cpp's reason asks again unmuted.

        The no-op is Py_IsInitialized, a C function that reads no argument, changes nothing and needs
        no GIL; the three arguments llama.cpp passes it are ignored, as the caller-cleaned C calling
        conventions (x86-64, AArch64, cdecl) allow."""
        if self.echo or self.listeners or self.callback is None:
            yield False
            return
        lib = llama()
        with self._unmuted:
            self._muting += 1
            lib.llama_log_set(_silent_callback(), ctypes.c_void_p(0))
        try:
            yield True
        finally:
            with self._unmuted:
                self._muting -= 1
                if not self._muting:  # the last one heard again (muted on two threads at once)
                    lib.llama_log_set(self.callback, ctypes.c_void_p(0))
                    self._unmuted.notify_all()

    def heard(self) -> None:
        """Until no call has the log muted (another thread's load), for a caller that reads it; a
        Ctrl-C meanwhile ends the wait (what it reads then says nothing)."""
        with self._unmuted:
            while self._muting and not interrupt.requested():
                self._unmuted.wait(0.05)

    def last_error(self) -> str:
        lines = [line.strip() for line in "".join(self.recent).splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()] or [
            line for line in lines if "failed" in line.lower()
        ]
        return (errors or lines or [""])[-1]

    def model_error(self) -> str | None:
        """What llama.cpp found wrong in a model file ('unknown model architecture: ...'), if it said."""
        marker = "error loading model: "
        found = [
            line.rsplit(marker, 1)[1].strip() for line in "".join(self.recent).splitlines() if marker in line
        ]
        return found[-1] if found else None


LLAMA_LOG = _LlamaLog()


@functools.cache
def _silent_callback() -> Any:
    return ctypes.cast(ctypes.pythonapi.Py_IsInitialized, llama().llama_log_callback)


def _low_level() -> Any:
    """llama-cpp-python's ctypes layer (llama_cpp.llama_cpp) without its package's __init__.

    That __init__ imports the high-level API (Llama, chat formats) and numpy: ~0.18 s of every
    start, for nothing runner calls. Unless something imported the package already, the package is
    put in sys.modules unexecuted, with a module __getattr__ that runs its real __init__ the first
    time anything asks for a name it lacks (`llama_cpp.Llama`, `from llama_cpp import ...`), so
    other code in the process still finds the whole package (and llama.cpp's log stays runner's,
    which the package's _logger would take). No file of llama-cpp-python is touched.
    """
    import importlib
    import importlib.util
    import sys

    if "llama_cpp" not in sys.modules:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is not None and spec.loader is not None and spec.submodule_search_locations:
            package = importlib.util.module_from_spec(spec)
            loader = spec.loader

            def complete(name: str) -> Any:
                del package.__dict__["__getattr__"]  # once: the real __init__ defines the rest
                loader.exec_module(package)
                if LLAMA_LOG.callback is not None:  # its _logger took llama.cpp's log: runner's again
                    package.llama_log_set(LLAMA_LOG.callback, ctypes.c_void_p(0))
                return getattr(package, name)

            setattr(package, "__getattr__", complete)  # noqa: B010 - a module's own __getattr__ (PEP 562)
            sys.modules["llama_cpp"] = package
    return importlib.import_module("llama_cpp.llama_cpp")


_LIB: Any = None  # the module llama() returns, once set up


def llama() -> Any:
    """The llama_cpp module, imported on first use (it loads a shared library) with logging routed.
    Called per token (token_bytes, is_end): after the first call, one global read."""
    global _LIB
    if _LIB is not None:
        return _LIB
    llama_cpp = _low_level()
    if LLAMA_LOG.callback is None:
        with interrupt.deferred():  # the backends log as they start: no KeyboardInterrupt in a callback
            LLAMA_LOG.callback = llama_cpp.llama_log_callback(LLAMA_LOG)
            llama_cpp.llama_log_set(LLAMA_LOG.callback, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
    _LIB = llama_cpp
    return llama_cpp


def library_file() -> Path | None:
    """The llama.cpp shared library this process loaded (its build is part of a saved state's key)."""
    name = getattr(getattr(_low_level(), "_lib", None), "_name", None)
    return Path(name) if isinstance(name, str) else None


DEVICE_CPU, DEVICE_GPU, DEVICE_IGPU, DEVICE_ACCEL = 0, 1, 2, 3  # enum ggml_backend_dev_type


def _lib_dir() -> Path:
    found = library_file()
    if found is None:
        raise EngineError("cannot find the llama.cpp library llama-cpp-python loaded")
    return found.parent


@functools.cache
def ggml_libs() -> Any:
    """libggml (the backend registry) and libggml-base (the abort hook), already loaded by libllama:
    dlopen hands back the same copies."""
    llama()  # the backends registered, llama.cpp's log routed
    lib_dir = _lib_dir()
    ggml = ctypes.CDLL(str(lib_dir / "libggml.so.0"))  # the sonames libllama loaded: a wheel
    base = ctypes.CDLL(str(lib_dir / "libggml-base.so.0"))  # holds copies, not links, under other names
    p, s = ctypes.c_void_p, ctypes.c_size_t
    for name, args, res in (
        ("ggml_backend_reg_by_name", [ctypes.c_char_p], p),
        ("ggml_backend_reg_count", [], s),
        ("ggml_backend_reg_get", [s], p),
        ("ggml_backend_reg_name", [p], ctypes.c_char_p),
        ("ggml_backend_dev_backend_reg", [p], p),
        ("ggml_backend_reg_get_proc_address", [p, ctypes.c_char_p], p),
        ("ggml_backend_register", [p], None),
        ("ggml_backend_reg_dev_count", [p], s),
        ("ggml_backend_reg_dev_get", [p, s], p),
        ("ggml_backend_dev_by_type", [ctypes.c_int], p),
        ("ggml_backend_dev_count", [], s),
        ("ggml_backend_dev_get", [s], p),
        ("ggml_backend_dev_type", [p], ctypes.c_int),
        ("ggml_backend_dev_name", [p], ctypes.c_char_p),
        ("ggml_backend_dev_description", [p], ctypes.c_char_p),
        ("ggml_backend_dev_memory", [p, ctypes.POINTER(s), ctypes.POINTER(s)], None),
    ):
        fn = getattr(ggml, name)
        fn.argtypes, fn.restype = args, res
    base.ggml_set_abort_callback.argtypes = [ctypes.c_void_p]
    base.ggml_set_abort_callback.restype = ctypes.c_void_p
    return ggml, base


HIDE_ENV = "RUNNER_HIDE_BACKENDS"  # e.g. RPC,CUDA: runner acts as on a build without them (docs/install.md)


def hidden_backends() -> frozenset[str]:
    """$RUNNER_HIDE_BACKENDS's names, upper case: what runner says and does on a build without them,
    seen on this one (runner doctor's and runner worker's answers to a missing backend, tested)."""
    return frozenset(n.strip().upper() for n in os.environ.get(HIDE_ENV, "").split(",") if n.strip())


def backend_names() -> list[str]:
    """The backends this build registered, in ggml's order ('CPU', 'RPC', 'CUDA', 'Metal', …)."""
    ggml, _ = ggml_libs()
    hidden = hidden_backends()
    names = [_reg_name(ggml.ggml_backend_reg_get(i)) for i in range(ggml.ggml_backend_reg_count())]
    return [name for name in names if name.upper() not in hidden]


def _reg_name(reg: int | None) -> str:
    ggml, _ = ggml_libs()
    return (ggml.ggml_backend_reg_name(reg) or b"?").decode(errors="replace") if reg else "?"


def has_backend(name: str) -> bool:
    """Whether this build registered the backend (and runner is not told to hide it)."""
    ggml, _ = ggml_libs()
    return name.upper() not in hidden_backends() and bool(ggml.ggml_backend_reg_by_name(name.encode()))


@dataclass(frozen=True)
class Device:
    """A device llama.cpp sees, as ggml describes it (free memory: the CPU device's is the RAM's)."""

    name: str
    description: str
    kind: str  # "cpu", "gpu", "igpu", "accel"
    backend: str
    free_bytes: int
    total_bytes: int


_KINDS = {DEVICE_CPU: "cpu", DEVICE_GPU: "gpu", DEVICE_IGPU: "igpu", DEVICE_ACCEL: "accel"}


def _visible() -> Iterator[tuple[int, str]]:
    """(device, its backend's name) for every device of a backend runner is not told to hide."""
    ggml, _ = ggml_libs()
    hidden = hidden_backends()
    for i in range(ggml.ggml_backend_dev_count()):
        device = ggml.ggml_backend_dev_get(i)
        backend = _reg_name(ggml.ggml_backend_dev_backend_reg(device))
        if backend.upper() not in hidden:
            yield device, backend


def devices() -> list[Device]:
    """Every device of the backends this build registered (workers' too, once --rpc added them)."""
    ggml, _ = ggml_libs()
    found = []
    for device, backend in _visible():
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        description = (ggml.ggml_backend_dev_description(device) or b"").decode(errors="replace").strip()
        kind = _KINDS.get(ggml.ggml_backend_dev_type(device), "other")
        found.append(Device(device_name(device), description, kind, backend, free.value, total.value))
    return found


def has_gpu() -> bool:
    """A local GPU (or integrated GPU) device among the backends this build registered (a worker's
    device is a GPU to ggml too); no device's memory is asked."""
    ggml, _ = ggml_libs()
    gpu = (DEVICE_GPU, DEVICE_IGPU)
    return any(b != "RPC" and ggml.ggml_backend_dev_type(d) in gpu for d, b in _visible())


def cpu_features() -> list[str]:
    """The CPU features this build's kernels use here ('AVX2', 'AMX_INT8', …), from its system info."""
    info = llama().llama_print_system_info().decode(errors="replace")
    return re.findall(r"(\w+) = 1", info)


def library_files() -> dict[str, Path]:
    """The shared libraries beside libllama ('mtmd': libmtmd, the image and audio projector library)."""
    lib_dir = _lib_dir()
    return {
        name: lib_dir / f"lib{name}.so"
        for name in ("llama", "mtmd", "ggml-rpc")
        if (lib_dir / f"lib{name}.so").exists()
    }


def device_name(device: int) -> str:
    ggml, _ = ggml_libs()
    return (ggml.ggml_backend_dev_name(device) or b"?").decode(errors="replace")


def supports_gpu_offload() -> bool:
    """A GPU device this build can offload to. llama_supports_gpu_offload() alone also says yes for a
    build with the RPC backend (README's install), which offloads only to workers (--rpc)."""
    return bool(llama().llama_supports_gpu_offload()) and has_gpu()


@functools.cache
def cpu_repacks() -> bool:
    """Whether runner lets the CPU backend put weights in its extra buffer types (repacked copies).

    Not on a build with ggml's AMX kernels: on AMX CPUs (Sapphire Rapids and later) the pinned
    llama.cpp places weights in an AMX buffer, and its AMX matmul segfaults on the first batch of
    more than one token (ggml-org/llama.cpp#20824; the fix, #26954, is not in the pin). The extra
    buffer types come as a set (llama_model_params.use_extra_bufts), so CPU_REPACK goes with it.
    """
    return "AMX_INT8" not in cpu_features()


def repack_types() -> frozenset[str]:
    """The weight types the CPU backend repacks as the engine loads them (for the memory estimate)."""
    from runner.gguf import REPACK_TYPES

    return REPACK_TYPES if cpu_repacks() else frozenset()


def kv_type_id(name: str) -> int:
    """The ggml type id of a KV cache type name ('q8_0' -> 8), from the header reader's table."""
    from runner.gguf import GGML_TYPES

    ids = {type_name.lower(): i for i, (type_name, _, _) in GGML_TYPES.items()}
    if name.lower() not in ids:
        raise EngineError(f"unknown KV cache type {name!r}")
    return ids[name.lower()]


def default_threads() -> int:
    """Physical cores, as llama.cpp picks: decode speed is bound by memory, not by hyperthreads."""
    return max(1, physical_cores() or os.cpu_count() or 1)


@functools.cache
def interrupt_callbacks() -> tuple[Any, Any]:
    """(progress, abort): llama.cpp's hooks for Ctrl-C, made once and kept alive for the process.

    The progress callback stops a model load (it returns false) and the abort callback a llama_decode
    (it returns true) once SIGINT set runner.interrupt's flag. Both run on the thread that called into
    llama.cpp, the main one, where Python also runs the signal handler that sets the flag.
    """
    lib = llama()
    progress = lib.llama_progress_callback(lambda _progress, _data: not interrupt.requested())
    abort = lib.ggml_abort_callback(lambda _data: interrupt.requested())
    return progress, abort


_WORKERS: list[tuple[int, float]] = []  # --rpc: (ggml device, share of the layers) per worker, in order


def use_workers(devices: list[tuple[int, float]]) -> None:
    """The workers' devices every later load of this process offloads to, split by these shares (the
    plan's: runner.memory.plan.worker_shares), in place of a local GPU."""
    _WORKERS[:] = devices


def workers_in_use() -> bool:
    return bool(_WORKERS)


def model_params(lib: Any, n_gpu_layers: int, use_gpu: bool) -> tuple[Any, Any]:
    """llama_model_params as the engine loads with, and what must outlive them (a device list)."""
    mparams = lib.llama_model_default_params()
    mparams.n_gpu_layers = n_gpu_layers if use_gpu else 0
    mparams.use_extra_bufts = cpu_repacks()
    mparams.progress_callback = interrupt_callbacks()[0]
    keep: Any = None
    if not use_gpu:  # an empty (NULL-terminated) device list: no VRAM at all, not even for compute
        keep = (ctypes.c_void_p * 1)(None)
        mparams.devices = ctypes.cast(keep, ctypes.c_void_p)
    elif _WORKERS:  # the workers only, the split given (llama.cpp's own would be by free memory)
        devices = (ctypes.c_void_p * (len(_WORKERS) + 1))(*[d for d, _ in _WORKERS], None)
        split = (ctypes.c_float * max(len(_WORKERS), 16))(*[share for _, share in _WORKERS])
        mparams.devices = ctypes.cast(devices, ctypes.c_void_p)
        mparams.tensor_split = ctypes.cast(split, ctypes.POINTER(ctypes.c_float))
        keep = (devices, split)
    return mparams, keep


@dataclass(frozen=True)
class Placement:
    """Where a load puts the weights and how it keeps the KV cache: the plan's choices (runner.memory),
    the flags winning over them (runner.loader). Defaults: every layer the build can offload, the
    cache in f16, flash attention as llama.cpp's "auto" decides."""

    n_gpu_layers: int | None = None  # None: every layer the build can offload (benchmarks, tests)
    use_gpu: bool = True  # False: no device at all, not even for compute buffers
    kv_type: str | None = None  # None: f16
    flash_attn: bool | None = None  # None: llama.cpp's "auto"

    def gpu_layers(self) -> int:
        """The layers offloaded, as llama_model_params takes them."""
        if not self.use_gpu:
            return 0
        if self.n_gpu_layers is None:
            return -1 if supports_gpu_offload() or workers_in_use() else 0
        return self.n_gpu_layers


ANYWHERE = Placement()  # every layer the build can offload, an f16 cache, flash attention "auto"


FLASH_ATTN_TYPE = {None: -1, True: 1, False: 0}  # llama_flash_attn_type: AUTO, ENABLED, DISABLED


def context_params(
    lib: Any, n_ctx: int, threads: int, kv_type: str | None, flash_attn: bool | None = None, n_seq: int = 1
) -> Any:
    """n_seq sequences share n_ctx, each in its own stream of n_ctx / n_seq cells (kv_unified off,
    llama.cpp's default, which the memory estimate models)."""
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_seq_max = n_seq
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.no_perf = True
    cparams.flash_attn_type = FLASH_ATTN_TYPE[flash_attn]
    if kv_type is not None:
        cparams.type_k = cparams.type_v = kv_type_id(kv_type)
    return cparams


COMPUTE_LINE = re.compile(r"(\S+) compute buffer size = +([0-9.]+) MiB")


def dry_run(
    path: str | os.PathLike[str], placement: Placement, *, n_ctx: int, n_seq: int = 1
) -> dict[str, int] | None:
    """The compute buffers llama.cpp reserves for this load, per buffer type ("CPU", "CUDA0",
    "CUDA_Host"), without allocating them or reading any weight: the model and context created
    with no_alloc, as llama.cpp's own --fit does (common/fit.cpp). Sizes are the log's, to 0.01
    MiB. None when llama.cpp would not say (it could not create the model or the context)."""
    LLAMA_LOG.heard()  # a load begun ahead (runner.engine.preload) mutes the log this reads
    lib = llama()
    mparams, keep = model_params(lib, placement.gpu_layers(), placement.use_gpu)
    mparams.no_alloc = True
    mparams.load_mode = 0  # LLAMA_LOAD_MODE_NONE: no mapping (no_alloc asserts it)
    lines: list[str] = []
    listener = lambda _level, text: lines.append(text)  # noqa: E731
    LLAMA_LOG.listeners.append(listener)
    try:
        with interrupt.deferred():  # Ctrl-C: KeyboardInterrupt once llama.cpp has let go
            model = lib.llama_model_load_from_file(os.fsencode(path), mparams)
            if not model:
                return None
            ctx = lib.llama_init_from_model(
                model,
                context_params(lib, n_ctx, default_threads(), placement.kv_type, placement.flash_attn, n_seq),
            )
            if ctx:
                lib.llama_free(ctx)
            lib.llama_model_free(model)
    finally:
        LLAMA_LOG.listeners.remove(listener)
        del keep
    if not ctx:
        return None
    found = COMPUTE_LINE.findall("".join(lines))
    if not found:  # the log said nothing of them (muted): no figures, not figures of 0
        return None
    return {name: round(float(mib) * (1 << 20)) for name, mib in found}
