"""Download benchmark: runner's pull against a bare hf_hub_download of the same file, same server, same run.

Serves the SmolLM2 test model (98 MB) from the loopback Hub in tests/fakehub/, then, in rounds that
alternate, downloads it into a fresh Hugging Face cache with (a) huggingface_hub.hf_hub_download and
(b) runner.hub.fetch.pull (which also checks the sha256 as the bytes arrive); once each as processes,
(c) `runner pull` and (d) huggingface_hub's own `hf download`. Then the resume test: the connection is
cut at random offsets and the bytes sent more than once are counted, for runner and huggingface_hub.
Last, a flaky link: every response is cut with a 10% chance per MiB it carries (--drop-rate), at a
random point in that MiB, for as long as the download runs; bytes sent twice and wall time, runner
against hf_hub_download in the same run (both with their retry waits made instant).

    python scripts/bench_download.py [--rounds 3] [--drops 5] [--drop-rate 0.1]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO = "bench/SmolLM2-GGUF"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path() -> Path:
    from runner.hub.catalog import load_catalog
    from runner.hub.fetch import locate
    from runner.hub.refs import from_entry

    return locate(from_entry(load_catalog().default_entry))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drops", type=int, default=5)
    parser.add_argument("--drop-rate", type=float, default=0.1, help="chance of a cut per MiB sent")
    args = parser.parse_args()
    source = model_path()
    size = source.stat().st_size

    from huggingface_hub import hf_hub_download

    from runner import retry
    from runner.hub.fetch import pull
    from runner.hub.refs import HubRef
    from tests.fakehub import FakeHub, hf_env, instant_backoff, pointed_at

    work = Path(tempfile.mkdtemp(prefix="bench-download-"))
    timings: dict[str, list[float]] = {"hf_hub_download": [], "runner (in process)": []}
    with FakeHub() as hub:
        hub.add_repo(REPO, {FILE: source})
        for i in range(args.rounds):
            for name in timings:
                cache = work / f"{name[:6]}-{i}"
                with pointed_at(hub.endpoint, cache):
                    t0 = time.perf_counter()
                    if name == "hf_hub_download":
                        hf_hub_download(REPO, FILE)
                    else:
                        pull(HubRef(REPO, file=FILE), quiet=True)
                    timings[name].append(time.perf_counter() - t0)
                shutil.rmtree(cache)
        processes = {
            "runner pull (process)": [sys.executable, "-m", "runner", "pull", f"{REPO}:{FILE}", "-q"],
            "hf download (process)": [str(Path(sys.executable).with_name("hf")), "download", REPO, FILE],
        }
        process_s = {}
        for name, cmd in processes.items():
            cache = work / "process"
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, env=hf_env(hub.endpoint, cache), capture_output=True)
            process_s[name] = time.perf_counter() - t0
            shutil.rmtree(cache)

        rng = random.Random(7)
        twice = {}
        for name in ("hf_hub_download", "runner"):
            cache = work / f"drop-{name}"
            hub.reset_counters()
            hub.add_fault("cdn-lfs", "drop", drop_after=lambda n: rng.randrange(1, n), times=args.drops)
            with pointed_at(hub.endpoint, cache), instant_backoff():
                saved, retry.sleep = retry.sleep, lambda _s: None
                try:
                    if name == "hf_hub_download":
                        hf_hub_download(REPO, FILE)
                    else:
                        pull(HubRef(REPO, file=FILE), quiet=True)
                finally:
                    retry.sleep = saved
            hub.clear_faults()
            twice[name] = hub.sent("cdn-lfs") - size
            shutil.rmtree(cache)

        flaky = {}
        for name in ("hf_hub_download", "runner"):
            cache = work / f"flaky-{name}"
            hub.reset_counters()
            cuts = random.Random(11)
            hub.add_fault("cdn-lfs", "drop", drop_after=per_mib(cuts, args.drop_rate), times=None)
            with pointed_at(hub.endpoint, cache), instant_backoff():
                saved, retry.sleep = retry.sleep, lambda _s: None
                t0 = time.perf_counter()
                outcome = "failed 5 times"
                try:
                    for calls in range(1, 6):  # as a user would: the same command again, up to 5 times
                        try:
                            if name == "hf_hub_download":
                                hf_hub_download(REPO, FILE)
                            else:
                                pull(HubRef(REPO, file=FILE), quiet=True)
                        except Exception as exc:  # what each client does when the link stays this bad
                            print(f"{name}, call {calls}: {type(exc).__name__}", file=sys.stderr)
                            continue
                        outcome = f"done in {calls} call{'s' if calls > 1 else ''}"
                        break
                finally:
                    retry.sleep = saved
                wall = time.perf_counter() - t0
            hub.clear_faults()
            cut = sum(1 for r in hub.log if "cdn-lfs" in r.path and r.fault)
            flaky[name] = (hub.sent("cdn-lfs") - size, wall, cut, outcome)
            shutil.rmtree(cache)
    shutil.rmtree(work)

    base = statistics.median(timings["hf_hub_download"])
    print(f"file {FILE}: {size:,} bytes over loopback · {args.rounds} rounds (medians)")
    print()
    print("| | MB/s | vs hf_hub_download |")
    print("|---|---|---|")
    for name, runs in timings.items():
        t = statistics.median(runs)
        print(f"| {name} | {size / t / 1e6:.0f} | {base / t:.2f} |")
    for name, t in process_s.items():
        print(f"| {name}, start-up included | {size / t / 1e6:.0f} | {base / t:.2f} |")
    print()
    print(
        f"resume after {args.drops} drops at random offsets: bytes sent twice — "
        + " · ".join(f"{name} {n:,}" for name, n in twice.items())
    )
    print()
    print(f"a flaky link ({args.drop_rate:.0%} chance of a cut per MiB sent):")
    print()
    print("| | cuts | bytes sent more than once | wall s | vs hf_hub_download | outcome |")
    print("|---|---|---|---|---|---|")
    hf_wall = flaky["hf_hub_download"][1]
    for name, (extra, wall, cut, outcome) in flaky.items():
        print(f"| {name} | {cut} | {extra:,} | {wall:.2f} | {hf_wall / wall:.2f} | {outcome} |")


def per_mib(rng: random.Random, rate: float):
    """drop_after for the fake Hub: each MiB of a body has `rate` chance of being where it is cut."""
    mib = 1 << 20

    def cut(length: int) -> int:
        for k in range(0, max(1, -(-length // mib))):
            if rng.random() < rate:
                return min(length - 1, k * mib + rng.randrange(mib)) if length > 1 else 0
        return length + 1  # not cut

    return cut


if __name__ == "__main__":
    main()
