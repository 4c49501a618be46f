"""Decoding on a shared machine: runner and the raw loop, idle and beside other processes that want the CPU.

    python scripts/bench_busy.py [--model PATH] [--rounds 3] [--tokens 64] [--only idle nice19 ...]

For each situation, in interleaved rounds, medians of decode tok/s:
  idle          alone
  nice19        beside one CPU-bound process per physical core at nice 19, in this session (as
                `nice make -j2 &` in the shell runner runs from)
  setsid19      the same processes, each started in a session of its own (another terminal): with the
                kernel's autogroup scheduling nice counts only within a session, so these take as much
                as nice-0 processes would, and runner should behave as beside nice 0
  nice0         beside one CPU-bound process at nice 0
  pair          two of the same at once (both processes' rates, and their sum)
  quota         in a cgroup whose CPU quota is one core less than the machine has (cpu.cfs_quota_us or
                cpu.max, as a container's --cpus sets it); only where this user may make one, else
                left out with a line saying so
Two targets: `runner run MODEL PROMPT --raw --temperature 0 --max-tokens N --json` (default flags, its
decode tok/s from --json) and the raw loop (scripts/bench_engine.py's Raw: a bare llama_decode loop with
a greedy sampler at the physical core count, what a llama-cpp-python user gets), each as its own
process. Every competitor is started and stopped here, and killed after --bound seconds at the latest.
Ratios: each situation against idle, runner's idle against the raw loop's, the pair's sum against one
alone. The targets of docs/speed.md ("On a shared machine") are printed beside them.
"""

from __future__ import annotations

import argparse
import contextlib
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


def start_target(kind: str, model: Path, tokens: int, group: Path | None = None) -> subprocess.Popen[str]:
    if kind == "runner":
        runner = Path(sys.executable).with_name("runner")
        command = [str(runner), "run", str(model), PROMPT, "--raw", "--temperature", "0"]
        command += ["--max-tokens", str(tokens), "--json"]
    else:
        command = [sys.executable, __file__, "--raw-child", "--model", str(model), "--tokens", str(tokens)]
    if group is not None:  # into the cgroup before it starts: every thread it makes is under the quota
        command = ["sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh", *command]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def quota_group(cores: int) -> Path | None:
    """A cgroup of its own with a CPU quota of cores - 1 (at least one), or None where this user
    cannot make one (cgroup v2's cpu.max, or v1's cpu controller)."""
    quota, period = max(1, cores - 1) * 100_000, 100_000
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():  # v2: one tree, cpu.max
        parent, control, value = Path("/sys/fs/cgroup"), "cpu.max", f"{quota} {period}"
    else:  # v1: the cpu controller's own tree
        parent, control, value = Path("/sys/fs/cgroup/cpu"), "cpu.cfs_quota_us", str(quota)
    group = parent / f"runner-bench-{os.getpid()}"
    try:
        group.mkdir()
        (group / control).write_text(value)
        return group
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None


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
    if situation not in ("nice19", "setsid19", "nice0"):
        return []
    n, nice = (1, 0) if situation == "nice0" else (cores, 19)
    spin = SPIN.format(bound=bound)
    # a process group of their own (to be killed as one), in this session, or (setsid19) a session of
    # their own: with the kernel's autogroup scheduling (sched_autogroup_enabled, on in most desktop
    # kernels) each session is weighed as a whole and nice counts only within it, so a nice-19
    # process in another session takes as much as a nice-0 one; `nice make -j2 &` in the shell a
    # runner runs from is in the same session
    apart = situation == "setsid19"
    started = [
        subprocess.Popen(
            ["nice", "-n", str(nice), sys.executable, "-c", spin],
            start_new_session=apart,
            preexec_fn=None if apart else os.setpgrp,
        )
        for _ in range(n)
    ]
    time.sleep(0.5)  # on the CPU before the target starts
    return started


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for p in processes:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def measure(
    kind: str, situation: str, model: Path, tokens: int, cores: int, bound: float, group: Path | None
) -> list[dict]:
    others = competitors(situation, cores, bound)
    inside = group if situation == "quota" else None
    try:
        targets = [start_target(kind, model, tokens, inside) for _ in range(2 if situation == "pair" else 1)]
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
    parser.add_argument("--only", nargs="*", default=["idle", "nice19", "setsid19", "nice0", "pair", "quota"])
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
    group = quota_group(cores) if "quota" in args.only else None
    if "quota" in args.only and group is None:
        print("quota: left out (no cgroup this user may make with a CPU quota)", file=sys.stderr)
        args.only.remove("quota")
    rates: dict[tuple[str, str], list[list[dict]]] = {}
    try:
        for _ in range(args.rounds):
            for situation in args.only:
                for kind in ("runner", "raw"):
                    got = measure(kind, situation, args.model, args.tokens, cores, args.bound, group)
                    rates.setdefault((kind, situation), []).append(got)
                    each = [f"{x['decode']:.1f} tok/s on {x['threads']} ({x['changes']})" for x in got]
                    print(f"{situation} {kind}: {', '.join(each)}", file=sys.stderr)
    finally:
        if group is not None:
            group.rmdir()
    print(f"{os.cpu_count()} CPUs, {cores} physical cores; {args.rounds} rounds of {args.tokens} tokens")
    if group is not None:
        print(f"quota: {max(1, cores - 1)} of {cores} cores ({group})")
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
    print("targets: nice19 >= 0.90 x idle; nice0 >= 0.50 x idle; pair together >= 0.95 x one alone;")
    print("         idle >= 0.98 x the raw loop; setsid19 as beside nice 0 (one thread fewer than the")
    print("         cores; its fair share there is less: its session weighs as much as each of theirs);")
    print("         quota: no target, measured")


if __name__ == "__main__":
    main()
