"""What this machine has: RAM, GPUs and their free memory, and whether the llama.cpp build can offload.

NVIDIA GPUs come from NVML (the optional `runner[nvidia]` extra, nvidia-ml-py) or, without it, from
`nvidia-smi`; Apple Silicon shares its RAM with the GPU (Metal may use about 3/4 of it by default).
What the installed llama.cpp build can do (offload, repack) is the engine's to say: the loader asks it and
passes the answer to probe() (runner.loader.machine), so nothing here imports llama_cpp.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from runner.gguf import REPACK_TYPES
from runner.host import ram
from runner.install import GPU_FLAGS, rebuild

NVIDIA_SMI_TIMEOUT_S = 5.0
APPLE_GPU_SHARE = 0.75  # Metal's recommendedMaxWorkingSetSize is about 3/4 of RAM on Apple Silicon
NO_GPU_BACKEND = (  # what --gpu-layers gets on a build without a GPU backend (and no --rpc)
    "this llama.cpp build has no GPU backend, so every layer runs on the CPU; for an NVIDIA GPU: "
    f"{rebuild(GPU_FLAGS['CUDA'])} (Metal, Vulkan, ROCm: docs/install.md)"
)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    total_bytes: int
    free_bytes: int
    backend: str  # "cuda" or "metal"
    source: str  # where the numbers came from: "nvml", "nvidia-smi", "unified memory"
    bandwidth: float | None = None  # bytes/s, from NVML's memory clock and bus width


@dataclass(frozen=True)
class Remote:
    """A worker (`runner worker`, a ggml-rpc server) whose device joins the load (--rpc): memory as the
    worker reports it (ggml's CPU device reports the machine's total RAM as free)."""

    endpoint: str  # host:port
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class Machine:
    ram_total_bytes: int
    ram_available_bytes: int
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)
    can_offload: bool = False  # the installed llama.cpp build has a GPU backend
    repack_types: frozenset[str] = REPACK_TYPES  # weight types the CPU backend repacks as it loads
    workers: tuple[Remote, ...] = ()  # --rpc: the layers go to these, not to a local GPU

    @property
    def usable_gpus(self) -> tuple[Gpu, ...]:
        return self.gpus if self.can_offload and not self.workers else ()

    @property
    def offloads(self) -> bool:
        """Layers can leave the CPU: to the workers (--rpc), else to a GPU the build can use."""
        return bool(self.workers or self.usable_gpus)

    def reinstall_hint(self) -> str | None:
        """The exact command that gives a GPU build, when a GPU is here but the build is CPU-only."""
        if self.can_offload or not self.gpus:
            return None
        return rebuild(GPU_FLAGS["Metal" if self.gpus[0].backend == "metal" else "CUDA"])


def nvidia_gpus() -> list[Gpu]:
    return _from_nvml() or _from_nvidia_smi()


def _from_nvml() -> list[Gpu]:
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no device: NVML raises its own error classes
        return []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            gpus.append(
                Gpu(i, name, int(info.total), int(info.free), "cuda", "nvml", _nvml_bandwidth(pynvml, handle))
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _nvml_bandwidth(pynvml: object, handle: object) -> float | None:
    """Peak memory bandwidth: memory clock (MHz) x 2 (double data rate) x bus width (bits) / 8."""
    try:
        clock = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)  # type: ignore[attr-defined]
        width = pynvml.nvmlDeviceGetMemoryBusWidth(handle)  # type: ignore[attr-defined]
    except Exception:  # older drivers lack one call or the other
        return None
    return clock * 1e6 * 2 * width / 8 if clock and width else None


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Rows of `index, name, memory.total, memory.free` in MiB, as nvidia-smi's CSV prints them."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0].isdigit():
            continue
        try:
            total, free = int(float(parts[2])) << 20, int(float(parts[3])) << 20
        except ValueError:
            continue
        gpus.append(Gpu(int(parts[0]), parts[1], total, free, "cuda", "nvidia-smi"))
    return gpus


def _from_nvidia_smi() -> list[Gpu]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    query = "--query-gpu=index,name,memory.total,memory.free"
    try:
        done = subprocess.run(
            [exe, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(done.stdout) if done.returncode == 0 else []


def apple_gpu(ram_total: int, ram_available: int) -> list[Gpu]:
    if sys.platform != "darwin" or platform.machine() != "arm64":
        return []
    total = int(ram_total * APPLE_GPU_SHARE)
    return [Gpu(0, "Apple GPU (Metal)", total, min(total, ram_available), "metal", "unified memory")]


MEMORY_ENV = "RUNNER_MEMORY"  # e.g. 4G: the most host memory a plan may count as available


def memory_cap() -> int | None:
    """$RUNNER_MEMORY in bytes (a size such as 512M or 4G), or None when unset."""
    value = os.environ.get(MEMORY_ENV, "").strip()
    if not value:
        return None
    from runner.limits import parse_size

    return parse_size(value, MEMORY_ENV)


def probe(
    *,
    can_offload: bool = False,
    repack_types: frozenset[str] = REPACK_TYPES,
    workers: tuple[Remote, ...] = (),
) -> Machine:
    """RAM and GPUs as they are now (RAM at most $RUNNER_MEMORY), with what the caller says of the
    llama.cpp build and of the workers it will load across."""
    total, available = ram()
    cap = memory_cap()
    if cap is not None:
        available = min(available, cap)
    gpus = nvidia_gpus() or apple_gpu(total, available)
    return Machine(total, available, tuple(gpus), can_offload, repack_types, workers)
