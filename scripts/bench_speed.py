"""Speed benchmark: speculative decoding on copy-heavy and free-text tasks; the prompt cache.

Speculation: each task answered greedily with `--spec none` and with the default n-gram speculation,
interleaved, `--repeats` times, in one process with one engine (the commands' own code path,
Engine.generate). Per task: decode tok/s of each (medians), their ratio, the acceptance rate, the mean
drafts kept per verify batch, and whether the answers are the same.

    .venv/bin/python scripts/bench_speed.py [--repeats 3] [--max-tokens 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
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
    from runner.engine.sampling import SamplingConfig
    from runner.engine.template import Message
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
                    engine.reset()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from runner.hub.catalog import load_catalog
    from runner.hub.fetch import locate
    from runner.hub.refs import from_entry

    entry = load_catalog().get("smollm2")
    assert entry is not None
    path = locate(from_entry(entry))
    rows = speculation(path, args.repeats, args.max_tokens)
    if args.json:
        print(json.dumps({"speculation": rows}, indent=2))
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
