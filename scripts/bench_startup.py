"""Start-up side by side: two or more installs of runner, measured in interleaved rounds.

    python scripts/bench_startup.py before=/tmp/a/bin/runner after=.venv/bin/runner --rounds 30

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
import statistics
import subprocess
import time


def wall(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, done.stdout


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
    args = parser.parse_args()
    installs = [tuple(item.split("=", 1)) for item in args.installs]
    figures: dict[str, dict[str, list[float]]] = {
        label: {"help": [], "run_help": [], "run": [], "startup": []} for label, _ in installs
    }
    for _label, exe in installs:  # warm the page cache and the header/compute caches once
        wall([exe, "run", args.model, "hi", "--max-tokens", "1", "--json"])
    for _ in range(args.rounds):
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


if __name__ == "__main__":
    main()
