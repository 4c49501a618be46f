"""RPC, measured (issue 28): runner's --rpc against llama.cpp's own RPC client, and the worker's tensor cache.

    python scripts/bench_rpc.py [--rounds 5] [--repetitions 2] [--peers /tmp/peers/build/bin] [--json]
                                [--threads 2] [--worker-threads 1] [--workers runner,ggml]
                                [--only speed|reload] [--model smollm2]

Speed: prefill (pp512: 512 random tokens from an empty cache) and decode (tg128: 128 tokens after a
one-token prompt, greedy, end-of-text ignored) tok/s, as llama-bench and `runner bench` define them,
  local     the model on this machine alone (client threads: --threads)
  RPC       all layers over two loopback workers: two `runner worker --threads 1 --no-cache`, then
            two of llama.cpp's own `ggml-rpc-server -t 1` (--workers picks), the same two processes
            for both clients, which take turns (a worker serves one client at a time): each client
            is stopped before the other connects
for each client:
  runner        a process that loads the model as `runner bench --rpc` does (connect_workers, then
                open_model at bench's context) and runs `runner bench`'s pp512/tg128 loop
                (runner.commands.bench._single, its warm-up, greedy sampling and random tokens; `runner
                bench` itself also times end-to-end runs and three batch loads, minutes a call on a
                2-core machine). The engine's prefill ends with llama_synchronize (llama_decode returns
                once the last worker's graph is sent, not computed: before, bench's pp512 over two
                workers read about 2x too high). runner splits the layers by the workers' reported
                memory: 50/50 for two workers on one machine.
  llama-server  llama.cpp's own client (built from the pinned sdist's vendor/llama.cpp, -DGGML_RPC=ON),
                `-t T -c 768 -np 1 --fit off`, over RPC `--rpc A,B -ngl 99 --tensor-split 1,1`: pp512
                from a POST /completion of 512 random token ids with n_predict 1 (timings.prompt_n /
                prompt_ms), tg128 from one of a single token with n_predict 129 (timings.predicted_per_
                second: 128 decode steps, the first token coming from the prompt's logits), greedy,
                cache_prompt false, ignore_eos, after a warm-up request.
What each client placed on each runner worker (the most it held, by the workers' own "a client
allocated" lines: weights, KV cache and compute buffers) is shown under the table; the weights' buffers
in the logs show the split (for SmolLM2, 35.5 MB and 61.1 MB for both clients).

Cached reload: for MODEL and for a synthetic 672 MB llama whose matrices are all over ggml-rpc's 10 MB
hash threshold (as a big model's are; --no-big leaves it out), a fresh `runner worker --cache
EMPTY_DIR` and `runner run MODEL "Hi" --max-tokens 1 --json --rpc EP` twice: the first load sends
the weights, the second only the hashes of the tensors the
worker cached (those of 10 MB and more; the smaller ones are sent again); against a `--no-cache` worker,
whose second load sends the weights again. Load time is the run's timings.load_s (llama.cpp's model
load, the transfer included); the whole command's wall time beside it.

Rounds interleave the clients (the first one alternates) and a fresh process is started for each
measurement; figures are medians over rounds x repetitions. Targets: runner over RPC >= 0.95x
llama-server over the same workers and split (prefill and decode); the cached reload <= 0.3x the
first load. Progress on stderr, the table on stdout (with --json, stdout is one JSON object and the
table goes to stderr). Logs of everything started go to a temporary folder, named at the start; every
process started is stopped at the end (Ctrl-C and SIGTERM included). Without the peers in --peers, the
llama-server columns and the ggml-rpc-server workers are skipped, with a note.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
from benchlib import free_port, machine, peer_flags, progress, target

PP, TG = 512, 128  # runner bench's (checked against runner.commands.bench in the runner client)
CTX = PP + TG + 64  # runner bench's context; runner pads it to a multiple of 256
PADDED_CTX = -(-CTX // 256) * 256  # llama-server's -c: the same context as runner's
PEERS = Path("/tmp/peers/build/bin")
READY_S = 180.0
RUN_S = 900.0
HELD = re.compile(r"it holds ([0-9.]+) (B|KB|MB|GB|TB)")
UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
CLIENTS = ("runner", "llama-server")


def model_file(model: str) -> Path:
    """The GGUF: a path as given, else the catalog alias's cached copy (RUNNER_HOME as the user's own,
    then the tests' ~/.cache/runner-tests)."""
    if Path(model).is_file():
        return Path(model).resolve()
    from runner.hub import fetch
    from runner.hub.catalog import load_catalog
    from runner.hub.refs import from_entry

    entry = load_catalog().get(model)
    if entry is None:
        raise SystemExit(f"bench_rpc: {model} is neither a .gguf file nor an alias in the catalog")
    found = fetch.local_copy(from_entry(entry))
    if found is None and "RUNNER_HOME" not in os.environ:
        home = Path("~/.cache/runner-tests").expanduser()
        os.environ["RUNNER_HOME"] = str(home)  # the runner processes started later inherit it
        os.environ.setdefault("HF_HOME", str(home / "hf"))
        found = fetch.local_copy(from_entry(entry))
    if found is None:
        raise SystemExit(f"bench_rpc: {model} is not in the cache: `runner pull {model}` first")
    return Path(found)


def n_vocab(path: Path) -> int:
    from runner.gguf import read_header

    return len(read_header(path).metadata["tokenizer.ggml.tokens"])


# -- processes ---------------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    port: int = 0
    host: str = "127.0.0.1"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def text(self, since: int = 0) -> str:
        return self.log.read_bytes()[since:].decode(errors="replace")

    def size(self) -> int:
        return self.log.stat().st_size


STARTED: list[Proc] = []  # every process this script started and has not stopped yet


def launch(name: str, command: list[str], log: Path, port: int = 0, stdout: Any = None) -> Proc:
    """A process in a session of its own (stopped as a group), its output in `log` (stdout too,
    unless `stdout` is given)."""
    with log.open("wb") as out:  # the child holds its own copy of the descriptor
        process = subprocess.Popen(
            command,
            stdout=out if stdout is None else stdout,
            stderr=out if stdout is not None else subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    proc = Proc(name, process, log, port)
    STARTED.append(proc)
    return proc


def stop(proc: Proc, grace: float = 10.0) -> None:
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(proc.process.pid, sig)
        try:
            proc.process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    if proc in STARTED:
        STARTED.remove(proc)


def stop_all() -> None:
    for proc in reversed(list(STARTED)):
        stop(proc, grace=5.0)


def wait_until(ready: Callable[[], bool], proc: Proc, what: str, timeout: float = READY_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.process.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.process.returncode}; its log: {proc.log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout:.0f} s; its log: {proc.log}")
        time.sleep(0.05)


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def finish(proc: Proc, what: str, timeout: float = RUN_S) -> None:
    """Wait for a client process that ends by itself; a failure names its log."""
    try:
        proc.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise RuntimeError(f"{what} still running after {timeout:.0f} s; its log: {proc.log}") from None
    if proc in STARTED:
        STARTED.remove(proc)
    if proc.process.returncode != 0:
        raise RuntimeError(f"{what} exited with {proc.process.returncode}; its log: {proc.log}")


# -- workers -----------------------------------------------------------------------------------------


NETNS, HERE_IP, THERE_IP = "runner-bench-rpc", "10.77.0.1", "10.77.0.2"  # --link: the worker's host


@contextlib.contextmanager
def shaped_link(rate: str | None) -> Iterator[None]:
    """--link RATE: a second host in a network namespace of its own, behind a veth pair shaped to RATE
    each way (tc's token bucket; 1gbit carries ~115 MB/s): a worker on another machine, as far as the
    bytes can tell. Needs root and iproute2; removed at the end."""
    if rate is None:
        yield
        return
    shape = ["rate", rate, "burst", "256kb", "latency", "10ms"]
    steps = [
        ["ip", "netns", "add", NETNS],
        ["ip", "link", "add", "rbh0", "type", "veth", "peer", "name", "rbh1"],
        ["ip", "link", "set", "rbh1", "netns", NETNS],
        ["ip", "addr", "add", f"{HERE_IP}/24", "dev", "rbh0"],
        ["ip", "link", "set", "rbh0", "up"],
        ["ip", "netns", "exec", NETNS, "ip", "addr", "add", f"{THERE_IP}/24", "dev", "rbh1"],
        ["ip", "netns", "exec", NETNS, "ip", "link", "set", "rbh1", "up"],
        ["ip", "netns", "exec", NETNS, "ip", "link", "set", "lo", "up"],
        ["tc", "qdisc", "add", "dev", "rbh0", "root", "tbf", *shape],
        ["ip", "netns", "exec", NETNS, "tc", "qdisc", "add", "dev", "rbh1", "root", "tbf", *shape],
    ]  # fmt: skip
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["ip", "link", "del", "rbh0"], capture_output=True)
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)


def runner_worker(logs: Path, threads: int, cache: Path | None, tag: str, remote: bool = False) -> Proc:
    """`runner worker` here on loopback, or (remote: --link) in the shaped namespace."""
    port = free_port()
    command = [sys.executable, "-m", "runner", "worker", "--port", str(port), "--threads", str(threads)]
    command += ["--cache", str(cache)] if cache is not None else ["--no-cache"]
    if remote:
        command = ["ip", "netns", "exec", NETNS, *command, "--host", THERE_IP]
    proc = launch(f"runner worker {port}", command, logs / f"{tag}-runner-worker-{port}.log", port)
    if remote:
        proc.host = THERE_IP
    wait_until(lambda: "runner worker on" in proc.text(), proc, proc.name)
    return proc


def ggml_worker(peers: Path, logs: Path, threads: int, tag: str) -> Proc:
    port = free_port()
    command = [str(peers / "ggml-rpc-server"), "-H", "127.0.0.1", "-p", str(port), "-t", str(threads)]
    proc = launch(f"ggml-rpc-server {port}", command, logs / f"{tag}-ggml-rpc-server-{port}.log", port)
    wait_until(lambda: listening(port), proc, proc.name)  # its banner is not flushed to a file
    return proc


def held_bytes(worker: Proc, since: int) -> float | None:
    """The most a client held on a runner worker after log offset `since`, by the worker's own lines."""
    found = [float(n) * UNITS[u] for n, u in HELD.findall(worker.text(since))]
    return max(found) if found else None


# -- clients -----------------------------------------------------------------------------------------


def runner_client_main(args: argparse.Namespace) -> None:
    """In a child process: load as `runner bench --rpc` does and run its pp/tg/TTFT loop
    (runner.commands.bench._single: pp512, tg128, greedy, a warm-up first); print JSON. The engine's
    prefill waits for the workers (llama_synchronize) before it returns."""
    from runner.commands import bench
    from runner.commands.output import describe_load
    from runner.loader import connect_workers, open_model
    from runner.settings import LoadSettings

    assert (bench.PP, bench.TG) == (PP, TG), (bench.PP, bench.TG)
    if args.rpc:
        connect_workers(args.rpc)
    loaded = open_model(args.model, LoadSettings(ctx=CTX, threads=args.threads))
    try:
        print(describe_load(loaded), file=sys.stderr, flush=True)
        samples = bench._single(loaded, args.repetitions, lambda _step: None)
    finally:
        loaded.close()
    pp, tg = samples[f"pp{PP}"], samples[f"tg{TG}"]
    print(json.dumps({"pp": pp, "tg": tg, "load_s": loaded.engine.load_s}))


def measure_runner(args: argparse.Namespace, logs: Path, tag: str, rpc: str | None) -> dict[str, Any]:
    command = [sys.executable, os.path.abspath(__file__), "--runner-client", "--model", args.model]
    command += ["--threads", str(args.threads), "--repetitions", str(args.repetitions)]
    command += ["--rpc", rpc] if rpc else []
    out = logs / f"{tag}-runner.json"
    with out.open("wb") as stdout:
        proc = launch("runner client", command, logs / f"{tag}-runner.log", stdout=stdout)
    finish(proc, f"the runner client ({tag})")
    return json.loads(out.read_text().strip().splitlines()[-1])


def complete(client: httpx.Client, tokens: list[int], n_predict: int) -> dict[str, Any]:
    body = {
        "prompt": tokens, "n_predict": n_predict, "temperature": 0, "cache_prompt": False,
        "ignore_eos": True, "stream": False,
    }  # fmt: skip
    response = client.post("/completion", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"llama-server: HTTP {response.status_code}: {response.text[:300]}")
    return dict(response.json()["timings"])


def measure_llama_server(
    args: argparse.Namespace, logs: Path, tag: str, rpc: str | None, vocab: int, seed: int
) -> dict[str, Any]:
    port = free_port()
    command = [str(args.peers / "llama-server"), "-m", str(args.model_path), "--host", "127.0.0.1"]
    command += ["--port", str(port), "-t", str(args.threads), "-c", str(PADDED_CTX), "-np", "1"]
    command += ["--fit", "off", *peer_flags()]
    if rpc:
        shares = ",".join("1" for _ in rpc.split(","))
        command += ["--rpc", rpc, "-ngl", "99", "--tensor-split", shares]
    proc = launch("llama-server", command, logs / f"{tag}-llama-server.log", port)
    url = f"http://127.0.0.1:{port}"
    rng = random.Random(seed)
    try:
        start = time.perf_counter()

        def healthy() -> bool:
            try:
                return httpx.get(f"{url}/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, proc, "llama-server")
        ready = time.perf_counter() - start
        pp: list[float] = []
        tg: list[float] = []
        with httpx.Client(base_url=url, timeout=RUN_S) as client:
            complete(client, [rng.randrange(vocab) for _ in range(8)], 4)  # a warm-up
            for _ in range(args.repetitions):
                t = complete(client, [rng.randrange(vocab) for _ in range(PP)], 1)
                if t["prompt_n"] != PP:
                    raise RuntimeError(f"llama-server evaluated {t['prompt_n']} prompt tokens, not {PP}")
                pp.append(t["prompt_n"] / (t["prompt_ms"] / 1000))
                t = complete(client, [rng.randrange(vocab)], TG + 1)
                if t["predicted_n"] != TG + 1:
                    raise RuntimeError(f"llama-server generated {t['predicted_n']} tokens, not {TG + 1}")
                tg.append(t["predicted_per_second"])  # (predicted_n - 1) decode steps / predicted_ms
        return {"pp": pp, "tg": tg, "ready_s": ready}
    finally:
        stop(proc)


# -- the speed part ------------------------------------------------------------------------------------


@dataclass
class Setup:
    key: str  # "local", "rpc-runner", "rpc-ggml"
    label: str
    workers: list[Proc]

    @property
    def rpc(self) -> str | None:
        return ",".join(w.endpoint for w in self.workers) or None


def speed_round(
    args: argparse.Namespace, logs: Path, setups: list[Setup], clients: list[str], i: int, vocab: int
) -> dict[str, dict[str, Any]]:
    """One round: each client in each setup, one after the other; the first client alternates."""
    order = clients if i % 2 == 0 else clients[::-1]
    done: dict[str, dict[str, Any]] = {}
    for setup in setups:
        for client in order:
            tag = f"r{i + 1}-{setup.key}"
            progress(f"round {i + 1}/{args.rounds}: {client}, {setup.label}")
            offsets = [w.size() for w in setup.workers]
            if client == "runner":
                result = measure_runner(args, logs, tag, setup.rpc)
            else:
                result = measure_llama_server(args, logs, tag, setup.rpc, vocab, seed=i)
            if setup.key == "rpc-runner":
                result["held_bytes"] = [held_bytes(w, o) for w, o in zip(setup.workers, offsets, strict=True)]
            pp, tg = statistics.median(result["pp"]), statistics.median(result["tg"])
            held = result.get("held_bytes")
            shown = f", held on the workers {' + '.join(mb(h) for h in held)}" if held else ""
            progress(f"  pp{PP} {pp:.1f} tok/s, tg{TG} {tg:.1f} tok/s{shown}")
            done[f"{setup.key}/{client}"] = result
    return done


def mb(n: float | None) -> str:
    return "?" if n is None else f"{n / 1e6:.1f} MB"


# -- the cached reload ---------------------------------------------------------------------------------


def timed_run(args: argparse.Namespace, logs: Path, tag: str, endpoint: str, model: str) -> dict[str, float]:
    command = [sys.executable, "-m", "runner", "run", model, "Hi", "--max-tokens", "1"]
    command += ["--temperature", "0", "--no-prompt-cache", "--json", "--threads", str(args.threads)]
    command += ["--rpc", endpoint]
    out = logs / f"{tag}.json"
    start = time.perf_counter()
    with out.open("wb") as stdout:
        proc = launch("runner run", command, logs / f"{tag}.log", stdout=stdout)
    finish(proc, f"runner run ({tag})")
    wall = time.perf_counter() - start
    return {"load_s": float(json.loads(out.read_text())["timings"]["load_s"]), "wall_s": wall}


def big_model(folder: Path, tokenizer: Path) -> Path:
    """A synthetic llama (random f16 weights, 2 layers of n_embd 2560, SmolLM2's tokenizer, 672 MB)
    whose matrices are all over ggml-rpc's 10 MB hash threshold, as a big model's are: what the
    worker's cache is for."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import synth

    spec = synth.Spec(
        "llama", n_layer=2, n_embd=2560, n_head=20, n_head_kv=20, n_ff=10240, n_vocab=49152, tied=True,
        tokenizer=tokenizer,
    )  # fmt: skip
    path = folder / "big-2x2560-f16.gguf"
    return path if path.is_file() else synth.write_model(path, spec)


def reload_round(args: argparse.Namespace, logs: Path, i: int, model: str) -> dict[str, dict[str, Any]]:
    done: dict[str, dict[str, Any]] = {}
    for kind in ("cache", "no-cache"):
        tag = f"r{i + 1}-reload-{Path(model).stem}-{kind}"
        folder = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=logs)) if kind == "cache" else None
        progress(f"round {i + 1}/{args.rounds}: two loads over a worker with {'--cache' if folder else kind}")
        worker = runner_worker(logs, args.worker_threads, folder, tag, remote=args.link is not None)
        try:
            first = timed_run(args, logs, f"{tag}-first", worker.endpoint, model)
            second = timed_run(args, logs, f"{tag}-second", worker.endpoint, model)
        finally:
            stop(worker)
        cached = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder else 0
        done[kind] = {"first": first, "second": second, "cache_bytes": cached}
        progress(
            f"  load {first['load_s']:.2f} s then {second['load_s']:.2f} s "
            f"(wall {first['wall_s']:.2f} s then {second['wall_s']:.2f} s)"
            + (f", {mb(cached)} in the worker's cache" if folder else "")
        )
    return done


# -- the report ----------------------------------------------------------------------------------------


def pooled(rounds: list[dict[str, Any]], key: str, figure: str) -> float | None:
    values = [v for r in rounds if key in r for v in r[key][figure]]
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def cell(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def report(
    args: argparse.Namespace,
    info: dict[str, str],
    setups: list[Setup],
    clients: list[str],
    speed: list[dict[str, Any]],
    reload: dict[str, list[dict[str, Any]]],
    out: TextIO,
) -> dict[str, Any]:
    """The tables and the targets on `out`; returns the medians and the targets."""
    for key, value in info.items():
        print(f"{key}: {value}", file=out)
    print(f"medians of {args.rounds} rounds x {args.repetitions} repetitions", file=out)
    both = "llama-server" in clients
    medians = {
        f"{s.key}/{c}": {f: pooled(speed, f"{s.key}/{c}", f) for f in ("pp", "tg")}
        for s in setups
        for c in clients
    }
    targets: dict[str, float | None] = {}
    lines = []
    if setups:
        speed_table(setups, clients, medians, out)
        for setup in setups[1:]:
            for figure, name in (("pp", "prefill"), ("tg", "decode")):
                over = [
                    ratio(medians[f"{setup.key}/{c}"][figure], medians[f"local/{c}"][figure]) for c in clients
                ]
                shown = ", ".join(f"{c} {cell(r, 2)}" for c, r in zip(clients, over, strict=True))
                print(f"{setup.label} / local, {name}: {shown}", file=out)
                ours = medians[f"{setup.key}/runner"][figure]
                value = ratio(ours, medians[f"{setup.key}/llama-server"][figure]) if both else None
                label = f"runner / llama-server over {setup.label}, {name}"
                targets[label] = value
                lines.append(target(label, value, 0.95, True))
        for client in clients:
            key = f"rpc-runner/{client}"
            held = [r[key].get("held_bytes") for r in speed if key in r]
            if held and held[-1]:
                shown = " + ".join(mb(h) for h in held[-1])
                print(f"held on the two runner workers (last round), {client}: {shown}", file=out)
    loads = {}
    for model, rounds in reload.items():
        print(f"\nreload of {model}:", file=out)
        loads[model] = reload_table(rounds, out)
        cached = loads[model]["cache"]["second_over_first"]
        targets[f"cached reload / first load, {model}"] = cached
        lines.append(target(f"cached reload / first load (load_s), {model}", cached, 0.3, False))
    print("\ntargets:", file=out)
    for line in lines:
        print(f"  {line}", file=out)
    if setups and not both:
        print("  (no llama-server figures: see peers above)", file=out)
    return {"speed": medians, "reload": loads, "targets": targets}


def speed_table(setups: list[Setup], clients: list[str], medians: dict[str, Any], out: TextIO) -> None:
    both = len(clients) > 1
    print(
        f"\n| setup | figure | {' | '.join(clients)} |" + (" runner / llama-server |" if both else ""),
        file=out,
    )
    print("|---|---|" + "---|" * (len(clients) + both), file=out)
    for setup in setups:
        for figure, name in (("pp", f"prefill pp{PP} tok/s"), ("tg", f"decode tg{TG} tok/s")):
            values = [medians[f"{setup.key}/{c}"][figure] for c in clients]
            row = f"| {setup.label} | {name} | {' | '.join(cell(v) for v in values)} |"
            print(row + (f" {cell(ratio(values[0], values[1]), 3)} |" if both else ""), file=out)


def reload_table(reload: list[dict[str, Any]], out: TextIO) -> dict[str, Any]:
    loads: dict[str, Any] = {}
    print(
        "\n| worker | first load s | second load s | second / first | first wall s | second wall s |",
        file=out,
    )
    print("|---|---|---|---|---|---|", file=out)
    for kind in ("cache", "no-cache"):
        first = statistics.median(r[kind]["first"]["load_s"] for r in reload)
        second = statistics.median(r[kind]["second"]["load_s"] for r in reload)
        walls = [statistics.median(r[kind][n]["wall_s"] for r in reload) for n in ("first", "second")]
        loads[kind] = {
            "first_load_s": first, "second_load_s": second, "second_over_first": second / first,
            "first_wall_s": walls[0], "second_wall_s": walls[1],
            "wall_second_over_first": walls[1] / walls[0],
        }  # fmt: skip
        label = "runner worker --cache (empty at first)" if kind == "cache" else "runner worker --no-cache"
        figures = f"{first:.3f} | {second:.3f} | {second / first:.3f} | {walls[0]:.2f} | {walls[1]:.2f}"
        print(f"| {label} | {figures} |", file=out)
    loads["cache_bytes"] = statistics.median(r["cache"]["cache_bytes"] for r in reload)
    ours, theirs = loads["cache"]["second_load_s"], loads["no-cache"]["second_load_s"]
    print(f"the worker's tensor cache after the first load: {mb(loads['cache_bytes'])}", file=out)
    print(f"second load, --cache / --no-cache: {ours / theirs:.3f}", file=out)
    return loads


# -- main ----------------------------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--model", default="smollm2", help="runner's model (alias or .gguf path)")
    parser.add_argument("--peers", type=Path, default=PEERS, help="llama-server and ggml-rpc-server's folder")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repetitions", type=int, default=2, help="pp/tg runs in each client process")
    parser.add_argument("--threads", type=int, default=2, help="the clients' threads")
    parser.add_argument("--worker-threads", type=int, default=1, help="each worker's threads")
    parser.add_argument(
        "--workers",
        default="runner,ggml",
        help="the RPC setups: runner (runner worker), ggml (ggml-rpc-server)",
    )
    parser.add_argument("--only", choices=("speed", "reload"), help="one part alone")
    parser.add_argument(
        "--link",
        metavar="RATE",
        help="reload over a link shaped to RATE (e.g. 1gbit: a worker on another machine) instead of "
        "loopback: a network namespace and tc (root)",
    )
    parser.add_argument(
        "--no-big",
        dest="big",
        action="store_false",
        help="reload only --model, not also a synthetic 672 MB model of tensors over 10 MB",
    )
    parser.add_argument("--json", action="store_true", help="print medians and every round as JSON")
    parser.add_argument("--runner-client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rpc", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse()
    if args.runner_client:
        runner_client_main(args)
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below stops what was started
    kinds = [k.strip() for k in args.workers.split(",") if k.strip()]
    if set(kinds) - {"runner", "ggml"}:
        raise SystemExit(f"bench_rpc: --workers takes runner and ggml, not {args.workers}")
    args.model_path = model_file(args.model)
    info = {"machine": machine(), "model": str(args.model_path)}
    missing = [n for n in ("llama-server", "ggml-rpc-server") if not (args.peers / n).is_file()]
    clients = list(CLIENTS)
    if missing:
        clients = ["runner"]
        kinds = [k for k in kinds if k != "ggml"]
        info["peers"] = (
            f"NOT FOUND in {args.peers} ({', '.join(missing)}): the llama-server columns and the "
            "ggml-rpc-server workers are skipped (build them from the pinned sdist's vendor/llama.cpp "
            "with -DGGML_RPC=ON, targets llama-server and ggml-rpc-server, and pass --peers BIN_DIR)"
        )
        progress(f"note: peers {info['peers']}")
    else:
        version = subprocess.run(
            [str(args.peers / "llama-server"), "--version"], capture_output=True, text=True
        )
        found = [x for x in (version.stdout + version.stderr).splitlines() if x.startswith("version")]
        info["peers"] = f"{args.peers} (llama-server {found[0].split(':', 1)[1].strip() if found else '?'})"
    info["settings"] = (
        f"clients {args.threads} threads, workers {args.worker_threads} thread each, ctx {PADDED_CTX}, "
        f"pp{PP}/tg{TG}, {args.rounds} rounds x {args.repetitions} repetitions; "
        "llama-server -np 1 --fit off, over RPC -ngl 99 --tensor-split 1,1; "
        "runner splits by the workers' memory"
    )
    logs = Path(tempfile.mkdtemp(prefix="bench_rpc-"))
    progress(f"machine: {info['machine']}\nlogs in {logs}")
    vocab = n_vocab(args.model_path)
    speed: list[dict[str, Any]] = []
    reload: dict[str, list[dict[str, Any]]] = {}
    big = [str(big_model(Path(tempfile.gettempdir()), args.model_path))] if args.big else []
    reload_models = [args.model, *big]
    setups = [Setup("local", "local", [])]
    info["reload link"] = f"a veth pair shaped to {args.link} (tc tbf)" if args.link else "loopback"
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(shaped_link(args.link))
        if args.only != "reload":
            if "runner" in kinds:
                ws = [runner_worker(logs, args.worker_threads, None, "speed") for _ in range(2)]
                setups.append(Setup("rpc-runner", "RPC, 2 runner workers", ws))
            if "ggml" in kinds:
                ws = [ggml_worker(args.peers, logs, args.worker_threads, "speed") for _ in range(2)]
                setups.append(Setup("rpc-ggml", "RPC, 2 ggml-rpc-server workers", ws))
        for i in range(args.rounds):
            if args.only != "reload":
                speed.append(speed_round(args, logs, setups, clients, i, vocab))
            if args.only != "speed":
                for model in reload_models:
                    reload.setdefault(Path(model).name, []).append(reload_round(args, logs, i, model))
    finally:
        stop_all()
        stack.close()
    if args.only == "reload":
        setups = []
    # with --json, stdout is the JSON alone and the table goes to stderr
    medians = report(args, info, setups, clients, speed, reload, sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps({**info, **medians, "rounds": {"speed": speed, "reload": reload}}, indent=2))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # what it started is stopped by then (main's finally)
        progress("bench_rpc: interrupted")
        sys.exit(130)
