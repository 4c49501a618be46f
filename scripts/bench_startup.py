"""Start-up side by side: two or more installs of runner, measured in interleaved rounds.

    python scripts/bench_startup.py before=/tmp/a/bin/runner after=.venv/bin/runner --rounds 30
    python scripts/bench_startup.py now=.venv/bin/runner --minimal --rounds 5

--minimal adds the floor issue 56 measures against: a script that loads the model with
llama-cpp-python's low-level API, tokenizes, decodes, samples one token greedily and prints it, as a
process of its own (its wall time), interleaved with the installs; each install's one-token run
against it (target: <= 1.1x). The script evaluates the same prompt runner does (the model's template
with its default system prompt, from `runner tokens --template --pieces`) on as many threads as runner
starts with (the physical cores).

Each round runs, for every install in turn: `runner --help` (wall), `runner run --help` (wall), and
`runner run MODEL hi --max-tokens 1 --json` (wall, and `timings.startup_s`: the process's start to its
first prefill, as the engine measures it). Interleaving puts every install in the same minute of this
machine's load, so only the ratios between installs are compared; the VM's speed moves by a third
from hour to hour. Medians and quartiles per install, then each install against the first.

The model must be in the cache the environment points at (RUNNER_HOME, HF_HOME): e.g. the test
home, `RUNNER_HOME=~/.cache/runner-tests HF_HOME=~/.cache/runner-tests/hf`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from runner.host import physical_cores

# Python's bytecode is written and read as after a pip install (which precompiles it): a shell that
# sets PYTHONDONTWRITEBYTECODE (this machine's does) recompiles an editable checkout's ~120 modules on
# every start, ~0.09 s that no installed runner pays.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def wall(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=ENV)
    return time.perf_counter() - start, done.stdout


MINIMAL = r"""
import os
import sys
import llama_cpp as L
import ctypes
quiet = L.llama_log_callback(lambda *a: None)  # kept: ctypes frees a callback nobody holds
L.llama_log_set(quiet, None)
L.llama_backend_init()
model = L.llama_model_load_from_file(sys.argv[1].encode(), L.llama_model_default_params())
params = L.llama_context_default_params()
params.n_ctx, params.n_batch = 512, 512
params.n_threads = params.n_threads_batch = int(sys.argv[3])  # runner's default: the physical cores
ctx = L.llama_init_from_model(model, params)
vocab = L.llama_model_get_vocab(model)
text = sys.argv[2].encode()  # the prompt as runner renders "hi" with the model's own template
tokens = (L.llama_token * 256)()
n = L.llama_tokenize(vocab, text, len(text), tokens, 256, False, True)
L.llama_decode(ctx, L.llama_batch_get_one(tokens, n))
chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
token = L.llama_sampler_sample(chain, ctx, -1)
piece = ctypes.create_string_buffer(64)
size = L.llama_token_to_piece(vocab, token, piece, 64, 0, False)
print(piece.raw[:size].decode("utf-8", "replace"))
"""


def model_file(model: str, exe: str) -> str:
    """The GGUF file `runner show` finds for MODEL (offline: nothing fetched)."""
    return str(json.loads(wall([exe, "show", model, "--offline", "--json"])[1])["file"])


def rendered(model: str, exe: str) -> str:
    """The text runner evaluates for the prompt "hi": the model's chat template, its default system
    prompt included (SmolLM2's: 31 tokens), so that the script prefills what runner prefills."""
    messages = json.dumps([{"role": "user", "content": "hi"}])
    done = subprocess.run(
        [exe, "tokens", model, "--template", "--pieces", "--offline"],
        input=messages,
        capture_output=True,
        text=True,
        check=True,
        env=ENV,
    )
    return "".join(json.loads(line.split("\t", 1)[1]) for line in done.stdout.splitlines()[1:])


def quartiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4)
    return f"{statistics.median(values):.3f} ({q[0]:.3f}-{q[2]:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("installs", nargs="+", help="LABEL=PATH of a runner executable")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--minimal", action="store_true", help="also the minimal llama-cpp-python script")
    args = parser.parse_args()
    installs = [tuple(item.split("=", 1)) for item in args.installs]
    figures: dict[str, dict[str, list[float]]] = {
        label: {"help": [], "run_help": [], "run": [], "startup": []} for label, _ in installs
    }
    for _label, exe in installs:  # warm the page cache and the header/compute caches once
        wall([exe, "run", args.model, "hi", "--max-tokens", "1", "--json"])
    floor: list[float] = []
    path = model_file(args.model, installs[0][1]) if args.minimal else ""
    text = rendered(args.model, installs[0][1]) if args.minimal else ""
    cores = str(physical_cores() or os.cpu_count() or 1)
    python = str(Path(installs[0][1]).with_name("python"))
    for _ in range(args.rounds):
        if args.minimal:
            floor.append(wall([python, "-c", MINIMAL, path, text, cores])[0])
        for label, exe in installs:
            f = figures[label]
            f["help"].append(wall([exe, "--help"])[0])
            f["run_help"].append(wall([exe, "run", "--help"])[0])
            seconds, out = wall([exe, "run", args.model, "hi", "--max-tokens", "1", "--json"])
            f["run"].append(seconds)
            f["startup"].append(json.loads(out)["timings"]["startup_s"])
    first = installs[0][0]
    print(f"{args.rounds} interleaved rounds; medians (quartiles), seconds")
    print(f"| install | --help | run --help | one-token run, wall | startup_s | startup_s vs {first} |")
    print("|---|---|---|---|---|---|")
    base = statistics.median(figures[first]["startup"])
    for label, _ in installs:
        f = figures[label]
        ratio = statistics.median(f["startup"]) / base
        cells = " | ".join(quartiles(f[k]) for k in ("help", "run_help", "run", "startup"))
        print(f"| {label} | {cells} | {ratio:.3f} |")
    if floor:
        minimal = statistics.median(floor)
        print(f"minimal llama-cpp-python script (load, tokenize, decode, one token): {quartiles(floor)}")
        for label, _ in installs:
            run = statistics.median(figures[label]["run"]) / minimal
            print(f"{label}: one-token run / minimal script = {run:.3f} (target <= 1.1)")


if __name__ == "__main__":
    main()
