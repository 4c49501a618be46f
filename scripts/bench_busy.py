"""Decoding on a shared machine: runner and the raw loop, idle and beside other processes that want the CPU.

    python scripts/bench_busy.py [--model PATH] [--rounds 3] [--tokens 64]

For each situation, in interleaved rounds, medians of decode tok/s:
  idle          alone
  nice19        beside one CPU-bound process per physical core at nice 19
  nice0         beside one CPU-bound process at nice 0
  pair          two of the same at once (both processes' rates, and their sum)
Two targets: `runner run MODEL PROMPT --raw --temperature 0 --max-tokens N --json` (default flags, its
decode tok/s from --json) and the raw loop (scripts/bench_engine.py's Raw: a bare llama_decode loop with
a greedy sampler at the physical core count, what a llama-cpp-python user gets), each as its own
process. Every competitor is started and stopped here, and killed after --bound seconds at the latest.
Ratios: each situation against idle, runner's idle against the raw loop's, the pair's sum against one
alone. The targets of docs/speed.md ("On a shared machine") are printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "The history of the old harbour town begins"
SPIN = "import time\nend = time.time() + {bound}\nwhile time.time() < end:\n    pass\n"


def raw_child(model: Path, tokens: int) -> None:
    """One raw loop, as a process: prints {"decode_tokens_per_s": ...}."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_engine import Raw

    from runner.engine.llamacpp import default_threads

    raw = Raw(model, default_threads())
    _, decode, _ = raw.run(raw.tokenize(PROMPT), tokens)
    print(json.dumps({"decode_tokens_per_s": decode, "threads": default_threads()}))


def start_target(kind: str, model: Path, tokens: int) -> subprocess.Popen[str]:
    if kind == "runner":
        runner = Path(sys.executable).with_name("runner")
        command = [str(runner), "run", str(model), PROMPT, "--raw", "--temperature", "0"]
        command += ["--max-tokens", str(tokens), "--json"]
    else:
        command = [sys.executable, __file__, "--raw-child", "--model", str(model), "--tokens", str(tokens)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def rate_of(process: subprocess.Popen[str], bound: float) -> dict[str, float]:
    try:
        out, _ = process.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"decode": 0.0, "threads": 0, "changes": 0}
    data = json.loads(out)
    timings = data.get("timings", data)
    return {
        "decode": timings["decode_tokens_per_s"],
        "threads": timings.get("threads", data.get("threads", 0)),
        "changes": timings.get("thread_changes", 0),
    }


def competitors(situation: str, cores: int, bound: float) -> list[subprocess.Popen[bytes]]:
    if situation not in ("nice19", "nice0"):
        return []
    n, nice = (cores, 19) if situation == "nice19" else (1, 0)
    spin = SPIN.format(bound=bound)
    # a process group of their own (to be killed as one), in this session: with the kernel's autogroup
    # scheduling (sched_autogroup_enabled, on in most desktop kernels) each session is weighed as a
    # whole and nice counts only within it, so a nice-19 process in another session takes as much
    # as a nice-0 one; `nice make -j2 &` in the shell a runner runs from is in the same session
    started = [
        subprocess.Popen(["nice", "-n", str(nice), sys.executable, "-c", spin], preexec_fn=os.setpgrp)
        for _ in range(n)
    ]
    time.sleep(0.5)  # on the CPU before the target starts
    return started


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for p in processes:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def measure(kind: str, situation: str, model: Path, tokens: int, cores: int, bound: float) -> list[dict]:
    others = competitors(situation, cores, bound)
    try:
        targets = [start_target(kind, model, tokens) for _ in range(2 if situation == "pair" else 1)]
        return [rate_of(t, bound) for t in targets]
    finally:
        stop(others)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--bound", type=float, default=120.0, help="seconds a process may take at most")
    parser.add_argument("--only", nargs="*", default=["idle", "nice19", "nice0", "pair"])
    parser.add_argument("--raw-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_engine import default_model

        args.model = default_model()
    if args.raw_child:
        raw_child(args.model, args.tokens)
        return
    from runner.engine.llamacpp import default_threads

    cores = default_threads()
    rates: dict[tuple[str, str], list[list[dict]]] = {}
    for _ in range(args.rounds):
        for situation in args.only:
            for kind in ("runner", "raw"):
                got = measure(kind, situation, args.model, args.tokens, cores, args.bound)
                rates.setdefault((kind, situation), []).append(got)
    print(f"{os.cpu_count()} CPUs, {cores} physical cores; {args.rounds} rounds of {args.tokens} tokens")
    print("| situation | runner tok/s | vs idle | threads (changes) | raw loop tok/s | vs idle |")
    print("|---|---|---|---|---|---|")
    idle = {k: statistics.median(r[0]["decode"] for r in rates[(k, "idle")]) for k in ("runner", "raw")}
    for situation in args.only:
        cells = []
        for kind in ("runner", "raw"):
            rounds = rates[(kind, situation)]
            each = statistics.median(statistics.median(x["decode"] for x in r) for r in rounds)
            total = statistics.median(sum(x["decode"] for x in r) for r in rounds)
            shown = f"{each:.1f}" + (f" each, {total:.1f} together" if situation == "pair" else "")
            ratio = (total if situation == "pair" else each) / idle[kind]
            cells.append((shown, ratio, rounds))
        (rs, rr, rounds), (ws, wr, _) = cells
        threads = statistics.median(x["threads"] for r in rounds for x in r)
        changes = statistics.median(x["changes"] for r in rounds for x in r)
        print(f"| {situation} | {rs} | {rr:.2f} | {threads:g} ({changes:g}) | {ws} | {wr:.2f} |")
    print(f"runner idle / raw loop idle: {idle['runner'] / idle['raw']:.3f}")
    print("targets: nice19 >= 0.80 x idle; nice0 >= 0.45 x idle; pair together >= 0.90 x one alone; ")
    print("         idle >= 0.98 x the raw loop")


if __name__ == "__main__":
    main()
