"""The host's memory and physical cores: read from the kernel on Linux, from psutil elsewhere.

psutil answers both, but importing it took 15-20 ms of every `runner run` here (a one-shot's start-up
target is half a second). On Linux the same figures are two small reads (~0.3 ms):
  memory  /proc/meminfo's MemTotal and MemAvailable: what psutil.virtual_memory() reports as total
          and available on every kernel since 3.14 (psutil estimates only where MemAvailable is
          missing, and so does this module, by asking psutil)
  cores   the distinct core sibling lists under /sys/devices/system/cpu: what
          psutil.cpu_count(logical=False) counts on Linux
Whatever the kernel does not give as expected falls back to psutil.
"""

from __future__ import annotations

import os

MEMINFO = "/proc/meminfo"
CPU_DIR = "/sys/devices/system/cpu"
_SIBLINGS = ("core_cpus_list", "thread_siblings_list")  # the newer name first, as psutil reads them


_held: tuple[int, int] | None = None  # ram() as it was when hold() was called


def hold() -> None:
    """ram() answers as now until release(): weights loaded beside the plan (runner.engine.preload)
    are not yet the plan's to see as taken, or it would count them twice."""
    global _held
    _held = ram()


def release() -> None:
    global _held
    _held = None


def ram() -> tuple[int, int]:
    """(total, available) bytes of host memory."""
    if _held is not None:
        return _held
    fields = _meminfo()
    if fields is not None:
        return fields
    import psutil

    memory = psutil.virtual_memory()
    return int(memory.total), int(memory.available)


def physical_cores() -> int | None:
    """Physical cores (hyperthreads counted once), or None where nobody can tell."""
    cores = _sysfs_cores()
    if cores:
        return cores
    import psutil

    return psutil.cpu_count(logical=False)


def _meminfo() -> tuple[int, int] | None:
    try:
        with open(MEMINFO, "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found: dict[bytes, int] = {}
    for line in lines:
        name, _, value = line.partition(b":")
        if name in (b"MemTotal", b"MemAvailable"):
            parts = value.split()
            if len(parts) != 2 or parts[1] != b"kB" or not parts[0].isdigit():
                return None
            found[name] = int(parts[0]) * 1024
    if len(found) != 2:
        return None
    return found[b"MemTotal"], found[b"MemAvailable"]


def _sysfs_cores() -> int:
    try:
        names = os.listdir(CPU_DIR)
    except OSError:
        return 0
    cores: set[bytes] = set()
    for name in names:
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        for leaf in _SIBLINGS:
            try:
                with open(os.path.join(CPU_DIR, name, "topology", leaf), "rb") as f:
                    cores.add(f.read().strip())
                break
            except OSError:
                continue
    return len(cores)
