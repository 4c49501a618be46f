"""Engine benchmark: runner's generation loop against the engine's limit and llama-cpp-python's API.

Measures, in one process, on one model, thread count and prompt:
  (a) raw     a bare llama_decode loop with a greedy sampler through the low-level bindings: the limit
  (b) hl-api  llama-cpp-python's high-level Llama.create_completion(stream=True)
  (c) runner  runner.engine.engine.Engine.stream
and, as processes: (d) `runner run` end to end (--json timings and wall time) and `runner --help`.
Rounds interleave (a), (b), (c) so machine noise hits all alike; medians are reported with ratios to (a).

--tiny: the per-token cost above llama_decode, where a GPU would see it. A tiny model (2 layers of
width 64, SmolLM2's tokenizer, random f16 weights, written once) decodes in ~0.3-0.45 ms a token on
one core, so whatever runner adds per token shows. Greedy, one thread, no drafting, 5 interleaved
rounds of: the raw loop (tokenize, llama_decode one token, greedy sample, detokenize the piece),
runner's Engine in this process (both also by this thread's CPU time, which other processes move
much less than wall time), and `runner run` as a process (its --json decode timing). Prints the
ratios and the microseconds a token.

    python scripts/bench_engine.py [--model PATH] [--threads 2] [--rounds 5] [--tokens 128]
    python scripts/bench_engine.py --tiny [--rounds 5] [--tokens 1000]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CTX = 2048
PROMPT_TOKENS = 512


def default_model() -> Path:
    from runner.hub.catalog import load_catalog
    from runner.hub.fetch import locate
    from runner.hub.refs import from_entry

    return locate(from_entry(load_catalog().default_entry))


def counting_prompt(tokenize, n_tokens: int) -> str:
    """Raw text a model keeps continuing ("1, 2, 3, ...") with about n_tokens tokens."""
    k = 1
    while len(tokenize(", ".join(str(i) for i in range(1, k + 1)) + ",")) < n_tokens:
        k += 1
    return ", ".join(str(i) for i in range(1, k + 1)) + ","


class Raw:
    """(a): what llama-bench's pp and tg measure, with a greedy sampler and nothing else."""

    def __init__(self, path: Path, threads: int) -> None:
        from runner.engine.llamacpp import cpu_repacks, llama

        self.lib = lib = llama()
        mp = lib.llama_model_default_params()
        mp.n_gpu_layers = -1 if lib.llama_supports_gpu_offload() else 0
        mp.use_extra_bufts = cpu_repacks()  # as runner loads: no AMX buffers (they crash, see engine.py)
        self.model = lib.llama_model_load_from_file(os.fsencode(path), mp)
        cp = lib.llama_context_default_params()
        cp.n_ctx, cp.n_threads, cp.n_threads_batch = CTX, threads, threads
        self.ctx = lib.llama_init_from_model(self.model, cp)
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.sampler = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        lib.llama_sampler_chain_add(self.sampler, lib.llama_sampler_init_greedy())

    def tokenize(self, text: str) -> list[int]:
        lib, data = self.lib, text.encode()
        buf = (lib.llama_token * (len(data) + 8))()
        n = lib.llama_tokenize(self.vocab, data, len(data), buf, len(buf), True, True)
        return list(buf[:n])

    def run(self, tokens: list[int], n_gen: int) -> tuple[float, float, float]:
        lib = self.lib
        lib.llama_memory_clear(lib.llama_get_memory(self.ctx), True)
        t0 = time.perf_counter()
        arr = (lib.llama_token * len(tokens))(*tokens)
        assert lib.llama_decode(self.ctx, lib.llama_batch_get_one(arr, len(tokens))) == 0
        one = (lib.llama_token * 1)()
        batch = lib.llama_batch_get_one(one, 1)
        piece = (ctypes.c_char * 256)()
        one[0] = lib.llama_sampler_sample(self.sampler, self.ctx, -1)
        text = [piece.raw[: lib.llama_token_to_piece(self.vocab, one[0], piece, 256, 0, False)]]
        t1 = time.perf_counter()
        for _ in range(n_gen - 1):
            assert lib.llama_decode(self.ctx, batch) == 0
            one[0] = lib.llama_sampler_sample(self.sampler, self.ctx, -1)
            text.append(piece.raw[: lib.llama_token_to_piece(self.vocab, one[0], piece, 256, 0, False)])
        t2 = time.perf_counter()
        return len(tokens) / (t1 - t0), (n_gen - 1) / (t2 - t1), t1 - t0


class HighLevel:
    """(b): llama-cpp-python's Llama.create_completion, streaming, greedy."""

    def __init__(self, path: Path, threads: int) -> None:
        import llama_cpp
        import llama_cpp.llama_cpp as bindings  # the module Llama() takes its defaults from

        from runner.engine.llamacpp import cpu_repacks

        defaults = bindings.llama_model_default_params

        def params():  # Llama() takes no use_extra_bufts: load it as runner and Raw do
            mp = defaults()
            mp.use_extra_bufts = cpu_repacks()
            return mp

        bindings.llama_model_default_params = params
        try:
            self.llm = llama_cpp.Llama(
                str(path), n_ctx=CTX, n_threads=threads, n_threads_batch=threads, verbose=False
            )
        finally:
            bindings.llama_model_default_params = defaults

    def run(self, prompt: str, n_gen: int) -> tuple[float, float, float]:
        self.llm.reset()
        n_prompt = len(self.llm.tokenize(prompt.encode()))
        t0 = time.perf_counter()
        stream = self.llm.create_completion(prompt, max_tokens=n_gen, temperature=0.0, stream=True)
        count, t1 = 0, 0.0
        for _ in stream:
            count += 1
            if count == 1:
                t1 = time.perf_counter()
        t2 = time.perf_counter()
        return n_prompt / (t1 - t0), (count - 1) / (t2 - t1), t1 - t0


class Runner:
    """(c): runner's engine, greedy, no stop strings."""

    def __init__(self, path: Path, threads: int, n_ctx: int = CTX) -> None:
        from runner.engine.engine import Engine
        from runner.engine.text.sampling import SamplingConfig

        self.engine = Engine(path, n_ctx=n_ctx, n_threads=threads)
        self.sampling = SamplingConfig(temperature=0)

    def run(self, tokens: list[int], n_gen: int) -> tuple[float, float, float]:
        self.engine.context.reset()
        result = self.engine.generate(tokens, self.sampling, max_tokens=n_gen)
        t = result.timings
        assert t.completion_tokens == n_gen, f"stopped early after {t.completion_tokens}"
        return t.prefill_tokens_per_s, t.decode_tokens_per_s, t.ttft_s


def wall(cmd: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def tiny_model(folder: Path) -> Path:
    """2 layers of width 64 on SmolLM2's tokenizer, random f16 weights (tests/synth.py), made once."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import synth

    spec = synth.Spec(
        "llama", n_layer=2, n_embd=64, n_head=2, n_head_kv=2, n_ff=256, tokenizer=default_model()
    )
    path = folder / "tiny-2x64-f16.gguf"
    return path if path.is_file() else synth.write_model(path, spec)


def run_process(path: Path, n_gen: int, *, as_json: bool = True) -> tuple[float, float]:
    """`runner run` greedy, one thread, no drafting, --ctx 2048: its own decode tokens/s (--json's
    timings; 0 without --json, where the answer streams to a pipe as a script reads it) and the
    process's CPU seconds (user and system, from the kernel's count: unmoved by other processes)."""
    import resource

    command = [sys.executable, "-m", "runner", "run", str(path), "Hello, my name is", "--temperature", "0"]
    command += ["--threads", "1", "--spec", "none", "--max-tokens", str(n_gen), "--ctx", str(CTX)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([*command, *(["--json"] if as_json else [])], capture_output=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if not as_json:
        return 0.0, cpu
    report = json.loads(out.stdout)
    assert report["usage"]["completion_tokens"] == n_gen, report["finish_reason"]
    return float(report["timings"]["decode_tokens_per_s"]), cpu


def tiny(rounds: int, n_gen: int) -> None:
    """--tiny: see the module's doc."""
    import tempfile

    folder = Path(tempfile.gettempdir()) / "runner-bench-tiny"
    folder.mkdir(exist_ok=True)
    path = tiny_model(folder)
    raw, engine = Raw(path, 1), Runner(path, 1)
    tokens = raw.tokenize("Hello, my name is")
    raw.run(tokens, 16), engine.run(tokens, 16)
    decode: dict[str, list[float]] = {"raw loop": [], "runner Engine": [], "runner run": []}
    cpu: dict[str, list[float]] = {"raw loop": [], "runner Engine": []}
    for _ in range(rounds):
        for name, impl in (("raw loop", raw), ("runner Engine", engine)):
            began = time.thread_time()  # llama.cpp decodes on this thread at one thread
            decode[name].append(impl.run(tokens, n_gen)[1])
            cpu[name].append((time.thread_time() - began) / n_gen)
        decode["runner run"].append(run_process(path, n_gen)[0])
    base, base_cpu = statistics.median(decode["raw loop"]), statistics.median(cpu["raw loop"])
    print(f"tiny model {path.name} · 1 thread · greedy · no drafting · {n_gen} tokens · {rounds} rounds")
    print(f"machine: {machine_line()}")
    print()
    print("| | decode tok/s | vs raw | CPU µs a token | above the raw loop | vs raw (CPU) |")
    print("|---|---|---|---|---|---|")
    for name, runs in decode.items():
        median = statistics.median(runs)
        if name not in cpu:  # a process's CPU time is counted in ticks: too coarse for microseconds
            above = 1e6 / median - 1e6 / base
            print(f"| {name} | {median:.0f} | {median / base:.3f} | | {above:+.1f} µs (wall) | |")
            continue
        us = statistics.median(cpu[name]) * 1e6
        print(
            f"| {name} | {median:.0f} | {median / base:.3f} | {us:.0f} | {us - base_cpu * 1e6:+.1f} µs | "
            f"{base_cpu * 1e6 / us:.3f} |"
        )


def machine_line() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from benchlib import machine

    return str(machine())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=None, help="default 128; 1000 with --tiny")
    parser.add_argument("--tiny", action="store_true", help="the per-token cost on a tiny model")
    args = parser.parse_args()
    if args.tiny:
        tiny(args.rounds, args.tokens or 1000)
        return
    args.tokens = args.tokens or 128
    path = args.model or default_model()

    raw = Raw(path, args.threads)
    prompt = counting_prompt(raw.tokenize, PROMPT_TOKENS)
    tokens = raw.tokenize(prompt)
    contenders = {
        "raw": (raw, tokens),
        "hl-api": (HighLevel(path, args.threads), prompt),
        "runner": (Runner(path, args.threads), tokens),
    }
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in contenders}
    for impl, inp in contenders.values():  # warm-up
        impl.run(inp, 16)
    names = list(contenders)
    for i in range(args.rounds):
        for name in names[i % 3 :] + names[: i % 3]:  # rotate the order: drift hits all alike
            impl, inp = contenders[name]
            results[name].append(impl.run(inp, args.tokens))

    runner_cmd = [sys.executable, "-m", "runner"]
    help_s = wall([*runner_cmd, "--help"], 7)
    run_help_s = wall([*runner_cmd, "run", "--help"], 7)
    t0 = time.perf_counter()
    done = subprocess.run(
        [
            *runner_cmd,
            "run",
            str(path),
            "Why is the sky blue? Answer in one sentence.",
            "--seed",
            "1",
            "--json",
            "--threads",
            str(args.threads),
        ],
        capture_output=True,
        check=True,
        text=True,
    )
    e2e_s = time.perf_counter() - t0
    report = json.loads(done.stdout)

    print(
        f"model {path.name} · threads {args.threads} · prompt {len(tokens)} tokens · "
        f"{args.tokens} generated · {args.rounds} rounds (medians)"
    )
    print(
        f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"llama-cpp-python {__import__('llama_cpp').__version__}"
    )
    print()
    print("| | decode tok/s | vs raw | prefill tok/s | vs raw | TTFT s |")
    print("|---|---|---|---|---|---|")
    base_decode = statistics.median(r[1] for r in results["raw"])
    base_prefill = statistics.median(r[0] for r in results["raw"])
    for name, runs in results.items():
        prefill = statistics.median(r[0] for r in runs)
        decode = statistics.median(r[1] for r in runs)
        ttft = statistics.median(r[2] for r in runs)
        print(
            f"| {name} | {decode:.1f} | {decode / base_decode:.3f} | {prefill:.1f} | "
            f"{prefill / base_prefill:.3f} | {ttft:.3f} |"
        )
    t = report["timings"]
    print()
    print(
        f"runner run (process, one-sentence answer, {report['usage']['completion_tokens']} tokens): "
        f"{e2e_s:.2f} s wall · load {t['load_s']:.2f} s · ttft {t['ttft_s']:.3f} s · "
        f"decode {t['decode_tokens_per_s']:.1f} tok/s"
    )
    print(f"runner --help: {help_s:.3f} s wall · runner run --help: {run_help_s:.3f} s wall (median of 7)")


if __name__ == "__main__":
    main()
