"""`runner bench MODEL`: how fast this machine runs a model, with the engine the commands use.

pp512 and tg128 as llama-bench defines them: 512 prompt tokens evaluated from an empty cache, then
128 tokens generated one at a time (greedy, end-of-text ignored), both through runner's Engine
(prefill, generate_step). TTFT of a short chat prompt; end to end, `runner run` as a process (start-up
and load included); aggregate throughput of 16 prompts at --parallel 1, 4 and 16
(runner.engine.batch). Medians of --repetitions runs.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from typing import Any, TextIO

from runner import ui
from runner.commands.output import describe_load
from runner.engine.batch import Job, run_batch
from runner.engine.prompt import render_prompt
from runner.engine.sampling import SamplingConfig
from runner.engine.template import Message
from runner.errors import RunnerError, WontFit
from runner.limits import check_range
from runner.loader import LoadedModel, open_model

PP, TG = 512, 128
PARALLEL = (1, 4, 16)
BATCH_PROMPTS, BATCH_TOKENS, BATCH_CTX = 16, 32, 512
GREEDY = SamplingConfig(temperature=0)


def bench(
    model: str, *, out: TextIO, as_json: bool, repetitions: int = 3, threads: int | None = None
) -> None:
    check_range(repetitions, "--repetitions", 1, 100)
    loaded = open_model(model, ctx=PP + TG + 64, threads=threads)
    try:
        ui.info(f"benchmarking {describe_load(loaded)}")
        figures = _single(loaded, repetitions)
    finally:
        loaded.close()
    figures["end_to_end"] = _end_to_end(model, repetitions)
    figures["parallel"] = {str(n): _parallel(model, n, threads) for n in PARALLEL}
    figures["model"] = loaded.name
    if as_json:
        out.write(json.dumps(figures, indent=2) + "\n")
        return
    e2e = figures["end_to_end"]
    rows = [
        (f"pp{PP}", f"{figures['pp_tokens_per_s']:.1f} tok/s"),
        (f"tg{TG}", f"{figures['tg_tokens_per_s']:.1f} tok/s"),
        ("TTFT (short chat prompt)", f"{figures['ttft_s'] * 1000:.0f} ms"),
        ("runner run, end to end", f"{e2e['wall_s']:.2f} s, {e2e['tokens_per_s']:.1f} tok/s"),
    ]
    for n in PARALLEL:
        rate = figures["parallel"][str(n)]
        shown = "does not fit" if rate is None else f"{rate:.1f} tok/s in all"
        rows.append((f"--parallel {n}, {BATCH_PROMPTS} prompts", shown))
    ui.table_to(out, ("TEST", "RESULT"), rows, right={"RESULT"})


def _single(loaded: LoadedModel, repetitions: int) -> dict[str, Any]:
    engine = loaded.engine
    rng = random.Random(0)
    pp, tg, ttft = [], [], []
    for _ in range(repetitions):
        engine.reset()
        tokens = [rng.randrange(engine.n_vocab) for _ in range(PP)]  # as llama-bench: random tokens
        start = time.perf_counter()
        engine.prefill(tokens)
        pp.append(PP / (time.perf_counter() - start))
        engine.reset()
        steps = engine.generate_step([rng.randrange(engine.n_vocab)], GREEDY)
        next(steps)  # the one-token prompt, evaluated
        start = time.perf_counter()
        for _ in range(TG):
            next(steps)
        tg.append(TG / (time.perf_counter() - start))
        steps.close()
        engine.reset()
        prompt = render_prompt(engine, loaded.header, [Message("user", "Hello! Who are you?")], quiet=True)
        ttft.append(engine.generate(prompt.tokens, GREEDY, max_tokens=1).timings.ttft_s)
    return {
        "pp_tokens_per_s": round(statistics.median(pp), 2),
        "tg_tokens_per_s": round(statistics.median(tg), 2),
        "ttft_s": round(statistics.median(ttft), 4),
    }


def _end_to_end(model: str, repetitions: int) -> dict[str, float]:
    walls, rates = [], []
    for _ in range(repetitions):
        cmd = [sys.executable, "-m", "runner", "run", model, "Write one sentence about the sea.", "--json"]
        start = time.perf_counter()
        done = subprocess.run(
            [*cmd, "--max-tokens", "32", "--temperature", "0"], capture_output=True, check=False
        )
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise RunnerError(f"runner run failed: {done.stderr.decode(errors='replace').strip()}")
        walls.append(wall)
        rates.append(json.loads(done.stdout)["usage"]["completion_tokens"] / wall)
    return {"wall_s": round(statistics.median(walls), 3), "tokens_per_s": round(statistics.median(rates), 2)}


def _parallel(model: str, n: int, threads: int | None) -> float | None:
    """Aggregate tok/s of BATCH_PROMPTS prompts, n decoded at once (each a BATCH_CTX context), as
    the planner loads them; None when n sequences do not fit."""
    questions = [f"Tell me a fact about the number {i}." for i in range(BATCH_PROMPTS)]
    try:
        loaded = open_model(model, ctx=BATCH_CTX, parallel=n, threads=threads)
    except WontFit:
        return None
    try:
        prompts = [
            render_prompt(loaded.engine, loaded.header, [Message("user", q)], quiet=True).tokens
            for q in questions
        ]
        jobs = [Job(i, t, GREEDY, max_tokens=BATCH_TOKENS) for i, t in enumerate(prompts)]
        stats = run_batch(loaded.engine, jobs, lambda _d: None)
    finally:
        loaded.close()
    return round(stats.completion_tokens / stats.wall_s, 2)
