"""How this install's llama.cpp is rebuilt with a backend: the one command that every "this build lacks
…" message names (runner worker, --rpc, a GPU the build cannot use, runner doctor), and the pin it
installs, which pyproject.toml's requirement must equal (tests/test_packaging.py checks).

llama-cpp-python compiles llama.cpp as it installs, and its backends are chosen by CMAKE_ARGS at that
moment: no package metadata can ask for one. pip keeps the wheel it built in its cache by the sdist's
URL alone, so a later install with other CMAKE_ARGS would get the cached build back: --no-cache-dir
builds it again, --no-deps leaves everything else as it is.
"""

from __future__ import annotations

LLAMA_CPP_PIN = "llama-cpp-python==0.3.36"
RPC_FLAG = "-DGGML_RPC=ON"  # runner worker and --rpc; the README's install builds it in

GPU_FLAGS = {  # ggml's backend name -> the CMake option that builds it (docs/gpu.md)
    "CUDA": "-DGGML_CUDA=on",
    "Metal": "-DGGML_METAL=on",
    "Vulkan": "-DGGML_VULKAN=on",
    "ROCm": "-DGGML_HIP=on",
    "SYCL": "-DGGML_SYCL=on",
}


def rebuild(*flags: str) -> str:
    """The command that reinstalls llama-cpp-python built with these CMake options (and RPC's)."""
    wanted = " ".join(dict.fromkeys((*flags, RPC_FLAG)))
    return f'CMAKE_ARGS="{wanted}" pip install --force-reinstall --no-cache-dir --no-deps {LLAMA_CPP_PIN}'
