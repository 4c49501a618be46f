"""The decode thread count (runner.engine.threads): the policy with hand-picked step times."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.engine.threads import (
    DRIFT,
    FIRST_PROBE,
    PAYS,
    PROBE_AFTER,
    PROBE_MOST,
    PROBE_STEPS,
    Threads,
    free_threads,
    size_class,
)
from tests.conftest import run_cli

FAST, SLOW = 0.010, 0.100  # seconds of a one-token step: alone, and with a thread kept waiting


def steps(threads: Threads, seconds: float, n: int, tokens: int = 1) -> list[int | None]:
    return [threads.step(seconds, tokens) for _ in range(n)]


def run_on(threads: Threads, cost: dict[int, float], n: int, jitter: float = 0.0, seed: int = 1) -> float:
    """n steps on a machine where a step at each count costs cost[count] (times 1 +- jitter): the
    seconds they took, as the controller moved between counts."""
    rng = random.Random(seed)
    total = 0.0
    for _ in range(n):
        seconds = cost[threads.n] * (1 + rng.uniform(-jitter, jitter))
        total += seconds
        threads.step(seconds, 1)
    return total


# step costs of SmolLM2 on this 2-core machine (1 thread: 1.47x the idle step on 2), per situation
IDLE = {1: 1.47 * FAST, 2: FAST}
NICE19 = {1: 1.47 * FAST, 2: 1.04 * FAST}  # the nice-19 tasks take ~2% of a core from each thread
NICE0 = {1: 1.5 * FAST, 2: 3.0 * FAST}  # a thread shares its core: every step waits at the barriers


@pytest.mark.fast
def test_the_first_count_leaves_the_busy_cpus_to_others() -> None:
    assert free_threads(2, others=0, cpus=2) == 2
    assert free_threads(2, others=1, cpus=2) == 1  # one other task: one core left
    assert free_threads(2, others=5, cpus=2) == 1  # never fewer than one
    assert free_threads(2, others=2, cpus=4) == 2  # hyperthreads take the first two others
    assert free_threads(2, others=3, cpus=4) == 1
    assert free_threads(8, others=3, cpus=8) == 5


@pytest.mark.fast
def test_steps_are_compared_with_steps_of_their_size() -> None:
    assert [size_class(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 16, 17, 512)] == [
        1,
        1,
        2,
        3,
        4,
        5,
        5,
        6,
        6,
        7,
        11,
    ]


@pytest.mark.fast
def test_a_fixed_count_never_changes() -> None:
    threads = Threads(2, fixed=True, start=1)
    assert threads.n == 2  # --threads 2 is 2, whatever is free
    assert steps(threads, FAST, 5) + steps(threads, SLOW, 40) == [None] * 45
    assert threads.changes == 0 and threads.used() == 2


@pytest.mark.fast
def test_two_slow_steps_of_four_drop_a_thread() -> None:
    threads = Threads(2, fixed=False, start=2)
    assert steps(threads, FAST, 5) == [None] * 5
    assert threads.step(SLOW, 1) is None  # one slow step: noise, perhaps
    assert threads.step(SLOW, 1) == 1  # two of the last four: a thread is kept waiting
    assert threads.n == 1 and threads.changes == 1


@pytest.mark.fast
def test_a_big_step_is_not_slow_next_to_small_ones() -> None:
    threads = Threads(2, fixed=False, start=2)
    steps(threads, FAST, 5)
    assert steps(threads, 40 * FAST, 3, tokens=64) == [None] * 3  # a prefill chunk: its own size class
    assert threads.n == 2


@pytest.mark.fast
def test_steps_of_one_class_are_compared_per_token() -> None:
    """Speculation's verify steps of 5 and 8 tokens share a size class: an 8-token step costing 8/5
    of a 5-token one is not slow (per step it would be 2.9x the class's fastest 5-token step of 2.2 ms
    a token when the first was short)."""
    threads = Threads(2, fixed=False, start=2)
    for n in [5, 8, 5, 8, 6, 8, 7, 8] * 4:
        assert threads.step(0.5 * FAST + n * 0.5 * FAST, n) is None
    assert threads.n == 2 and threads.changes == 0


@pytest.mark.fast
def test_idle_at_the_cores_nothing_is_probed() -> None:
    threads = Threads(2, fixed=False, start=2)
    took = run_on(threads, IDLE, 5000, jitter=0.1)
    assert threads.probes == 0 and threads.changes == 0
    assert took <= 5000 * FAST * 1.1


@pytest.mark.fast
def test_beside_nice_19_tasks_the_hint_s_one_thread_is_left_for_two_at_once() -> None:
    """The runnable count sees two other tasks and starts on one thread; the first probe finds two
    pay and keeps them, and no probe follows while the steps cost what they did."""
    threads = Threads(2, fixed=False, start=1)
    assert steps(threads, NICE19[1], FIRST_PROBE - 1) == [None] * (FIRST_PROBE - 1)
    assert threads.step(NICE19[1], 1) == 2  # tried
    assert steps(threads, NICE19[2], PROBE_STEPS) == [None] * PROBE_STEPS  # faster every step: kept
    took = run_on(threads, NICE19, 5000, jitter=0.1)
    assert threads.n == 2 and threads.probes == 1 and threads.changes == 1
    assert took <= 5000 * NICE19[2] * 1.1


@pytest.mark.fast
def test_beside_a_nice_0_task_probes_fail_at_their_first_step_and_grow_rare() -> None:
    threads = Threads(2, fixed=False, start=1)
    took = run_on(threads, NICE0, 5000)
    # probes at 2, then 16, 32, ... steps after each failure: a handful in 5,000 steps
    assert threads.n == 1 and 5 <= threads.probes <= 10
    assert threads.tokens[2] == threads.probes  # each was given up at its first step
    assert took <= 5000 * NICE0[1] * 1.01  # the probing cost under 1%
    assert threads._wait[+1] == PROBE_MOST or threads.probes >= 7


@pytest.mark.fast
def test_a_rise_the_hint_says_has_no_core_waits_and_is_tried_in_the_end(monkeypatch) -> None:
    """Where the running tasks leave no core (nice 0 here, or in another session), a due rise is put
    off, the wait doubling, without a step spent on it; at the longest wait it is tried anyway (the
    hint can be wrong: a cgroup's weight, a VM), and kept when it pays."""
    from runner.engine import threads as module

    monkeypatch.setattr(module, "competing_others", lambda: 1)
    threads = Threads(2, fixed=False, start=1, look=True)
    run_on(threads, NICE0, 1500)
    assert threads.probes == 0 and threads.n == 1  # put off at 16, 32, ... steps: no step lost
    run_on(threads, NICE19, 2 * PROBE_MOST)  # the hint was wrong: two threads pay
    assert threads.probes == 1 and threads.n == 2
    monkeypatch.setattr(module, "competing_others", lambda: 0)
    threads = Threads(2, fixed=False, start=1, look=True)
    run_on(threads, NICE19, FIRST_PROBE + PROBE_STEPS + 1)  # room: tried at once
    assert threads.probes == 1 and threads.n == 2


@pytest.mark.fast
def test_a_competitor_that_slows_every_step_alike_is_found_by_drift() -> None:
    """Not one step is SLOW_STEP times the fastest, but all are DRIFT times the count's best: one
    thread fewer is tried and kept when it is faster; when the competitor leaves, two come back."""
    threads = Threads(2, fixed=False, start=2)
    run_on(threads, IDLE, 100)
    shared = {1: 1.5 * FAST, 2: 2.0 * FAST}  # 2.0 < SLOW_STEP x FAST, > DRIFT x FAST
    assert shared[2] > DRIFT * IDLE[2]
    run_on(threads, shared, 3 * PROBE_AFTER)
    assert threads.n == 1  # one fewer was tried (once its window showed the drift) and kept
    threads.begin()
    run_on(threads, shared, 500)  # two again now and then: slower, given up at once
    assert threads.n == 1 and threads.tokens[1] >= 495
    run_on(threads, IDLE, PROBE_MOST)  # it left: one more thread is tried, pays, is kept
    assert threads.n == 2


@pytest.mark.fast
def test_counts_that_cost_within_ten_percent_never_swap() -> None:
    """The hysteresis: where one and two threads cost about the same, the count stays where it is
    and probes in either direction fail and grow rare."""
    close = {1: 1.05 * FAST, 2: FAST}
    for start in (1, 2):
        threads = Threads(2, fixed=False, start=start)
        run_on(threads, close, 5000, jitter=0.03)
        assert threads.n == start and threads.probes <= 10
        assert threads.tokens[start] >= 0.99 * 5000


@pytest.mark.fast
def test_a_probe_lets_steps_of_other_sizes_pass() -> None:
    """A server's batches vary in size: a probe is judged on steps of its own size only."""
    threads = Threads(2, fixed=False, start=1)
    steps(threads, NICE19[1], FIRST_PROBE - 1)
    assert threads.step(NICE19[1], 1) == 2
    assert threads.step(40 * FAST, 64) is None  # a prompt chunk: not compared
    assert steps(threads, NICE19[2], PROBE_STEPS) == [None] * PROBE_STEPS
    assert threads.n == 2 and threads.probes == 1


@pytest.mark.fast
def test_a_rise_undone_by_slow_steps_waits_longer_before_the_next() -> None:
    """Two threads paid in their probe and then were kept waiting (a competitor's slices came round):
    the next rise waits twice as long, so the count does not swing."""
    threads = Threads(2, fixed=False, start=1)
    steps(threads, FAST, FIRST_PROBE)
    steps(threads, 0.6 * FAST, PROBE_STEPS)
    assert threads.n == 2
    steps(threads, 0.6 * FAST, 3)
    assert steps(threads, SLOW, 2)[-1] == 1
    waited = 0
    while threads.step(FAST, 1) is None:
        waited += 1
    assert waited + 1 >= PROBE_AFTER


@pytest.mark.fast
def test_a_quota_s_throttled_steps_show_in_the_mean() -> None:
    """A CPU quota of one core over two threads: five fast steps, then one that waits out the rest of
    the period. No two of four are slow and the median is fast, but the mean is twice one step: one
    thread (never throttled) is tried, kept, and a rise that the quota undoes waits ever longer."""
    threads = Threads(2, fixed=False, start=2)
    total = 0.0
    for i in range(4000):
        seconds = (6 * FAST if i % 6 == 5 else FAST) if threads.n == 2 else 1.47 * FAST
        total += seconds
        threads.step(seconds, 1)
    assert threads.tokens[1] >= 0.95 * 4000
    assert total <= 4000 * 1.47 * FAST * 1.05  # within 5% of one thread throughout


@pytest.mark.fast
def test_an_upward_probe_s_steps_have_a_budget() -> None:
    """What the count it came from takes per step (PAYS of its mean): past it the step is aborted,
    recorded as given up, and the count is back where it was."""
    threads = Threads(2, fixed=False, start=1)
    assert threads.budget(1) is None  # no probe
    steps(threads, FAST, FIRST_PROBE)
    assert threads.n == 2
    assert threads.budget(64) is None  # not the probe's size
    assert threads.budget(1) == pytest.approx(PAYS * FAST)
    assert threads.step(0.5, 1, aborted=True) == 1  # a thread waited for a core: stopped, back to one
    assert threads.tokens == {1: FIRST_PROBE} and threads.budget(1) is None


@pytest.mark.model
def test_an_aborted_probe_step_leaves_the_answer_as_one_thread_gives_it(engine, monkeypatch) -> None:
    """Every probe's step aborted at once (a zero budget): llama.cpp drops the step's cells and the
    step runs again on one thread, so the greedy answer is the one a fixed thread gives, token for
    token, and every token was decoded on one thread."""
    from runner.engine import threads as module
    from runner.engine.llamacpp import llama
    from runner.engine.text.sampling import SamplingConfig
    from runner.engine.threads import set_threads

    prompt = engine.model.tokenize("The history of the old harbour town begins")
    greedy = SamplingConfig(temperature=0)
    kept = engine.context.threads
    try:
        engine.context.threads = Threads(1, fixed=True)
        set_threads(llama(), engine.context.ctx, 1)
        alone = engine.generate(prompt, greedy, max_tokens=48).text
        monkeypatch.setattr(module, "PAYS", 0.0)
        probing = engine.context.threads = Threads(2, fixed=False, start=1)
        aborted = engine.generate(prompt, greedy, max_tokens=48).text
    finally:
        engine.context.threads = kept
        set_threads(llama(), engine.context.ctx, kept.n)
    assert probing.probes == probing.aborts == 2 and set(probing.tokens) == {1}  # at 16 and 33 of 48
    assert aborted == alone


@pytest.mark.fast
def test_each_answer_has_its_own_record() -> None:
    threads = Threads(2, fixed=False, start=2)
    steps(threads, FAST, 5)
    steps(threads, SLOW, 2)
    assert threads.changes == 1 and threads.used() == 2
    threads.begin()
    steps(threads, FAST, 3)
    assert threads.changes == 0 and threads.used() == 1


@pytest.mark.fast
def test_an_answer_of_a_server_s_loop_has_its_own_share_of_the_record() -> None:
    """A server's loop runs for hours: each answer's timings say what its own tokens ran on."""
    threads = Threads(2, fixed=False, start=2)
    steps(threads, FAST, 30)
    mark = threads.mark()
    steps(threads, SLOW, 2)  # down to one
    steps(threads, FAST, 5)
    assert threads.since(mark) == (1, 1)  # 6 of its 7 tokens on one thread, one change
    assert threads.used() == 2 and threads.changes == 1  # the loop's whole record
    threads.begin()
    assert threads.since(mark) == (1, 0)  # begun again since: the record as it is


@pytest.mark.fast
def test_the_policy_tests_take_under_a_second() -> None:
    """The issue's bound on these tests: the controller alone, no model."""
    import time as clock

    started = clock.perf_counter()
    for cost, start in ((IDLE, 2), (NICE19, 1), (NICE0, 1)):
        run_on(Threads(2, fixed=False, start=start), cost, 5000, jitter=0.1)
    assert clock.perf_counter() - started < 0.5


# -- the real model, as processes -------------------------------------------------------------------

ANSWER = ["--raw", "--temperature", "0", "--max-tokens", "64", "--json", "--no-prompt-cache"]
PROMPT = "The history of the old harbour town begins"
SPIN = "import time\nend = time.time() + 90\nwhile time.time() < end:\n    pass\n"


def decode_rate(model: Path, *flags: str) -> dict:
    done = run_cli("run", str(model), PROMPT, *ANSWER, *flags, timeout=150)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["timings"]


def started(command: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
    )


def stopped(processes: list[subprocess.Popen[bytes]]) -> None:
    for p in processes:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)


def test_threads_n_is_honoured_exactly(smollm2_path: Path) -> None:
    for n in (1, 2):
        timings = decode_rate(smollm2_path, "--threads", str(n))
        assert timings["threads"] == n and timings["thread_changes"] == 0


def test_an_answer_beside_a_cpu_bound_process_keeps_a_fair_share(smollm2_path: Path) -> None:
    """One CPU-bound process at nice 0 took a 2-core Xeon's decoding from 99.6 to 26.1 tok/s, and a
    raw llama_decode loop here to 0.01x its idle rate: the answer must keep a fair share of the idle
    rate measured in the same test (generously: a third)."""
    idle = decode_rate(smollm2_path)["decode_tokens_per_s"]
    competitor = started([sys.executable, "-c", SPIN])
    try:
        time.sleep(0.5)
        busy = decode_rate(smollm2_path)
    finally:
        stopped([competitor])
    assert busy["decode_tokens_per_s"] >= idle / 3, (busy, idle)


def test_two_answers_at_once_together_keep_most_of_one_alone(smollm2_path: Path) -> None:
    """Two runners at once each decoded 75x slower than one alone on a 2-core Xeon: together they
    must keep at least half of one alone (measured in the same test; one thread each gives more)."""
    idle = decode_rate(smollm2_path)["decode_tokens_per_s"]
    command = [sys.executable, "-m", "runner", "run", str(smollm2_path), PROMPT, *ANSWER]
    pair = [started(command) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=150)[0] for p in pair]
    finally:
        stopped(pair)
    rates = [json.loads(out)["timings"]["decode_tokens_per_s"] for out in outs]
    assert sum(rates) >= idle / 2, (rates, idle)


def spinners(n: int, nice: int, *, own_session: bool) -> list[subprocess.Popen[bytes]]:
    """n CPU-bound processes at this nice, in this session (a process group of their own) or each in
    a session of its own."""
    command = ["nice", "-n", str(nice), sys.executable, "-c", SPIN]
    apart = {"start_new_session": True} if own_session else {"preexec_fn": os.setpgrp}
    return [subprocess.Popen(command, **apart) for _ in range(n)]  # type: ignore[call-overload]


def test_the_first_count_weighs_what_nice_leaves_to_this_process() -> None:
    """Two CPU-bound nice-19 processes of this session take ~1.5% of a core from a nice-0 thread:
    no load for the first count; the same started in sessions of their own (autogroups, where the
    kernel has them) and one at nice 0 are."""
    from runner.engine.threads import competing_others, runnable_others

    def readings(processes: list[subprocess.Popen[bytes]]) -> list[tuple[int | None, int | None]]:
        try:
            time.sleep(0.3)
            got = []
            for _ in range(5):
                got.append((competing_others(), runnable_others()))
                time.sleep(0.05)
            return got
        finally:
            stopped(processes)

    nice19 = readings(spinners(2, 19, own_session=False))
    assert min(r or 0 for r, _ in nice19) == 0 and max(n or 0 for _, n in nice19) >= 2  # loadavg counts them
    assert min(r or 0 for r, _ in readings(spinners(1, 0, own_session=False))) >= 1
    grouped = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if grouped.exists() and grouped.read_text().strip() == "1":
        assert min(r or 0 for r, _ in readings(spinners(2, 19, own_session=True))) >= 2


def test_an_answer_beside_nice_19_processes_keeps_every_core(smollm2_path: Path) -> None:
    """Beside one CPU-bound nice-19 process per core (a `nice make -j2` in this shell) the answer
    decodes on every core, as a raw llama_decode loop would, not on the one a runnable count leaves."""
    from runner.engine.llamacpp import default_threads

    competitors = spinners(default_threads(), 19, own_session=False)
    try:
        time.sleep(0.5)
        timings = decode_rate(smollm2_path)
    finally:
        stopped(competitors)
    assert timings["threads"] == default_threads(), timings
