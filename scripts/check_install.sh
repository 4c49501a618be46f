#!/usr/bin/env bash
# The checkout installed as people install it, each in a fresh place, each giving a working runner:
#   1. `python -m build`: an sdist and a wheel (the wheel built from the sdist), `twine check --strict`;
#   2. pip: the wheel in a fresh venv;  3. `pipx install .`;  4. `uv tool install .`
# Each: `runner doctor --offline` exits 0 and finds the RPC backend, and the test model answers.
# pip, pipx and uv come from the registry into a venv of the script's own; their caches are the
# script's own too (nothing from yours comes back). llama.cpp compiles for each installer's cache:
# pip's, then uv's (pipx 1.18 installs through uv when uv is there): 15-20 minutes on 2 cores.
# Figures: docs/install.md.
#
# Usage: scripts/check_install.sh [WORKDIR]      (default: a new temporary folder, kept)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d /tmp/runner-install.XXXXXX)}
mkdir -p "$work"
export PIP_CACHE_DIR="$work/pip-cache" UV_CACHE_DIR="$work/uv-cache" UV_PYTHON_DOWNLOADS=never
export CMAKE_ARGS="-DGGML_RPC=ON"
export RUNNER_HOME="${RUNNER_HOME:-$HOME/.cache/runner-tests}"  # the suite's model, already fetched
export HF_HUB_CACHE="${HF_HUB_CACHE:-$RUNNER_HOME/hf/hub}" RUNNER_NO_SAVE=1
export PIPX_HOME="$work/pipx" PIPX_BIN_DIR="$work/pipx-bin" UV_TOOL_DIR="$work/uv-tools" UV_TOOL_BIN_DIR="$work/uv-bin"
say() { printf '%s  %s\n' "$(date +%T)" "$*"; }
timed() { local start=$SECONDS; "$@"; say "  took $((SECONDS - start)) s"; }

check() {  # $1: a runner executable
    local runner=$1 answer
    "$runner" doctor --offline > "$work/doctor.txt" || { cat "$work/doctor.txt"; say "FAIL: $runner doctor"; exit 1; }
    grep -q "RPC backend: yes" "$work/doctor.txt" || { say "FAIL: no RPC backend"; exit 1; }
    answer=$("$runner" run smollm2 "Say hello." --max-tokens 8 --temperature 0 --seed 1 2>/dev/null)
    [ -n "$answer" ] || { say "FAIL: $runner run gave nothing"; exit 1; }
    say "  ok: $(grep '^ok *llama.cpp' "$work/doctor.txt" | sed 's/^ok *//'); answer: ${answer//$'\n'/ }"
}

say "tools: build, twine, pipx, uv (into $work/tools)"
python3 -m venv "$work/tools"
"$work/tools/bin/pip" install -q build twine pipx uv
"$work/tools/bin/pip" list 2>/dev/null | grep -E '^(build|twine|pipx|uv) ' | tr -s ' ' | sed 's/^/    /'

say "1. python -m build, twine check --strict"
rm -rf "$work/dist"
timed "$work/tools/bin/python" -m build -q --outdir "$work/dist" "$root" > /dev/null
"$work/tools/bin/twine" check --strict "$work"/dist/*
ls -l "$work"/dist | tail -n +2 | awk '{print "    " $5 " bytes  " $9}'

say "2. pip install of the wheel in a fresh venv (compiles llama.cpp)"
rm -rf "$work/pip-venv"
python3 -m venv "$work/pip-venv"
timed "$work/pip-venv/bin/pip" install -q "$work"/dist/*.whl
check "$work/pip-venv/bin/runner"

say "3. pipx install . (through uv, pipx's default installer when uv is there)"
timed "$work/tools/bin/pipx" install --force "$root" > /dev/null
check "$PIPX_BIN_DIR/runner"

say "4. uv tool install ."
timed "$work/tools/bin/uv" tool install --force --python python3 "$root" > /dev/null 2>&1
check "$UV_TOOL_BIN_DIR/runner"

say "all installs work ($work)"
