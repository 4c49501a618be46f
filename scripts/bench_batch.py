"""Batch benchmark: 16 prompts decoded together against the same 16 one after another, one process.

(a) the 16 prompts answered one after another by the engine's one-sequence loop (what `runner run`
does per prompt, without the model load); (b) the same 16 through runner.engine.batch at --parallel
16 (and 4); (c) the engine's limit: raw llama_decode of one token per sequence for 16 sequences
against one token for one sequence, the same context sizes. Rounds interleave; medians. Greedy,
64 tokens each. Then the per-prompt latency batching costs, and 16 prompts sharing a 500-token system
prompt: prompt tokens evaluated with and without the shared head copied (llama_memory_seq_cp).

With --batched-bench PATH (llama.cpp's own llama-batched-bench, built from the sdist's
vendor/llama.cpp: `cmake -B build && cmake --build build --target llama-batched-bench`), the peer's
figure for the same model: its S_TG at 16 sequences against 1.

    .venv/bin/python scripts/bench_batch.py [--rounds 3] [--tokens 64] [--batched-bench PATH]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ANIMALS = ["cat", "dog", "bird", "fish", "horse", "lion", "tiger", "bear"]
ANIMALS += ["wolf", "fox", "owl", "frog", "snake", "mouse", "whale", "shark"]
PER_SEQ_CTX = 512


def raw_tokens_per_s(path: Path, n_seq: int, steps: int = 48) -> float:
    """llama_decode of one token for each of n_seq sequences, after a 35-token prompt each."""
    import llama_cpp as lib

    from runner.engine.engine import Engine

    with Engine(path, n_ctx=PER_SEQ_CTX * n_seq, n_threads=2, n_seq=n_seq) as engine:
        batch = lib.llama_batch_init(512, 0, 1)
        try:
            for seq in range(n_seq):
                batch.n_tokens = 35
                for i in range(35):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i] = 100 + i + seq, i, 1
                    batch.seq_id[i][0], batch.logits[i] = seq, 0
                batch.logits[34] = 1
                lib.llama_decode(engine.context.ctx, batch)
            start = time.perf_counter()
            for k in range(steps):
                batch.n_tokens = n_seq
                for seq in range(n_seq):
                    batch.token[seq], batch.pos[seq], batch.n_seq_id[seq] = 200 + k, 35 + k, 1
                    batch.seq_id[seq][0], batch.logits[seq] = seq, 1
                lib.llama_decode(engine.context.ctx, batch)
            return n_seq * steps / (time.perf_counter() - start)
        finally:
            lib.llama_batch_free(batch)


def batched_bench(tool: str, path: Path, tokens: int) -> dict[int, float]:
    """llama-batched-bench's S_TG (generation tok/s over all sequences) at 1 and 16 sequences."""
    out = subprocess.run(
        [tool, "-m", str(path), "-c", "16384", "-npp", "32", "-ntg", str(tokens), "-npl", "1,16", "-t", "2"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rates = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10 and re.fullmatch(r"\d+", cells[2]):
            rates[int(cells[2])] = float(cells[7])
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batched-bench", metavar="PATH", help="llama.cpp's llama-batched-bench")
    args = parser.parse_args()

    from runner.engine.batch import run_batch, shared_prefix
    from runner.engine.engine import Engine
    from runner.engine.prompt import render_prompt
    from runner.engine.request import bare
    from runner.engine.text.sampling import SamplingConfig
    from runner.engine.text.template import Message
    from runner.gguf import read_header
    from runner.hub.catalog import load_catalog
    from runner.hub.fetch import locate
    from runner.hub.refs import from_entry

    entry = load_catalog().get("smollm2")
    assert entry is not None
    path = locate(from_entry(entry))
    header = read_header(path)
    greedy = SamplingConfig(temperature=0)
    questions = [f"Write a short story about a {a}." for a in ANIMALS]

    results: dict[str, list[float]] = {"one after another": [], "--parallel 4": [], "--parallel 16": []}
    latency: dict[str, list[float]] = {k: [] for k in results}
    raw: dict[int, list[float]] = {1: [], 16: []}
    tokens_out = 0
    for _ in range(args.rounds):
        with Engine(path, n_ctx=PER_SEQ_CTX, n_threads=2) as one:
            prompts = [render_prompt(one, header, [Message("user", q)]).tokens for q in questions]
            start, total, waits = time.perf_counter(), 0, []
            for tokens in prompts:
                result = one.generate(tokens, greedy, max_tokens=args.tokens)
                total += result.timings.completion_tokens
                waits.append(time.perf_counter() - start)  # each prompt waits for those before it
            results["one after another"].append(total / (time.perf_counter() - start))
            latency["one after another"].append(statistics.mean(waits))
            tokens_out = total
        for n in (4, 16):
            with Engine(path, n_ctx=PER_SEQ_CTX * n, n_threads=2, n_seq=n) as many:
                ends: list[float] = []
                start = time.perf_counter()
                stats = run_batch(
                    many,
                    [bare(t, greedy, max_tokens=args.tokens) for t in prompts],
                    lambda _d, ends=ends: ends.append(time.perf_counter()),
                )
                results[f"--parallel {n}"].append(stats.completion_tokens / stats.wall_s)
                latency[f"--parallel {n}"].append(statistics.mean(e - start for e in ends))
        for n in raw:
            raw[n].append(raw_tokens_per_s(path, n))

    base = statistics.median(results["one after another"])
    print(
        f"16 prompts, {args.tokens} tokens each (greedy, {tokens_out} in all), {args.rounds} rounds, medians"
    )
    print()
    print("| | aggregate tok/s | vs one after another | mean wait for an answer s |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        rate = statistics.median(runs)
        print(f"| {name} | {rate:.1f} | {rate / base:.2f} | {statistics.median(latency[name]):.2f} |")
    limit = statistics.median(raw[16]) / statistics.median(raw[1])
    print(
        f"\nengine limit, raw llama_decode: 16 sequences {statistics.median(raw[16]):.1f} tok/s, one "
        f"{statistics.median(raw[1]):.1f} tok/s: {limit:.2f}x; runner's --parallel 16 reaches "
        f"{statistics.median(results['--parallel 16']) / base / limit:.2f} of that gain"
    )
    if args.batched_bench:
        peer = batched_bench(args.batched_bench, path, args.tokens)
        print(
            f"peer, llama-batched-bench (-npp 32 -ntg {args.tokens} -t 2): S_TG 16 sequences "
            f"{peer[16]:.1f} tok/s, one {peer[1]:.1f} tok/s: {peer[16] / peer[1]:.2f}x"
        )

    system = "You are a careful assistant. Answer briefly and stay on topic. " * 40
    with Engine(path, n_ctx=1024 * 16, n_threads=2, n_seq=16) as many:
        prompts = [
            render_prompt(many, header, [Message("system", system), Message("user", q)]).tokens
            for q in questions
        ]
        head = shared_prefix(prompts)
        jobs = [bare(t, greedy, max_tokens=8) for t in prompts]
        shared = run_batch(many, jobs, lambda _d: None)
        alone = run_batch(many, jobs, lambda _d: None, share_prefix=False)
    print(
        f"\n16 prompts sharing a {head}-token head (system prompt and template): prompt tokens evaluated "
        f"{shared.prefill_tokens:,} with the head copied, {alone.prefill_tokens:,} without "
        f"({alone.prefill_tokens / shared.prefill_tokens:.1f}x); wall {shared.wall_s:.2f} s against "
        f"{alone.wall_s:.2f} s (8 tokens each)"
    )


if __name__ == "__main__":
    main()
