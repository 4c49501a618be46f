"""`runner bench MODEL`: how fast this machine runs a model, with the engine the commands use.

pp512 and tg128 as llama-bench defines them: 512 prompt tokens evaluated from an empty cache, then
128 tokens generated one at a time (greedy, end-of-text ignored), both through runner's Engine
(prefill, generate_step). TTFT of a short chat prompt; end to end, `runner run` as a process (start-up
and load included); aggregate throughput of 16 prompts at --parallel 1, 4 and 16
(runner.engine.batch). Medians of --repetitions runs, and a warning when they disagree beyond the
noise. A bar on a terminal's stderr shows the step under way. tg128 is kept per model file, machine,
threads and device, for `runner fit` to show (runner.memory.speed).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from runner import ui
from runner.commands.output import describe_load
from runner.engine.batch import run_batch
from runner.engine.prompt import render_prompt
from runner.engine.request import bare
from runner.engine.text.sampling import SamplingConfig
from runner.engine.text.template import Message
from runner.errors import RunnerError, WontFit
from runner.limits import check_range
from runner.loader import LoadedModel, open_model
from runner.settings import LoadSettings

PP, TG = 512, 128
PARALLEL = (1, 4, 16)
BATCH_PROMPTS, BATCH_TOKENS, BATCH_CTX = 16, 32, 512
GREEDY = SamplingConfig(temperature=0)
# Repetitions further apart than this ((slowest - fastest) / median) disagree beyond the noise: on an
# idle 2-core machine the figures swing by +-5% from run to run (docs/speed.md); 20% is something else.
NOISE = 0.2


def bench(
    model: str,
    *,
    out: TextIO,
    as_json: bool,
    repetitions: int = 3,
    threads: int | None = None,
    rpc: str | None = None,
) -> None:
    """rpc: the workers this process loads across (runner.loader.connect_workers did), for the end to
    end runs too."""
    check_range(repetitions, "--repetitions", 1, 100)
    steps = 1 + 4 * repetitions + len(PARALLEL)  # the load, pp/tg/TTFT and end to end each time, batches
    with ui.steps_progress("bench", steps, enabled=ui.stderr_is_tty()) as step:
        step("loading the model")
        loaded = open_model(model, LoadSettings(ctx=PP + TG + 64, threads=threads))
        try:
            ui.info(f"benchmarking {describe_load(loaded)}")
            samples = _single(loaded, repetitions, step)
        finally:
            loaded.close()
        samples["end_to_end"], rates = _end_to_end(model, repetitions, step, rpc)
        parallel = {str(n): _parallel(model, n, threads, step) for n in PARALLEL}
    figures = summarize(samples, rates)
    _remember(loaded, threads, figures["tg_tokens_per_s"])
    figures["parallel"] = parallel
    figures["model"] = loaded.name
    if as_json:
        out.write(json.dumps(figures, indent=2) + "\n")
    else:
        _table(figures, out)
    warning = disagreement(figures["spread"])
    if warning:
        ui.warn(warning)


def _remember(loaded: LoadedModel, threads: int | None, tg: float) -> None:
    """Keep tg128 for `runner fit` (runner.memory.speed): per model file, machine, threads and device,
    with the bandwidth bound of the same plan, so that fit can scale the bound for models not measured."""
    from runner.loader import machine, speed_where
    from runner.memory import speed

    here = machine()
    where = speed_where(loaded.path, loaded.plan, here, threads)
    limit = speed.bound(loaded.header, loaded.plan, here)
    per_token = speed.bytes_per_token(loaded.header, loaded.plan)
    shown = loaded.path.name if Path(loaded.name).exists() else loaded.name  # a file: its name, not its path
    speed.remember(where, speed.Measured(shown, tg, limit, per_token, speed.now()))


def summarize(samples: dict[str, list[float]], rates: list[float]) -> dict[str, Any]:
    """The medians of each test's repetitions and how far apart they were (spread, unsteady)."""
    spread = spreads(samples)
    return {
        "pp_tokens_per_s": round(statistics.median(samples[f"pp{PP}"]), 2),
        "tg_tokens_per_s": round(statistics.median(samples[f"tg{TG}"]), 2),
        "ttft_s": round(statistics.median(samples["ttft"]), 4),
        "end_to_end": {
            "wall_s": round(statistics.median(samples["end_to_end"]), 3),
            "tokens_per_s": round(statistics.median(rates), 2),
        },
        "spread": spread,
        "unsteady": [name for name, s in spread.items() if s > NOISE],
    }


def spreads(samples: dict[str, list[float]]) -> dict[str, float]:
    """Each test's (slowest - fastest) / median over its repetitions; none from a single run."""
    return {
        name: round((max(v) - min(v)) / statistics.median(v), 3) for name, v in samples.items() if len(v) > 1
    }


def disagreement(spread: dict[str, float]) -> str | None:
    """One line naming the tests whose repetitions disagree beyond the noise; None when none does."""
    wide = [f"{name} by {s:.0%}" for name, s in spread.items() if s > NOISE]
    if not wide:
        return None
    return (
        f"the repetitions disagree beyond the noise ({', '.join(wide)}; over {NOISE:.0%} is not noise): "
        "something else was using the machine, so the medians may be off; run it again when idle"
    )


def _table(figures: dict[str, Any], out: TextIO) -> None:
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


def _single(loaded: LoadedModel, repetitions: int, step: Callable[[str], None]) -> dict[str, list[float]]:
    """pp, tg and TTFT of each repetition, interleaved."""
    engine = loaded.engine
    rng = random.Random(0)
    chat = render_prompt(engine, loaded.header, [Message("user", "Hello! Who are you?")], quiet=True)
    _answer(engine, chat.tokens)  # a warm-up first, as llama-bench does
    pp: list[float] = []
    tg: list[float] = []
    ttft: list[float] = []
    for i in range(1, repetitions + 1):
        of = f"({i} of {repetitions})"
        step(f"pp{PP} {of}")
        engine.context.reset()
        tokens = [rng.randrange(engine.model.n_vocab) for _ in range(PP)]  # as llama-bench: random tokens
        start = time.perf_counter()
        engine.context.prefill(tokens)
        pp.append(PP / (time.perf_counter() - start))
        step(f"tg{TG} {of}")
        engine.context.reset()
        steps = engine.generate_step([rng.randrange(engine.model.n_vocab)], GREEDY)
        next(steps)  # the one-token prompt, evaluated
        start = time.perf_counter()
        for _ in range(TG):
            next(steps)
        tg.append(TG / (time.perf_counter() - start))
        steps.close()
        step(f"TTFT {of}")
        engine.context.reset()
        ttft.append(_answer(engine, chat.tokens).timings.ttft_s)
    return {f"pp{PP}": pp, f"tg{TG}": tg, "ttft": ttft}


def _answer(engine: Any, tokens: list[int]) -> Any:
    """A one-token answer. Engine.generate reports a Ctrl-C as the answer's finish reason (and
    clears it, for a chat that goes on); a benchmark has nothing to keep, so it stops here."""
    from runner.engine.answer import FINISH_INTERRUPTED

    result = engine.generate(tokens, GREEDY, max_tokens=1)
    if result.finish_reason == FINISH_INTERRUPTED:
        raise KeyboardInterrupt
    return result


def _end_to_end(
    model: str, repetitions: int, step: Callable[[str], None], rpc: str | None = None
) -> tuple[list[float], list[float]]:
    """Wall time and tok/s of each `runner run`, a process of its own (across the same workers)."""
    from runner.engine.rpc import CHILD_ENV

    walls, rates = [], []
    env = {k: v for k, v in os.environ.items() if k != CHILD_ENV}  # it checks the workers itself
    for i in range(1, repetitions + 1):
        step(f"runner run, end to end ({i} of {repetitions})")
        cmd = [sys.executable, "-m", "runner", "run", model, "Write one sentence about the sea.", "--json"]
        start = time.perf_counter()
        extra = ["--rpc", rpc] if rpc else []
        done = subprocess.run(
            [*cmd, "--max-tokens", "32", "--temperature", "0", *extra],
            capture_output=True,
            check=False,
            env=env,
        )
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise RunnerError(f"runner run failed: {done.stderr.decode(errors='replace').strip()}")
        walls.append(wall)
        rates.append(json.loads(done.stdout)["usage"]["completion_tokens"] / wall)
    return walls, rates


def _parallel(model: str, n: int, threads: int | None, step: Callable[[str], None]) -> float | None:
    """Aggregate tok/s of BATCH_PROMPTS prompts, n decoded at once (each a BATCH_CTX context), as
    the planner loads them; None when n sequences do not fit."""
    step(f"--parallel {n}, {BATCH_PROMPTS} prompts")
    questions = [f"Tell me a fact about the number {i}." for i in range(BATCH_PROMPTS)]
    try:
        loaded = open_model(model, LoadSettings(ctx=BATCH_CTX, parallel=n, threads=threads))
    except WontFit:
        return None
    try:
        prompts = [
            render_prompt(loaded.engine, loaded.header, [Message("user", q)], quiet=True).tokens
            for q in questions
        ]
        asked = [bare(t, GREEDY, max_tokens=BATCH_TOKENS) for t in prompts]
        stats = run_batch(loaded.engine, asked, lambda _d: None)
    finally:
        loaded.close()
    return round(stats.completion_tokens / stats.wall_s, 2)
