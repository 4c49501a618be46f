"""Speed benchmark: speculative decoding on copy-heavy and free-text tasks; the prompt cache.

Speculation: each task answered greedily with `--spec none` and with the default n-gram speculation,
interleaved, `--repeats` times, in one process with one engine (the commands' own code path,
Engine.generate). Per task: decode tok/s of each (medians), their ratio, the acceptance rate, the mean
drafts kept per verify batch, and whether the answers are the same.

Prompt cache: `runner run` as a process, a ~2,000-token document on stdin and a question, in a fresh
RUNNER_HOME: the cold call (which stores the head) and then cached calls, TTFT of each (from --json),
the cost of writing the head on the cold call, disk bytes per cached token; and, in process, what
loading a stored head costs against prefilling it, by head length (the threshold MIN_HEAD).

Verify cost: what bounds speculation on a machine. Raw llama_decode (no runner code) of batches of
1 + k tokens with logits at every position, as a verify batch has them, after a 100-token prompt;
medians of 15, in ms and in plain steps. A copy kept whole at k drafts gains at most (1 + k) / steps.

    .venv/bin/python scripts/bench_speed.py [--repeats 3] [--max-tokens 300] [--json]
                                            [--only spec|cache|verify]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LIGHTHOUSE = (
    "The old lighthouse stood on the northern cliff for two hundred years. Every night its keeper "
    "climbed the spiral stairs, trimmed the wick and polished the great lens until it shone. Ships "
    "passing in the dark trusted its beam to guide them past the rocks. When the keeper grew old, his "
    "daughter took over the work, and she kept the light burning through the worst storms the coast "
    "had ever seen. Fishermen still tell the story of the night the great storm broke the harbour wall "
    "and the light never once went out."
)
CURIE = (
    "Marie Curie was born in Warsaw in 1867. She moved to Paris to study physics and mathematics. "
    "The weather in Paris was often cold and grey. Curie discovered two new elements, polonium and "
    "radium. Many students in the city worked in small rooms without heating. In 1903 Curie shared the "
    "Nobel Prize in Physics. Bread and coffee were cheap in the Latin Quarter. Curie later won a second "
    "Nobel Prize, in Chemistry, in 1911."
)
CODE = """def greet(name):
    message = "Hello, " + name + "!"
    print(message)
    return message


def farewell(name):
    message = "Goodbye, " + name + "!"
    print(message)
    return message
"""
TASKS = {
    # copy-heavy: the answer is mostly text of the prompt
    "rewrite": ("copy", f"Rewrite the following paragraph, changing 'daughter' to 'son'.\n\n{LIGHTHOUSE}"),
    "extract": (
        "copy",
        f"From the text below, list the sentences that mention Curie, copied exactly.\n\n{CURIE}",
    ),
    "code edit": (
        "copy",
        f"Change the greeting from Hello to Hi in this code. Return the full code.\n\n```python\n{CODE}```",
    ),
    # free text: little to copy; the adaptive switch should keep it near 1.0x
    "story": ("free", "Write a short story about a dragon who learns to bake bread."),
    "essay": ("free", "Explain why the sky is blue, in a few paragraphs."),
}


def speculation(path: Path, repeats: int, max_tokens: int) -> list[dict]:
    from runner.engine.engine import Engine
    from runner.engine.prompt import render_prompt
    from runner.engine.text.sampling import SamplingConfig
    from runner.engine.text.template import Message
    from runner.gguf import read_header

    header = read_header(path)
    greedy = SamplingConfig(temperature=0)
    rows = []
    with Engine(path, n_ctx=4096) as engine:
        for name, (kind, text) in TASKS.items():
            prompt = render_prompt(engine, header, [Message("user", text)]).tokens
            runs: dict[str, list] = {"none": [], "ngram": []}
            for _ in range(repeats):
                for mode in runs:
                    engine.speculate(mode)
                    engine.context.reset()
                    runs[mode].append(engine.generate(prompt, greedy, max_tokens=max_tokens))
            engine.speculate("none")
            plain = statistics.median(r.timings.decode_tokens_per_s for r in runs["none"])
            spec = statistics.median(r.timings.decode_tokens_per_s for r in runs["ngram"])
            stats = runs["ngram"][-1].timings.speculation
            rows.append(
                {
                    "task": name,
                    "kind": kind,
                    "tokens": runs["none"][0].timings.completion_tokens,
                    "plain_tok_s": round(plain, 1),
                    "spec_tok_s": round(spec, 1),
                    "ratio": round(spec / plain, 2),
                    "acceptance": round(stats.acceptance, 3),
                    "mean_accepted": round(stats.mean_accepted, 2),
                    "stopped": stats.stopped,
                    "same_answer": all(r.text == runs["none"][0].text for r in runs["ngram"]),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def document(words: int) -> str:
    rng = random.Random(7)
    vocab = LIGHTHOUSE.lower().replace(".", "").replace(",", "").split()
    return " ".join(rng.choice(vocab) for _ in range(words))


def prompt_cache(path: Path, repeats: int) -> dict:
    doc = document(2000)
    question = "What is this text about? Answer in one sentence."
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "RUNNER_HOME": home, "RUNNER_NO_SAVE": "1"}

        def call(*extra: str) -> dict:
            args = [sys.executable, "-m", "runner", "run", str(path), question, "--temperature", "0"]
            proc = subprocess.run(
                [*args, "--max-tokens", "16", "--json", *extra],
                input=doc.encode(),
                capture_output=True,
                env=env,
                check=True,
            )
            return json.loads(proc.stdout)

        plain = [call("--no-prompt-cache")["timings"]["ttft_s"] for _ in range(repeats)]
        cold = call()
        warm = [call() for _ in range(repeats)]
        files = list(Path(home, "cache", "prompts").glob("*.kv"))
        stored = cold["prompt_cache"]["stored_tokens"]
        size = sum(f.stat().st_size for f in files)
    warm_ttft = statistics.median(w["timings"]["ttft_s"] for w in warm)
    result = {
        "prompt_tokens": cold["usage"]["prompt_tokens"],
        "head_tokens": stored,
        "ttft_no_cache_s": round(statistics.median(plain), 3),
        "ttft_cold_s": round(cold["timings"]["ttft_s"], 3),
        "ttft_cached_s": round(warm_ttft, 3),
        "cached_over_cold": round(warm_ttft / cold["timings"]["ttft_s"], 3),
        "write_s": cold["prompt_cache"]["write_s"],
        "write_share_of_cold_ttft": round(cold["prompt_cache"]["write_s"] / cold["timings"]["ttft_s"], 3),
        "bytes_per_token": round(size / stored) if stored else None,
        "same_answer": all(w["text"] == cold["text"] for w in warm),
        "threshold": threshold(path),
    }
    print(json.dumps(result), file=sys.stderr)
    return result


def threshold(path: Path) -> list[dict]:
    """Loading a stored head against prefilling it, by head length (in process, medians of 5)."""
    from runner.engine.engine import Engine
    from runner.engine.promptcache import PromptCache

    rows = []
    with Engine(path, n_ctx=4096) as engine, tempfile.TemporaryDirectory() as folder:
        cache = PromptCache(Path(folder), 1 << 40, print)
        tokens = engine.model.tokenize(document(1500))
        for n in (32, 64, 128, 256, 512, 1024):
            head = tokens[:n]
            prefill, load = [], []
            for _ in range(5):
                engine.context.reset()
                start = time.perf_counter()
                engine.context.prefill(head)
                prefill.append(time.perf_counter() - start)
            cache.store(engine.context, head)
            for _ in range(5):
                engine.context.reset()
                start = time.perf_counter()
                assert cache.restore(engine.context, [*head, 0]).loaded_tokens == n
                load.append(time.perf_counter() - start)
            p, q = statistics.median(prefill), statistics.median(load)
            rows.append({"tokens": n, "prefill_ms": round(p * 1000, 1), "load_ms": round(q * 1000, 1)})
    return rows


def verify_cost(path: Path, sizes: tuple[int, ...] = (1, 2, 3, 5, 9, 17, 33)) -> list[dict]:
    """Raw llama_decode of [last, d0 … dk-1] with logits at every position, by batch size."""
    from bench_engine import Raw  # the raw loop's model and context, loaded as runner loads

    from runner.engine.llamacpp import default_threads

    raw = Raw(path, default_threads())
    lib, ctx = raw.lib, raw.ctx
    memory = lib.llama_get_memory(ctx)
    batch = lib.llama_batch_init(512, 0, 1)
    prefix = 100

    def fill(tokens: range, start: int, all_logits: bool) -> None:
        batch.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = all_logits or i == len(tokens) - 1

    rows = []
    try:
        for n in sizes:
            times = []
            for _ in range(15):
                lib.llama_memory_clear(memory, True)
                fill(range(100, 100 + prefix), 0, False)
                assert lib.llama_decode(ctx, batch) == 0
                fill(range(300, 300 + n), prefix, True)
                start = time.perf_counter()
                assert lib.llama_decode(ctx, batch) == 0
                times.append(time.perf_counter() - start)
            rows.append({"tokens": n, "ms": round(statistics.median(times) * 1000, 1)})
    finally:
        lib.llama_batch_free(batch)
    step = rows[0]["ms"]
    for r in rows:
        r["steps"] = round(r["ms"] / step, 2)
        r["whole_copy_gain"] = round(r["tokens"] / r["steps"], 2)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", choices=["spec", "cache", "verify"])
    args = parser.parse_args()

    from runner.hub.catalog import load_catalog
    from runner.hub.fetch import locate
    from runner.hub.refs import from_entry

    entry = load_catalog().get("smollm2")
    assert entry is not None
    path = locate(from_entry(entry))
    verify = verify_cost(path) if args.only in (None, "verify") else []
    rows = speculation(path, args.repeats, args.max_tokens) if args.only in (None, "spec") else []
    cache = prompt_cache(path, args.repeats) if args.only in (None, "cache") else None
    if args.json:
        print(json.dumps({"verify_cost": verify, "speculation": rows, "prompt_cache": cache}, indent=2))
        return
    if verify:
        print("| batch (last + drafts) | ms | plain steps | gain of a copy kept whole |\n|---|---|---|---|")
        for v in verify:
            print(f"| {v['tokens']} | {v['ms']} | {v['steps']} | {v['whole_copy_gain']}× |")
    if cache is not None:
        c = cache
        print(
            f"prompt cache: {c['prompt_tokens']:,}-token prompt, {c['head_tokens']:,}-token head · "
            f"TTFT without the cache {c['ttft_no_cache_s']} s, cold (storing) {c['ttft_cold_s']} s, cached "
            f"{c['ttft_cached_s']} s = **{c['cached_over_cold']}× the cold call** · writing took "
            f"{c['write_s']} s = {c['write_share_of_cold_ttft']:.1%} of the cold TTFT · "
            f"{c['bytes_per_token']:,} bytes per cached token · same answer: {c['same_answer']}"
        )
        print("| head tokens | prefill ms | load ms |\n|---|---|---|")
        for r in c["threshold"]:
            print(f"| {r['tokens']} | {r['prefill_ms']} | {r['load_ms']} |")
    if not rows:
        return
    head = "task | kind | tokens | plain tok/s | ngram tok/s | ratio | acceptance | kept per batch | same"
    print(f"| {head} |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        stopped = " (stopped)" if r["stopped"] else ""
        print(
            f"| {r['task']} | {r['kind']} | {r['tokens']} | {r['plain_tok_s']} | {r['spec_tok_s']} | "
            f"**{r['ratio']}×** | {r['acceptance']:.0%}{stopped} | {r['mean_accepted']} | "
            f"{'yes' if r['same_answer'] else 'no'} |"
        )


if __name__ == "__main__":
    main()
