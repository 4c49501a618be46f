"""What this machine has: parsing is tested with hand-picked text, the probe on this real machine."""

from __future__ import annotations

import psutil

from runner.loader import machine
from runner.memory.devices import Gpu, Machine, parse_nvidia_smi


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
        'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36'
    )
    assert Machine(1 << 34, 1 << 33, (gpu,), can_offload=True).reinstall_hint() is None
    metal = Gpu(0, "Apple GPU (Metal)", 1 << 34, 1 << 34, "metal", "unified memory")
    assert "-DGGML_METAL=on" in (Machine(1 << 35, 1 << 34, (metal,)).reinstall_hint() or "")


def test_probe_this_machine() -> None:
    here = machine()  # the probe, with what the installed build says of itself
    assert here.ram_total_bytes == psutil.virtual_memory().total
    assert 0 < here.ram_available_bytes <= here.ram_total_bytes
    import llama_cpp

    assert here.can_offload is bool(llama_cpp.llama_supports_gpu_offload())
