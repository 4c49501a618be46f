"""How many threads llama.cpp decodes with: chosen by what each step costs, and chosen again as it goes.

The installed llama.cpp runs its CPU graph on OpenMP: every node of a token's graph (~900 for a small
model) ends in a barrier, and a thread whose partner was preempted by another process spins there
until the partner runs again. So on a busy machine more threads can be far slower than fewer (two
raw loops at once on two cores: each at a fifth of its speed alone, measured; one thread each: both at
nine tenths). Whether another process takes a core from a thread depends on things a count of
runnable tasks cannot see (its nice, its session's autogroup, a cgroup quota, a VM's stolen time), so
the judge is the one figure they all show in: what a decode step costs at n threads against n-1 and
n+1. llama.cpp takes a new count between any two llama_decode calls (llama_set_n_threads):

- the first count is the physical cores less the other tasks that would take a core from a decode
  thread (competing_others: /proc/loadavg's runnable count, and the running tasks themselves less
  those much nicer than this process in its autogroup), read before and after the model loads: a
  hint for the start, not a judge;
- every step is timed and kept, per token, with the steps of its size at its count. Two of the last four far
  slower than that count's fastest recent step (SLOW_STEP: a thread kept waiting at its barriers),
  and one thread is given up at once;
- a probe tries one thread more (below the cores: FIRST_PROBE steps after the start, then after
  PROBE_AFTER; CLIMB after one that was kept) or one fewer (when the mean of the count's recent
  steps, less the slowest, has become DRIFT times its best: the machine changed), for PROBE_STEPS
  steps of one size, given up at its first step that is not faster than PAYS of the current count's
  mean. A probe given up doubles that direction's wait (up to PROBE_MOST steps), and so does a rise
  not held for SETTLED steps: a count the probes keep confirming is probed ever more rarely, and an
  idle machine at its cores not at all. The 10% a probe must win by is the hysteresis: counts within
  10% of each other never swap;
- a rise that is due is put off (its wait doubled, no step spent) while competing_others leaves no
  core for it, until its wait is PROBE_MOST: the hint can be wrong, so it is tried then anyway;
- an upward probe's step has a budget (budget(): what the count it came from takes), past which
  Context._decode has llama.cpp abort it and runs it again on that count: one thread more can cost
  fifty steps where it waits for a core; a failed probe costs about one.

`--threads N` fixes the count: nothing adapts. What an answer ran on (the count its tokens mostly
used, and how often it changed) comes back in its timings.
"""

from __future__ import annotations

import functools
import os
from collections import Counter, deque
from pathlib import Path
from typing import Any

SLOW_STEP = 2.5  # a step this many times its size's recent fastest, at the same count, was kept waiting
WINDOW = 16  # steps of one size and count kept: the fastest of them is the reference for SLOW_STEP
RECENT = 8  # steps of one size at one count before their mean may show a drift
PAYS = 0.9  # a probe's every step must take at most this of the current count's recent mean
DRIFT = 1.5  # the mean of a count's steps this many times its best: try one thread fewer
FIRST_PROBE = 16  # steps after the start before one more thread is tried (the first count's hint is
# seldom wrong, and each failed probe costs about a step)
CLIMB = 2  # steps after a kept probe before the next one the same way (to the count that pays)
PROBE_AFTER = 16  # steps before a probe in a direction whose last probe failed; doubles each time
PROBE_MOST = 1024
PROBE_STEPS = 2  # steps of the probe's size a probe runs before it is kept
PROBE_OTHER = 4  # steps of other sizes a probe lets pass (a server's batches vary) before it is dropped
SETTLED = 64  # steps at a count after which a slow spell is news (a new competitor), not a failed rise


@functools.cache
def _loadavg() -> int | None:
    """/proc/loadavg, kept open: a pread of it costs ~1 us, an open and read ~10 us."""
    try:
        return os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def runnable_others(own: int = 1) -> int | None:
    """Tasks running or ready to run on this machine now, less `own` of this process's threads
    (the one reading, and decode threads that are still spinning); None where the kernel does not say."""
    fd = _loadavg()
    if fd is None:
        return None
    try:
        running = int(os.pread(fd, 128, 0).split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0, running - own)


NICE_APART = 10  # a task this much nicer than ours (weight 1/9 or less) takes next to nothing from it


def competing_others() -> int | None:
    """Tasks of other processes running or ready to run now that would take a core from a decode
    thread: /proc/loadavg's runnable count, and where it is not zero, the running tasks themselves
    (/proc/PID/task/TID/stat), less those NICE_APART nicer than this process that the scheduler weighs
    against it (in its autogroup, where the kernel groups by session: a nice-19 task in another
    session takes as much as a nice-0 one). A hint for the first count only; the steps judge."""
    others = runnable_others()
    if not others:
        return others
    try:
        return _running_tasks()
    except OSError:
        return others


def _running_tasks() -> int:
    own, mine = os.getpid(), os.getpriority(os.PRIO_PROCESS, 0)
    switch = Path("/proc/sys/kernel/sched_autogroup_enabled")
    grouped = switch.exists() and switch.read_text().strip() == "1"
    group = _autogroup("self") if grouped else None
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            tasks = list(os.scandir(f"/proc/{entry.name}/task"))
        except OSError:  # gone
            continue
        for task in tasks:
            try:
                with open(f"{task.path}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[0] != b"R":
                continue
            nicer = int(fields[16]) - mine >= NICE_APART
            if nicer and (not grouped or _autogroup(entry.name) == group):
                continue
            count += 1
    return count


def _autogroup(pid: str) -> str | None:
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().split()[0]
    except (OSError, IndexError):
        return None


def free_threads(most: int, others: int | None = None, cpus: int | None = None) -> int:
    """The threads to start with: `most` (the physical cores), less what the other running tasks
    take beyond the logical CPUs that hyperthreads leave over."""
    others = runnable_others() if others is None else others
    if others is None:
        return most
    cpus = cpus or os.cpu_count() or most
    spare = max(0, cpus - most)  # hyperthreads: other tasks take those first
    return max(1, min(most, most - max(0, others - spare)))


def size_class(n_tokens: int) -> int:
    """Steps are compared, per token, with steps of about their size: 1, 2, 3, 4, 5-8, 9-16, ... (a
    step's fixed cost weighs most in the smallest, which so each have a class of their own)."""
    return max(1, n_tokens) if n_tokens <= 4 else 2 + (n_tokens - 1).bit_length()


class Threads:
    """The decode thread count of one llama.cpp context, and its record."""

    def __init__(self, most: int, *, fixed: bool, start: int | None = None, look: bool = False) -> None:
        self.most = max(1, most)
        self.fixed = fixed
        self.look = look  # ask the machine (competing_others) before a rise (off: step times alone)
        self.n = self.most if fixed else max(1, min(self.most, start or self.most))
        self.changes = 0
        self.probes = 0  # probes made (kept or not), for the record and the tests
        self.aborts = 0  # probe steps stopped at their budget
        self.tokens: Counter[int] = Counter()  # tokens decoded at each count
        self._steps: dict[tuple[int, int], deque[float]] = {}  # (count, size): its last WINDOW steps
        self._best: dict[tuple[int, int], float] = {}  # (count, size): its fastest step ever
        self._recent: deque[bool] = deque(maxlen=4)  # were the last steps slow
        self._since = 0  # steps at this count since it was chosen (or since the last probe ended)
        self._held = SETTLED  # steps since the count last moved for good (a kept probe, a drop)
        self._moved = -1  # which way it moved then
        self._wait = {+1: FIRST_PROBE, -1: PROBE_AFTER}  # steps before a probe, by direction
        self._backoff = {+1: PROBE_AFTER, -1: PROBE_AFTER}  # the wait after a failure; doubles each
        self._probe: tuple[int, int, float] | None = None  # the count it came from, size, reference
        self._probed = 0  # the probe's steps of its size
        self._other = 0  # the probe's steps of other sizes

    def begin(self) -> None:
        """A new answer: its own record (what was learned of the machine stays)."""
        self.tokens.clear()
        self.changes = 0

    def mark(self) -> tuple[Counter[int], int]:
        """The record now, for since(): one answer's share of a loop that serves many at once."""
        return Counter(self.tokens), self.changes

    def since(self, mark: tuple[Counter[int], int] | None) -> tuple[int, int]:
        """(the count most tokens since the mark ran on, the changes since): the whole record where
        it was begun again after the mark, or there is none."""
        if mark is None or self.changes < mark[1]:
            return self.used(), self.changes
        return self._most(self.tokens - mark[0]), self.changes - mark[1]

    def used(self) -> int:
        """The count most tokens were decoded with (the count now, before any)."""
        return self._most(self.tokens)

    def _most(self, tokens: Counter[int]) -> int:
        return tokens.most_common(1)[0][0] if tokens else self.n

    def budget(self, n_tokens: int) -> float | None:
        """Seconds the coming step of n_tokens may take before it is aborted and run again on the
        count it came from: a step of an upward probe's size, what that count's steps take (beyond
        it the probe has failed already; a thread waiting for a core can make it cost fifty)."""
        if self._probe is None or self.n < self._probe[0] or size_class(n_tokens) != self._probe[1]:
            return None
        return PAYS * self._probe[2] * max(1, n_tokens)

    def step(self, seconds: float, n_tokens: int, *, aborted: bool = False) -> int | None:
        """Record a decode step of n_tokens (aborted: stopped at its budget, to be run again); the
        new count when it should change, else None."""
        if aborted:
            self.aborts += 1
        else:
            self.tokens[self.n] += n_tokens
        if self.fixed:
            return None
        size = size_class(n_tokens)
        key = (self.n, size)
        window = self._steps.setdefault(key, deque(maxlen=WINDOW))
        fastest = min(window) if window else None
        cost = seconds / max(1, n_tokens)  # per token: a class's steps differ in size (5 to 8 tokens)
        window.append(cost)
        self._best[key] = min(cost, self._best.get(key, cost))
        if self._probe is not None:
            return self._judge(cost, size)
        slow = fastest is not None and cost > SLOW_STEP * fastest
        self._recent.append(slow)
        self._since += 1
        self._held += 1
        if self._held == SETTLED:  # the count has held: the move that made it was right
            self._backoff[self._moved] = PROBE_AFTER
        if sum(self._recent) >= 2 and self.n > 1:  # a thread is kept waiting: one fewer, now
            self._down()
            self._held = 0
            return self._change(self.n - 1)
        if len(window) < 2 or self._since < min(self._wait.values()):
            return None  # no probe is due: nothing more to work out this step
        # what a step costs at this count, its slow ones included (a quota's throttled steps), but
        # for the slowest: one step a daemon delayed is no news
        now = (sum(window) - max(window)) / (len(window) - 1)
        if self.n < self.most and self._since >= self._wait[+1]:
            if self.look and self._wait[+1] < PROBE_MOST and not self._room():
                self._failed(+1)  # the hint says the cores are taken: a probe would cost a step
                self._since = 0
                return None
            return self._start(+1, size, now)
        drifted = len(window) >= RECENT and now > DRIFT * self._best[key]  # a few steps prove nothing
        if self.n > 1 and self._since >= self._wait[-1] and drifted:
            return self._start(-1, size, now)
        return None

    def _down(self) -> None:
        """One thread fewer is taken: a count reached by a probe and not held for SETTLED steps was not
        worth it, and the next rise waits twice as long (no swinging); one held longer met a new
        competitor, and may be tried again soon."""
        if self._held < SETTLED:
            self._failed(+1)
        else:
            self._wait[+1] = self._backoff[+1] = PROBE_AFTER
        self._moved = -1

    def _room(self) -> bool:
        """Whether the hint leaves a core for one thread more (read only when a rise is due)."""
        others = competing_others()
        return others is None or free_threads(self.most, others) > self.n

    def _start(self, direction: int, size: int, reference: float) -> int:
        came_from = self.n
        self.probes += 1
        self._change(self.n + direction)
        self._probe = (came_from, size, reference)
        self._probed = self._other = 0
        return self.n

    def _judge(self, cost: float, size: int) -> int | None:
        came_from, probe_size, reference = self._probe  # type: ignore[misc]
        direction = self.n - came_from
        if size != probe_size:  # not comparable with the reference: let a few pass
            self._other += 1
            if self._other > PROBE_OTHER:
                self._probe = None
                return self._change(came_from)
            return None
        self._probed += 1
        if cost > PAYS * reference:  # not faster: given up at its first such step
            self._probe = None
            self._failed(direction)
            return self._change(came_from)
        if self._probed < PROBE_STEPS:
            return None
        self._probe = None  # kept: the way it went may go on soon, the way back waits
        if direction > 0:
            self._wait[-1] = PROBE_AFTER
            self._moved = +1
        else:
            self._down()
        self._wait[direction] = CLIMB
        self._since = self._held = 0
        return None

    def _failed(self, direction: int) -> None:
        self._wait[direction] = self._backoff[direction]
        self._backoff[direction] = min(PROBE_MOST, 2 * self._backoff[direction])

    def _change(self, n: int) -> int:
        self.n = n
        self.changes += 1
        self._since = 0
        self._recent.clear()
        return n


def set_threads(lib: Any, ctx: Any, n: int) -> None:
    """Decode and batch (prefill) alike with n threads from the next llama_decode on."""
    lib.llama_set_n_threads(ctx, n, n)
