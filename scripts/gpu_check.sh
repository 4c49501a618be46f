#!/usr/bin/env bash
# The one prepared device check for a session that is lent a GPU (not yet run: no GPU was lent so far).
#
# Here, first (no GPU needed; ~30 min in the background):
#   bash ../shared/gpu/build-cuda-wheel.sh /tmp/cuda-wheel       # -> /tmp/cuda-wheel/wheel/slim/*.whl (~25 MB)
#   mkdir -p gpu && cp /tmp/cuda-wheel/wheel/slim/*.whl gpu/
#   .venv/bin/python -c 'import sys; sys.path.insert(0, "tests"); import synth; synth.write_all("gpu/models")'
#   pip download --no-deps -d gpu/deps typer click rich psutil huggingface-hub jinja2 filelock ...  (pure wheels)
# then, through the device tool, carrying gpu/ (64 MiB at most: the 98 MB SmolLM2 cannot travel, the synthetic
# models can):   bash scripts/gpu_check.sh          (never commit gpu/: it is carried, not kept)
# It installs the CUDA build, checks that it offloads, and compares the memory estimate with llama.cpp's own
# buffers and with NVML's VRAM, full and partial offload, and the dry run's compute figures (what runner plans
# with for a local file) with the compute buffers llama.cpp really allocated; the table lands in $OUT/gpu_memory.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=/tmp/site
pip install -q --no-deps --no-index --target "$SITE" gpu/*.whl gpu/deps/*.whl
CU=$(python3 -c 'import nvidia, os; print(os.pathsep.join(os.path.join(d, "cu13", "lib") for d in nvidia.__path__))' \
     2>/dev/null || true)
export PYTHONPATH="$SITE:$PWD" LD_LIBRARY_PATH="${CU}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
python3 -c 'import llama_cpp, sys; ok = llama_cpp.llama_supports_gpu_offload(); print("offload:", ok); sys.exit(not ok)'
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
OUT=${OUT:-/tmp}
python3 scripts/bench_memory.py gpu/models/*.gguf --ctx 2048,8192 --gpu-layers=-1,4,1 | tee "$OUT/gpu_memory.md"
