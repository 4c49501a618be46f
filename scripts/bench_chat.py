"""Chat benchmark: a 20-turn conversation through chat's own code path, against a stateless client.

Per turn, with the KV cache kept (what runner chat does): prompt tokens, tokens evaluated, TTFT.
Then the same 20 prompts (the same answers in the history) re-sent whole each turn with the cache
cleared first (what a stateless client does: llm, or an HTTP client without a cache), and the ratio
of the two turn-20 TTFTs. Last, start-up: `runner chat` from the command to the first prompt shown
(a pseudo-terminal), beside `runner run`'s model load and whole one-shot wall time.

    .venv/bin/python scripts/bench_chat.py [--turns 20] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUESTIONS = [
    "Hi! Who are you?",
    "What is the capital of France?",
    "Name a fruit that is yellow.",
    "How many legs does a spider have?",
    "What colour is the sky on a clear day?",
    "Give me a word that rhymes with cat.",
    "What is 7 times 6?",
    "Which planet is closest to the sun?",
    "What do bees make?",
    "Name a musical instrument with strings.",
    "What is the opposite of cold?",
    "How many days are in a week?",
    "What animal says moo?",
    "Name a season of the year.",
    "What is frozen water called?",
    "Which ocean is the largest?",
    "What do you use to write on paper?",
    "How many hours are in a day?",
    "Name a shape with three sides.",
    "What is the first letter of the alphabet?",
]


def chat_turns(
    path: Path, turns: int, max_tokens: int, flash_attn: bool | None, repeats: int
) -> tuple[list[dict], list, dict[int, float]]:
    """The conversation `repeats` times (greedy: the same each time), per turn the median TTFT."""
    from runner.engine.conversation import fit
    from runner.engine.engine import Engine
    from runner.engine.llamacpp import Placement
    from runner.engine.text.sampling import SamplingConfig
    from runner.engine.text.template import Message
    from runner.gguf import read_header

    header = read_header(path)
    greedy = SamplingConfig(temperature=0)
    rows: list[dict] = []
    with Engine(path, n_ctx=4096, n_threads=2, placement=Placement(flash_attn=flash_attn)) as engine:
        for _ in range(repeats):
            engine.context.reset()
            history = []
            for i in range(turns):
                history.append(Message("user", QUESTIONS[i % len(QUESTIONS)]))
                fitted = fit(engine, header, None, history, max_tokens=max_tokens)
                result = engine.generate(fitted.prompt.tokens, greedy, max_tokens=max_tokens)
                history.append(Message("assistant", result.text))
                message = len(engine.model.tokenize(history[-2].content, add_special=False))
                t = result.timings
                if len(rows) <= i:
                    rows.append(
                        {
                            "turn": i + 1,
                            "prompt_tokens": t.prompt_tokens,
                            "evaluated": t.prefill_tokens,
                            "message_tokens": message,
                            "ttfts": [],
                        }
                    )
                rows[i]["ttfts"].append(t.ttft_s)
        for row in rows:
            row["ttft_s"] = statistics.median(row.pop("ttfts"))
        stateless = []
        prompts = []
        for i in range(turns):
            sent = history[: 2 * i + 1]
            prompts.append(fit(engine, header, None, sent, max_tokens=max_tokens).prompt.tokens)
        for tokens in prompts:
            engine.context.reset()
            stateless.append(engine.generate(tokens, greedy, max_tokens=1).timings.ttft_s)
        # the engine's limit: llama_decode of the same new tokens at the same position, nothing else
        limit = {}
        for turn in (2, turns):
            tokens, new = prompts[turn - 1], rows[turn - 1]["evaluated"]
            times = []
            for _ in range(5):
                engine.context.reset()
                engine.context.prefill(tokens[:-new])
                start = time.perf_counter()
                engine.context.prefill(tokens)
                times.append(time.perf_counter() - start)
            limit[turn] = statistics.median(times)
    return rows, stateless, limit


def startup(rounds: int) -> dict[str, float]:
    import pexpect

    env = {**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1", "RUNNER_NO_SAVE": "1"}
    chat, run_wall, run_load = [], [], []
    for _ in range(rounds):
        start = time.perf_counter()
        child = pexpect.spawn(sys.executable, ["-m", "runner", "chat", "smollm2"], env=env, timeout=60)
        child.expect_exact(b">>>")
        chat.append(time.perf_counter() - start)
        child.sendline(b"/bye")
        child.expect(pexpect.EOF)
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "runner", "run", "smollm2", "Hi", "--max-tokens", "1", "--json"],
            capture_output=True,
            check=True,
        )
        run_wall.append(time.perf_counter() - start)
        run_load.append(json.loads(done.stdout)["timings"]["load_s"])
    return {
        "chat_to_prompt_s": statistics.median(chat),
        "run_wall_s": statistics.median(run_wall),
        "run_load_s": statistics.median(run_load),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="start-up measurements (medians)")
    parser.add_argument("--repeats", type=int, default=3, help="conversations; per turn the median TTFT")
    args = parser.parse_args()

    from runner.gguf import read_header
    from runner.hub.catalog import load_catalog
    from runner.hub.fetch import locate
    from runner.hub.refs import from_entry
    from runner.limits import flash_attn_name
    from runner.loader import plan_for
    from runner.settings import LoadSettings

    entry = load_catalog().get("smollm2")
    assert entry is not None
    path = locate(from_entry(entry))
    # flash attention as `runner chat` chooses it here (off on the CPU), then llama.cpp's "auto"
    chat_settings = LoadSettings(ctx=4096, growing=True)
    chat_fa = plan_for(read_header(path), "smollm2", chat_settings, path=path).flash_attn
    if chat_fa is not None:
        auto, _, auto_limit = chat_turns(path, args.turns, args.max_tokens, None, args.repeats)
    rows, stateless, limit = chat_turns(path, args.turns, args.max_tokens, chat_fa, args.repeats)
    print(f"flash attention {flash_attn_name(chat_fa)}, as runner chat loads here")
    print("| turn | prompt tokens | evaluated (message) | TTFT s | stateless TTFT s |")
    print("|---|---|---|---|---|")
    for row, cold in zip(rows, stateless, strict=True):
        print(
            f"| {row['turn']} | {row['prompt_tokens']} | {row['evaluated']} ({row['message_tokens']}) | "
            f"{row['ttft_s']:.3f} | {cold:.3f} |"
        )
    last, second = rows[-1], rows[1]
    wrapper = last["evaluated"] - last["message_tokens"]
    print(
        f"\nturn {last['turn']}: {last['evaluated']} tokens evaluated of {last['prompt_tokens']} "
        f"= the message ({last['message_tokens']}) + the template's wrapper ({wrapper})"
    )
    print(f"TTFT turn {last['turn']} / turn 2: {last['ttft_s'] / second['ttft_s']:.2f} (target <= 1.2)")
    n = last["turn"]
    print(
        f"engine limit, llama_decode of those new tokens alone: turn 2 {limit[2] * 1000:.0f} ms, turn {n} "
        f"{limit[n] * 1000:.0f} ms: {limit[n] / limit[2]:.2f}x (attention over a longer context)"
    )
    print(f"stateless / chat TTFT at turn {last['turn']}: {stateless[-1] / last['ttft_s']:.1f}x")
    if chat_fa is not None:
        print(
            f"with llama.cpp's auto (flash attention on): TTFT turn 2 {auto[1]['ttft_s'] * 1000:.0f} ms, "
            f"turn {n} {auto[-1]['ttft_s'] * 1000:.0f} ms: {auto[-1]['ttft_s'] / auto[1]['ttft_s']:.2f}x; "
            f"engine limit {auto_limit[n] / auto_limit[2]:.2f}x; runner chat's turn {n} TTFT "
            f"{last['ttft_s'] / auto[-1]['ttft_s']:.2f}x of auto's"
        )
    s = startup(args.rounds)
    print(
        f"start-up (median of {args.rounds}): runner chat to its prompt {s['chat_to_prompt_s']:.2f} s; "
        f"runner run one-shot {s['run_wall_s']:.2f} s wall, of which model load {s['run_load_s']:.2f} s"
    )


if __name__ == "__main__":
    main()
