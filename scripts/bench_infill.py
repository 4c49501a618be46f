"""Fill-in-the-middle as an editor drives it: /infill on `runner serve` beside llama-server --cache-reuse.

    python scripts/bench_infill.py [--model PATH] [--threads 2] [--keystrokes 20] [--rounds 1]

A 2,000-token prefix and a 500-token suffix (Python code) are sent once, then `--keystrokes` requests
each adding a few characters to the prefix, as llama.vim sends them while one types. Each request
streams (n_predict 4, greedy); its TTFT is the time to the first piece of the answer. Both servers run
at once, each request sent to one then to the other (the order swapped each time), so what else the
machine does falls on both alike. Both servers keep
the prefix's last 1,536 tokens and the suffix's first ~510 (llama-server's layout, which runner follows
token for token), so each keystroke moves the prefix's start: llama-server with `--cache-reuse 256`
shifts its cached run into place, as runner does by default for /infill. Both have the same threads
and context.

The model: a FIM code model (--model), or by default SmolLM2 (the test model) given FIM tokens in a
copy of its GGUF, as tests/test_infill.py does. llama-server is the pinned build (--llama-server PATH).
Progress on stderr; the table on stdout: the first request's TTFT, the keystrokes' p50 TTFT and the
tokens each evaluated, and the ratio runner / llama-server (target <= 1.0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import free_port, machine, model_file, peer_flags, progress, start, stop, target, wait_ready  # noqa: E402

LLAMA_SERVER = Path("/tmp/peers/build/bin/llama-server")
FIM_IDS = {"fim_pre": 8, "fim_suf": 9, "fim_mid": 10, "fim_pad": 16, "fim_rep": 3, "fim_sep": 5}
CTX = 4096
TYPED = "result = compute_total(values, scale=2)\n    return result\n"


def fim_copy(source: Path, folder: Path) -> Path:
    """SmolLM2 with FIM tokens named (three of its unused control tokens), as the tests write it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import synth

    return synth.with_fim(source, folder / "smollm2-fim.gguf", FIM_IDS)


def texts(model: Path, prefix_tokens: int, suffix_tokens: int) -> tuple[str, str]:
    """Python code of about `prefix_tokens` before the cursor and `suffix_tokens` after it."""
    from runner.engine.vocab import open_vocab

    vocab = open_vocab(model)
    try:

        def grow(make: Any, want: int) -> str:
            text, i = "", 0
            while len(vocab.tokenize(text, add_special=False)) < want:
                text += make(i)
                i += 1
            return text

        prefix = grow(lambda i: f"def step_{i}(x):\n    return x * {i} + {i * 7 % 13}\n\n", prefix_tokens)
        suffix = grow(lambda i: f"\n# check {i}\nassert step_{i}(1) == {1 + i + i * 7 % 13}\n", suffix_tokens)
    finally:
        vocab.close()
    return prefix + "def total(values, scale):\n    ", suffix


async def one(client: httpx.AsyncClient, prefix: str, suffix: str) -> dict[str, Any]:
    """One streamed /infill: TTFT to the first piece, and the final chunk's counts."""
    body = {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 4, "temperature": 0, "stream": True}
    began = time.perf_counter()
    ttft, last = None, {}
    async with client.stream("POST", "/infill", json=body, timeout=600) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("content"):
                ttft = time.perf_counter() - began
            last = chunk
    timings = last.get("timings", {})
    return {
        "ttft": ttft if ttft is not None else time.perf_counter() - began,
        "evaluated": timings.get("prompt_n"),
    }


async def measure(
    commands: dict[str, list[str]], folder: Path, prefix: str, suffix: str, keystrokes: int
) -> dict[str, Any]:
    """Both servers up at once, each request sent to one then the other (the order swapped each
    keystroke): whatever else the machine does falls on both alike."""
    kinds = list(commands)
    ports = {kind: free_port() for kind in kinds}
    processes = {
        kind: start([*commands[kind], "--port", str(ports[kind])], folder / f"{kind}.log") for kind in kinds
    }
    fresh = httpx.Limits(
        max_keepalive_connections=0
    )  # a connection idle while the other answers may be closed
    clients = {
        kind: httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports[kind]}", limits=fresh) for kind in kinds
    }
    rows: dict[str, dict[str, Any]] = {kind: {"typed": []} for kind in kinds}
    try:
        for kind in kinds:
            await wait_ready(clients[kind], processes[kind], 300)
            await one(clients[kind], "x = 1\n", "\n")  # warm: the first decode's allocations
        for kind in kinds:
            rows[kind]["first"] = await one(clients[kind], prefix, suffix)
        for k in range(1, keystrokes + 1):
            for kind in kinds if k % 2 else reversed(kinds):
                rows[kind]["typed"].append(await one(clients[kind], prefix + TYPED[: 3 * k], suffix))
    finally:
        for kind in kinds:
            await clients[kind].aclose()
            stop(processes[kind])
    return {
        kind: {
            "first_ttft": row["first"]["ttft"],
            "first_evaluated": row["first"]["evaluated"],
            "p50_ttft": statistics.median(t["ttft"] for t in row["typed"]),
            "p50_evaluated": statistics.median(t["evaluated"] or 0 for t in row["typed"]),
        }
        for kind, row in rows.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="a FIM code model (default: SmolLM2 given FIM tokens)")
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keystrokes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-infill-"))
    progress(f"logs in {folder}")
    model = args.model or fim_copy(model_file("smollm2"), folder)
    prefix, suffix = texts(model, 2000, 500)
    threads = ["--threads", str(args.threads)]
    served = [str(model), "--ctx", str(CTX), "--parallel", "1"]
    commands = {
        "runner": [sys.executable, "-m", "runner", "serve", *served, *threads],
        "llama-server": [
            str(args.llama_server), "-m", str(model), "-c", str(CTX), "-np", "1", "--cache-reuse", "256",
            *threads, *peer_flags(),
        ],
    }  # fmt: skip
    results: dict[str, list[dict[str, Any]]] = {kind: [] for kind in commands}
    for i in range(args.rounds):
        progress(f"round {i + 1}/{args.rounds}")
        measured = asyncio.run(measure(commands, folder, prefix, suffix, args.keystrokes))
        for kind, row in measured.items():
            results[kind].append(row)
    print(f"machine: {machine()}; model: {model.name}; threads {args.threads}; {args.keystrokes} keystrokes")
    print("| server | first TTFT | keystroke p50 TTFT | tokens evaluated (first / keystroke p50) |")
    print("|---|---|---|---|")
    p50 = {}
    for kind, rows in results.items():
        first = statistics.median(r["first_ttft"] for r in rows)
        p50[kind] = statistics.median(r["p50_ttft"] for r in rows)
        evaluated = f"{rows[0]['first_evaluated']} / {statistics.median(r['p50_evaluated'] for r in rows):g}"
        print(f"| {kind} | {first * 1000:.0f} ms | {p50[kind] * 1000:.0f} ms | {evaluated} |")
    ratio = p50["runner"] / p50["llama-server"] if p50["llama-server"] else None
    print(target("keystroke p50 TTFT, runner / llama-server", ratio, 1.0, at_least=False))


if __name__ == "__main__":
    main()
