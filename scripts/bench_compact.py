"""Compaction benchmark (issue 57): a 200-turn scripted chat at --ctx 2048, piped into `runner chat`.

The chat runs to its end twice, side by side in one run: with `--compact auto` (the older turns
summarised by the model as the context fills) and with `--compact off` (the oldest exchanges dropped,
runner's way before compaction). Each answer's TTFT comes from the store (its stats), and the
compactions from theirs. Printed per mode: the turns answered, the compactions or drops, the median
TTFT of the turns before the first one, of the later turns (those right after one apart) and of the
turns right after one (a compaction comes after an answer, with the next prompt's head evaluated; a
drop comes with the turn that needs it), and each of those against the turn just before it: issue
57's target is 1.5 at most.

    .venv/bin/python scripts/bench_compact.py [--model smollm2] [--turns 200] [--ctx 2048] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from benchlib import machine, progress, target

TOPICS = [
    "the capital of France",
    "a fruit that is yellow",
    "how many legs a spider has",
    "the colour of the sky on a clear day",
    "a word that rhymes with cat",
    "what 7 times 6 is",
    "the planet closest to the sun",
    "what bees make",
    "a musical instrument with strings",
    "the opposite of cold",
    "how many days a week has",
    "the animal that says moo",
    "a season of the year",
    "what frozen water is called",
    "the largest ocean",
    "what people write on paper with",
]


def questions(turns: int) -> list[str]:
    return [
        f"Question {n + 1}: tell me about {TOPICS[n % len(TOPICS)]}, in one sentence." for n in range(turns)
    ]


def run_chat(model: str, mode: str, args: argparse.Namespace, data: Path) -> tuple[float, int, str]:
    """The scripted chat through `runner chat` (a pipe: one turn a line); its wall time, exit code, stderr."""
    feed = "".join(q + "\n" for q in questions(args.turns)).encode()
    flags = ["--ctx", str(args.ctx), "--max-tokens", str(args.max_tokens), "--temperature", "0"]
    env = {**os.environ, "RUNNER_DATA_DIR": str(data)}
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "runner", "chat", model, *flags, "--compact", mode, "--no-prompt-cache"],
        input=feed, capture_output=True, env=env,
    )  # fmt: skip
    return time.perf_counter() - began, done.returncode, done.stderr.decode(errors="replace")


def figures(data: Path) -> dict:
    """What the store kept of the chat: answers, their TTFTs, and the turns a compaction or a drop
    came before: after an answer, compactions (runner.commands.compact.ahead) are followed by the next
    turn; a drop (or a compaction a turn needed at once) evaluates most of its prompt again."""
    db = sqlite3.connect(data / "conversations.db")
    rows = db.execute("SELECT role, content, stats, created FROM messages ORDER BY id").fetchall()
    compactions = db.execute("SELECT stats, created FROM compactions ORDER BY id").fetchall()
    answers = [
        (json.loads(stats or "{}"), content, at) for role, content, stats, at in rows if role == "assistant"
    ]
    ttft = [stats.get("ttft_s", 0.0) for stats, _, _ in answers]
    # the turn after each compaction: the first answer given after it was written
    events = {
        next((n for n, (_, _, at) in enumerate(answers) if at > made), len(answers))
        for _, made in compactions
    }
    events |= {  # and the turns whose prompt was mostly evaluated again (its start changed: a drop)
        n
        for n, (stats, _, _) in enumerate(answers)
        if n > 0 and stats.get("prefill_tokens", 0) > stats.get("prompt_tokens", 0) / 2
    }
    events.discard(len(answers))
    first = min(events) if events else len(answers)
    before = ttft[1:first]  # turn 1 evaluates the template's system message too
    after = [t for n, t in enumerate(ttft) if n > first and n not in events]
    at = [ttft[n] for n in sorted(events)]
    pairs = [ttft[n] / ttft[n - 1] for n in sorted(events) if n > 1 and ttft[n - 1] > 0]
    summaries = [json.loads(stats or "{}").get("seconds", 0.0) for stats, _ in compactions]
    return {
        "answered": sum(1 for _, content, _ in answers if content.strip()),
        "users": sum(1 for role, *_ in rows if role == "user"),
        "events": len(events),
        "compactions": len(compactions),
        "before": statistics.median(before) if before else None,
        "after": statistics.median(after) if after else None,
        "at": statistics.median(at) if at else None,
        "summary_s": statistics.median(summaries) if summaries else None,
        "pair": statistics.median(pairs) if pairs else None,
        "worst": max(pairs) if pairs else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    print(f"# {datetime.now(timezone.utc):%Y-%m-%d} · {machine()} · {args.model}, {args.turns} turns, "
          f"--ctx {args.ctx}, --max-tokens {args.max_tokens}")  # fmt: skip
    results = {}
    for mode in ("auto", "off"):
        with tempfile.TemporaryDirectory(prefix=f"bench-compact-{mode}-") as folder:
            progress(f"runner chat --compact {mode}: {args.turns} turns ...")
            wall, code, err = run_chat(args.model, mode, args, Path(folder))
            if code != 0:
                raise SystemExit(f"--compact {mode} exited {code}:\n{err[-2000:]}")
            results[mode] = {**figures(Path(folder)), "wall_s": wall}
    for mode, r in results.items():
        event = "compaction" if mode == "auto" else "drop"
        head = f"{r['answered']}/{args.turns} turns answered ({r['users']} kept)"
        counts = f"{r['events']} turns right after a {event} ({r['compactions']} summaries)"
        print(f"\n--compact {mode}: {head}, {counts}, {r['wall_s']:.0f} s in all")
        print(f"  TTFT median: turns before the first {event} {r['before'] or 0:.3f} s, later turns "
              f"{r['after'] or 0:.3f} s, turns right after a {event} {r['at'] or 0:.3f} s")  # fmt: skip
        if r["summary_s"] is not None:
            print(f"  a compaction takes {r['summary_s']:.2f} s (median), after the answer before it")
        print(
            "  "
            + target(
                f"TTFT right after a {event} / the turn before it, median", r["pair"], 1.5, at_least=False
            )
        )
        print(
            "  "
            + target(
                f"TTFT right after a {event} / the turn before it, worst", r["worst"], 1.5, at_least=False
            )
        )


if __name__ == "__main__":
    main()
