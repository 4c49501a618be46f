#!/usr/bin/env bash
# The one prepared device check for a session that is lent a GPU (not yet run on one: none was lent so far).
# First, here: bash scripts/gpu_prepare.sh (the CUDA wheel and two pure wheels into gpu/, never committed).
# Then, through the device tool:  run(command="bash scripts/gpu_check.sh", carry=["gpu"], timeout_s=540)
# It installs the CUDA build, checks that it offloads, writes the synthetic models (tests/synth.py), and compares
# the memory estimate with llama.cpp's own buffers and with the VRAM nvidia-smi sees, full and partial offload,
# and the dry run's compute figures (what runner plans with for a local file) with the compute buffers llama.cpp
# really allocated; the table lands in $OUT/gpu_memory.md as each row is measured.
# GPU_CHECK_ON_CPU=1 rehearses it on a machine without a GPU (with a CPU wheel in gpu/): the figures mean
# nothing there, but every step runs.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=/tmp/site
python3 -m pip install -q --no-deps --no-index --target "$SITE" gpu/*.whl gpu/deps/*.whl
CU=$(python3 -c 'import nvidia, os; print(os.pathsep.join(os.path.join(d, "cu13", "lib") for d in nvidia.__path__))' \
     2>/dev/null || true)
export PYTHONPATH="$SITE:$PWD" LD_LIBRARY_PATH="${CU}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1 RUNNER_BENCH_SYNTH=/tmp/synth
if [ "${GPU_CHECK_ON_CPU:-}" != 1 ]; then
  python3 -c 'import llama_cpp, sys; ok = llama_cpp.llama_supports_gpu_offload(); print("offload:", ok); sys.exit(not ok)'
  nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
fi
python3 tests/synth.py "$RUNNER_BENCH_SYNTH"
OUT=${OUT:-/tmp}
python3 scripts/bench_memory.py "$RUNNER_BENCH_SYNTH"/*.gguf --ctx 2048,8192 --gpu-layers=-1,4,1 | tee "$OUT/gpu_memory.md"
