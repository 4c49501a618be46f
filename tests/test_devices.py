"""What this machine has: parsing is tested with hand-picked text, the probe on this real machine."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from runner import host
from runner.loader import machine
from runner.memory.devices import Gpu, Machine, parse_nvidia_smi

pytestmark = pytest.mark.fast


def test_nvidia_smi_csv() -> None:
    text = "0, NVIDIA H200, 143771, 142544\n1, NVIDIA GeForce RTX 4090, 24564, 1024\nbad line\n"
    assert parse_nvidia_smi(text) == [
        Gpu(0, "NVIDIA H200", 143771 << 20, 142544 << 20, "cuda", "nvidia-smi"),
        Gpu(1, "NVIDIA GeForce RTX 4090", 24564 << 20, 1024 << 20, "cuda", "nvidia-smi"),
    ]
    assert parse_nvidia_smi("") == []


def test_a_gpu_with_a_cpu_only_build_gets_the_exact_reinstall_command() -> None:
    gpu = Gpu(0, "NVIDIA H200", 1 << 37, 1 << 37, "cuda", "nvml")
    stuck = Machine(1 << 34, 1 << 33, (gpu,), can_offload=False)
    assert stuck.usable_gpus == ()
    assert stuck.reinstall_hint() == (
        'CMAKE_ARGS="-DGGML_CUDA=on -DGGML_RPC=ON" pip install --force-reinstall --no-cache-dir --no-deps '
        "llama-cpp-python==0.3.36"
    )
    assert Machine(1 << 34, 1 << 33, (gpu,), can_offload=True).reinstall_hint() is None
    metal = Gpu(0, "Apple GPU (Metal)", 1 << 34, 1 << 34, "metal", "unified memory")
    assert "-DGGML_METAL=on" in (Machine(1 << 35, 1 << 34, (metal,)).reinstall_hint() or "")


def test_probe_this_machine() -> None:
    here = machine()  # the probe, with what the installed build says of itself
    assert here.ram_total_bytes == psutil.virtual_memory().total
    assert 0 < here.ram_available_bytes <= here.ram_total_bytes
    import llama_cpp

    from runner.engine.llamacpp import has_gpu

    # llama.cpp also says yes for the RPC backend alone (the README's build): runner asks for a GPU device
    assert here.can_offload is (bool(llama_cpp.llama_supports_gpu_offload()) and has_gpu())
    assert llama_cpp.llama_supports_rpc()  # the README's install has the RPC backend (docs/rpc.md)


def test_host_reads_what_psutil_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """runner.host reads the kernel itself (psutil's import cost 15-20 ms of each start): the same
    figures as psutil on this machine, and psutil's own wherever the kernel's files say otherwise."""
    total, available = host.ram()
    memory = psutil.virtual_memory()
    assert total == memory.total
    assert abs(available - psutil.virtual_memory().available) < 0.05 * total  # it moves meanwhile
    assert host.physical_cores() == psutil.cpu_count(logical=False)
    if sys.platform == "linux":  # the kernel's files, not psutil, gave those
        read = host._meminfo()
        assert read is not None and read[0] == total
        assert host._sysfs_cores() == psutil.cpu_count(logical=False)

    odd = tmp_path / "meminfo"
    odd.write_text("MemTotal:       1000 kB\nMemFree:        10 kB\n")  # an old kernel: no MemAvailable
    monkeypatch.setattr(host, "MEMINFO", str(odd))
    assert host._meminfo() is None
    assert host.ram()[0] == psutil.virtual_memory().total
    odd.write_text("MemTotal:       1000 MB\nMemAvailable:   10 kB\n")  # a unit it does not know
    assert host._meminfo() is None
    odd.write_text("MemTotal:       1000 kB\nMemAvailable:   10 kB\n")
    assert host._meminfo() == (1000 * 1024, 10 * 1024)

    (tmp_path / "cpu0" / "topology").mkdir(parents=True)
    (tmp_path / "cpu1" / "topology").mkdir(parents=True)
    (tmp_path / "cpu2").mkdir()  # no topology: not counted
    (tmp_path / "cpufreq").mkdir()  # not a CPU
    (tmp_path / "cpu0" / "topology" / "core_cpus_list").write_text("0,1\n")
    (tmp_path / "cpu1" / "topology" / "thread_siblings_list").write_text("0,1\n")  # the older name
    monkeypatch.setattr(host, "CPU_DIR", str(tmp_path))
    assert host._sysfs_cores() == 1  # two hyperthreads of one core
    (tmp_path / "cpu1" / "topology" / "thread_siblings_list").write_text("2\n")
    assert host._sysfs_cores() == 2
    monkeypatch.setattr(host, "CPU_DIR", str(tmp_path / "missing"))
    assert host.physical_cores() == psutil.cpu_count(logical=False)
