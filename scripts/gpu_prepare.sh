#!/usr/bin/env bash
# Here, on this machine (no GPU needed), before a session that is lent a GPU calls the device: fills gpu/
# (ignored by git; carried by the device tool) with what scripts/gpu_check.sh installs there, 26 MB in all:
#   gpu/llama_cpp_python-*.whl   the CUDA build (sm_90) from ../shared/gpu/build-cuda-wheel.sh: ~30 min on 2 cores
#   gpu/deps/*.whl               what the device's Python 3.12 lacks (diskcache for llama_cpp; gguf to write the
#                                synthetic models there: 153 MB of them would not fit the 64 MiB carry)
# The device already has numpy, jinja2, typing-extensions, psutil, rich, typer, huggingface-hub, nvidia-ml-py and
# CUDA 13's cuBLAS (the device tool's KINDS.md). Then:  run(command="bash scripts/gpu_check.sh", carry=["gpu"])
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p gpu/deps
if ! ls gpu/llama_cpp_python-*.whl >/dev/null 2>&1; then
  bash ../shared/gpu/build-cuda-wheel.sh /tmp/cuda-wheel 0.3.36
  cp /tmp/cuda-wheel/wheel/slim/llama_cpp_python-*.whl gpu/
fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 -d gpu/deps diskcache==5.6.3 gguf==0.19.0
du -sh gpu
