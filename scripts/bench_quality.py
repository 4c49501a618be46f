"""Answer quality and log-probabilities side by side with llama.cpp's own tools, on one machine.

    python scripts/bench_quality.py [--model smollm2] [--ctx 512] [--rounds 5] [--json]

1. Perplexity: `runner bench MODEL --quality` against `llama-perplexity -f TEXT -c CTX` on the text
   shipped with runner (target: within 0.5%); its time (target: under a minute).
2. KL-divergence: a copy of the model re-quantized to Q3_K_S (llama.cpp's quantize through the
   bindings, allow_requantize), `runner bench COPY --quality --reference MODEL` against
   `llama-perplexity --kl-divergence-base` then `--kl-divergence` on the same pair (target: the mean
   within 2%); the 99th percentile and the same-top share beside.
3. Logprobs: greedy chat answers with top_logprobs 5 from `runner serve` and from llama-server on the
   same model and prompts: the same tokens ranked the same, each log-probability within 1e-3.
4. Speed: the same request with and without top_logprobs 5 on `runner serve`, interleaved --rounds
   times: decode tok/s with over without (target: >= 0.95).

llama.cpp's programs are the pinned sdist's (--peers DIR: its build's bin/), run with --no-repack on a
CPU with AMX (benchlib.peer_flags). Progress on stderr; the table (or --json) on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from benchlib import free_port, machine, model_file, peer_flags, progress, start, stop, target, wait_ready

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "runner" / "data" / "quality.txt"
PEERS = Path("/tmp/peers/build/bin")
PROMPTS = [
    "Name three colors.",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Count to five.",
]


def runner_quality(model: str, ctx: int, reference: str | None = None) -> dict[str, Any]:
    args = [sys.executable, "-m", "runner", "bench", model, "--quality", "--ctx", str(ctx), "--json"]
    if reference is not None:
        args += ["--reference", reference]
    began = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    return {**json.loads(done.stdout), "wall_s": time.perf_counter() - began}


def llama_perplexity(peers: Path, model: Path, ctx: int, *extra: str) -> str:
    command = [
        str(peers / "llama-perplexity"),
        "-m",
        str(model),
        "-f",
        str(TEXT),
        "-c",
        str(ctx),
        *peer_flags(),
    ]
    done = subprocess.run([*command, *extra], capture_output=True, text=True, check=True)
    return done.stdout + done.stderr


def figure(log: str, pattern: str) -> float:
    found = re.search(pattern, log)
    if found is None:
        raise RuntimeError(f"llama-perplexity printed no {pattern!r}:\n{log[-2000:]}")
    return float(found.group(1))


def requantize(model: Path, out: Path) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_S
    params.allow_requantize = True
    if llama_cpp.llama_model_quantize(str(model).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError("llama_model_quantize failed")


async def greedy(
    client: httpx.AsyncClient, model: str, prompt: str, top: int | None, max_tokens: int = 48
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    if top is not None:
        body |= {"logprobs": True, "top_logprobs": top}
    response = await client.post("/v1/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    return response.json()


async def served(command: list[str], log: Path, work: Any) -> Any:
    port = free_port()
    process = start([*command, "--port", str(port)], log)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            await wait_ready(client, process, 120)
            return await work(client)
    finally:
        stop(process)


def logprobs_side_by_side(peers: Path, model: str, path: Path, logs: Path) -> dict[str, Any]:
    async def answers(client: httpx.AsyncClient) -> list[dict[str, Any]]:
        return [await greedy(client, model, p, 5) for p in PROMPTS]

    runner_cmd = [sys.executable, "-m", "runner", "serve", model, "--parallel", "1"]
    peer_cmd = [str(peers / "llama-server"), "-m", str(path), "-np", "1", "-c", "4096", *peer_flags()]
    ours = asyncio.run(served(runner_cmd, logs / "runner-logprobs.log", answers))
    theirs = asyncio.run(served(peer_cmd, logs / "llama-server-logprobs.log", answers))
    worst, tokens, same = 0.0, 0, True
    for a, b in zip(ours, theirs, strict=True):
        ca, cb = a["choices"][0]["logprobs"]["content"], b["choices"][0]["logprobs"]["content"]
        for x, y in zip(ca, cb, strict=False):  # llama-server adds the end token's entry
            tokens += 1
            same = same and [t["id"] for t in x["top_logprobs"]] == [t["id"] for t in y["top_logprobs"]]
            worst = max(worst, abs(x["logprob"] - y["logprob"]))
            pairs = zip(x["top_logprobs"], y["top_logprobs"], strict=True)
            worst = max(worst, *(abs(p["logprob"] - q["logprob"]) for p, q in pairs))
    return {"tokens_compared": tokens, "same_ranking": same, "max_abs_diff": worst}


def logprobs_speed(model: str, rounds: int, logs: Path) -> dict[str, Any]:
    """Pairs of the same greedy request without and with top_logprobs 5 (which goes first alternating):
    the median of the pairs' ratios of decode tok/s, so the machine's drift cancels within a pair."""

    async def rates(client: httpx.AsyncClient) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"plain": [], "top5": []}
        await greedy(client, model, PROMPTS[0], None)  # warm
        for i in range(rounds):
            order = (("plain", None), ("top5", 5)) if i % 2 == 0 else (("top5", 5), ("plain", None))
            for kind, top in order:
                answer = await greedy(client, model, "Tell me a long story about a dragon.", top, 256)
                t = answer["timings"]
                out[kind].append((t["completion_tokens"] - 1) / t["decode_s"])
        return out

    command = [sys.executable, "-m", "runner", "serve", model, "--parallel", "1"]
    measured = asyncio.run(served(command, logs / "runner-speed.log", rates))
    ratios = [b / a for a, b in zip(measured["plain"], measured["top5"], strict=True)]
    return {
        "plain_tok_s": statistics.median(measured["plain"]),
        "top5_tok_s": statistics.median(measured["top5"]),
        "ratio": statistics.median(ratios),
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--peers", type=Path, default=PEERS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    path = model_file(args.model)
    logs = Path(tempfile.mkdtemp(prefix="bench_quality-"))
    progress(f"logs and the re-quantized copy in {logs}")
    result: dict[str, Any] = {"machine": machine(), "model": str(path), "ctx": args.ctx}

    progress("perplexity: runner, then llama-perplexity")
    ours = runner_quality(str(path), args.ctx)
    log = llama_perplexity(args.peers, path, args.ctx)
    theirs = figure(log, r"Final estimate: PPL = ([\d.]+)")
    result["perplexity"] = {
        "runner": ours["perplexity"],
        "llama_perplexity": theirs,
        "rel_diff": abs(ours["perplexity"] - theirs) / theirs,
        "runner_s": ours["seconds"],
        "runner_wall_s": ours["wall_s"],
    }

    progress("KL-divergence: a Q3_K_S copy against the model")
    copy = logs / "requantized-Q3_K_S.gguf"
    requantize(path, copy)
    kld = runner_quality(str(copy), args.ctx, reference=str(path))
    base = logs / "base.kld"
    llama_perplexity(args.peers, path, args.ctx, "--kl-divergence-base", str(base))
    log = llama_perplexity(args.peers, copy, args.ctx, "--kl-divergence-base", str(base), "--kl-divergence")
    peer_kld = figure(log, r"Mean\s+KLD:\s+([\d.]+)")
    result["kld"] = {
        "runner": kld["kld_mean"],
        "llama_perplexity": peer_kld,
        "rel_diff": abs(kld["kld_mean"] - peer_kld) / peer_kld,
        "runner_p99": kld["kld_p99"],
        "llama_p99": figure(log, r"99\.0%\s+KLD:\s+([\d.]+)"),
        "runner_same_top": kld["same_top"],
        "llama_same_top": figure(log, r"Same top p:\s+([\d.]+)") / 100,
        "runner_ppl_q": kld["perplexity"],
        "llama_ppl_q": figure(log, r"Mean PPL\(Q\)\s+:\s+([\d.]+)"),
    }

    progress("logprobs: runner serve, then llama-server")
    result["logprobs"] = logprobs_side_by_side(args.peers, args.model, path, logs)
    progress(f"speed: with and without top_logprobs 5, {args.rounds} rounds")
    result["speed"] = logprobs_speed(args.model, args.rounds, logs)

    p, k, lp, sp = result["perplexity"], result["kld"], result["logprobs"], result["speed"]
    result["targets"] = [
        target("perplexity, |runner - llama| / llama, %", 100 * p["rel_diff"], 0.5, at_least=False),
        target("--quality on the default text, seconds", p["runner_wall_s"], 60, at_least=False),
        target("mean KLD, |runner - llama| / llama, %", 100 * k["rel_diff"], 2, at_least=False),
        target("logprobs, max |runner - llama-server| x 1000", 1000 * lp["max_abs_diff"], 1, at_least=False)
        + ("" if lp["same_ranking"] else " (rankings differ: FAIL)"),
        target("decode tok/s, top_logprobs 5 / none", sp["ratio"], 0.95, at_least=True),
    ]
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"machine: {result['machine']}\nmodel: {path.name}, ctx {args.ctx}")
    print(
        f"perplexity: runner {p['runner']:.4f}, llama-perplexity {p['llama_perplexity']:.4f} "
        f"({100 * p['rel_diff']:.3f}% apart; runner took {p['runner_wall_s']:.1f} s)"
    )
    print(
        f"KLD (a Q3_K_S copy): runner {k['runner']:.6f}, llama-perplexity {k['llama_perplexity']:.6f} "
        f"({100 * k['rel_diff']:.2f}% apart); 99%: {k['runner_p99']:.4f} / {k['llama_p99']:.4f}; "
        f"same top: {k['runner_same_top']:.4f} / {k['llama_same_top']:.4f}; "
        f"PPL(Q): {k['runner_ppl_q']:.4f} / {k['llama_ppl_q']:.4f}"
    )
    print(
        f"logprobs: {lp['tokens_compared']} tokens, same ranking: {lp['same_ranking']}, "
        f"max diff {lp['max_abs_diff']:.2e}"
    )
    print(f"decode tok/s: plain {sp['plain_tok_s']:.1f}, top_logprobs 5 {sp['top5_tok_s']:.1f}")
    for line in result["targets"]:
        print(line)


if __name__ == "__main__":
    main()
