"""How many threads llama.cpp decodes with, chosen from the CPUs that are free and chosen again as it goes.

The installed llama.cpp runs its CPU graph on OpenMP: every node of a token's graph (~900 for a small
model) ends in a barrier, and a thread whose partner was preempted by another process spins there
until the partner runs again. So on a busy machine more threads can be far slower than fewer (two
raw loops at once on two cores: each at a fifth of its speed alone, measured; one thread each: both at
nine tenths). llama.cpp takes a new thread count between any two llama_decode calls
(llama_set_n_threads), so the count follows the machine:

- the count is the physical cores less the other tasks running right now: /proc/loadavg's runnable
  count (instant, unlike a load average), this process's own decode threads not counted. It is read
  before and after the model loads (the fewer counts: a task of a moment, such as the program a pipe
  starts, is not a load) and every LOOK_EVERY steps; a busier machine lowers the count after
  BUSY_AFTER readings in a row (one step with a thread kept waiting can cost as much as fifty
  without), a freer one raises it only after RAISE_AFTER readings in a row and as a trial, given up
  at its first slow step or if it does not pay;
- every decode step is timed; a step far slower than the fastest recent step of its size at that
  count (SLOW_STEP) means a thread was kept waiting: two of the last four so, and one thread fewer,
  whatever the load says (another process's threads, a VM's stolen time).

`--threads N` fixes the count: nothing adapts. What an answer ran on (the count its tokens mostly
used, and how often it changed) comes back in its timings.
"""

from __future__ import annotations

import functools
import os
from collections import Counter, deque
from typing import Any

SLOW_STEP = 2.5  # a step this many times its size's recent fastest, at the same count, was kept waiting
WINDOW = 16  # steps of one size and count whose fastest is the reference
LOOK_EVERY = 1  # steps between readings of the machine's runnable tasks (~2 us each)
BUSY_AFTER = 2  # readings in a row with fewer free cores before threads are given up (a kernel thread
# of a moment shows in one reading; a process that wants the CPU, in every one)
RAISE_AFTER = 4  # readings in a row with room for more threads before one more is tried
PROBE_AFTER = 8  # steps at fewer threads before one more is tried; doubles after each failed try
PROBE_MOST = 1024
PROBE_STEPS = 4  # steps a tried count runs before it is judged
PAYS = 0.9  # a tried count is kept when its fastest step takes at most this of the one it replaced


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
    """Steps are compared with steps of about their size: 1, 2, 3-4, 5-8, ..."""
    return max(1, n_tokens - 1).bit_length()


class Threads:
    """The decode thread count of one llama.cpp context, and its record."""

    def __init__(self, most: int, *, fixed: bool, start: int | None = None, look: bool = True) -> None:
        self.most = max(1, most)
        self.fixed = fixed
        self.look = look and not fixed  # read the machine's load (off: step times alone, in tests)
        self.n = self.most if fixed else max(1, min(self.most, start or free_threads(self.most)))
        self._roomy = 0  # readings in a row with room for more threads
        self._busy = 0  # readings in a row with fewer free cores than threads
        self.changes = 0
        self.tokens: Counter[int] = Counter()  # tokens decoded at each count
        self._fastest: dict[tuple[int, int], deque[float]] = {}
        self._recent: deque[bool] = deque(maxlen=4)  # were the last steps slow
        self._wait = PROBE_AFTER
        self._since = 0  # steps at this count since it was chosen
        self._trial: int | None = None  # the count a probe came from
        self._tried: list[float] = []  # the probe's own steps

    def begin(self) -> None:
        """A new answer: its own record (what was learned of the machine stays)."""
        self.tokens.clear()
        self.changes = 0

    def used(self) -> int:
        """The count most tokens were decoded with (the count now, before any)."""
        return self.tokens.most_common(1)[0][0] if self.tokens else self.n

    def step(self, seconds: float, n_tokens: int) -> int | None:
        """Record a decode step of n_tokens; the new count when it should change, else None."""
        self.tokens[self.n] += n_tokens
        if self.fixed:
            return None
        key = (self.n, size_class(n_tokens))
        window = self._fastest.setdefault(key, deque(maxlen=WINDOW))
        fastest = min(window) if window else None
        window.append(seconds)
        slow = fastest is not None and seconds > SLOW_STEP * fastest
        self._recent.append(slow)
        self._since += 1
        if self._trial is not None:
            self._tried.append(seconds)
            return self._judge(slow, key)
        if sum(self._recent) >= 2 and self.n > 1:
            return self._change(self.n - 1)
        free = self._free() if self.look and self._since % LOOK_EVERY == 0 else None
        if free is not None and free < self.n and self._busy >= BUSY_AFTER:
            return self._change(free)  # another process took cores: leave them to it now
        if self.n < self.most and self._since >= self._wait and (not self.look or self._roomy >= RAISE_AFTER):
            self._trial = self.n
            return self._change(self.n + 1)
        return None

    def _free(self) -> int | None:
        """The threads the machine has room for now (None: unknown); counts readings with room."""
        others = runnable_others(own=self.n)
        if others is None:
            return None
        free = free_threads(self.most, others)
        self._roomy = self._roomy + 1 if free > self.n else 0
        self._busy = self._busy + 1 if free < self.n else 0
        return free

    def _judge(self, slow: bool, key: tuple[int, int]) -> int | None:
        came_from = self._trial
        assert came_from is not None
        if slow:
            return self._give_up(came_from)
        if self._since < PROBE_STEPS:
            return None
        before = self._fastest.get((came_from, key[1]))
        now = min(self._tried)
        self._trial = None
        if before and now > PAYS * min(before):
            return self._give_up(came_from)
        self._wait = PROBE_AFTER  # more threads paid: keep them
        return None

    def _give_up(self, came_from: int) -> int:
        self._trial = None
        self._wait = min(PROBE_MOST, self._wait * 2)
        return self._change(came_from)

    def _change(self, n: int) -> int:
        self.n = n
        self._tried = []
        self._roomy = self._busy = 0
        self.changes += 1
        self._since = 0
        self._recent.clear()
        return n


def set_threads(lib: Any, ctx: Any, n: int) -> None:
    """Decode and batch (prefill) alike with n threads from the next llama_decode on."""
    lib.llama_set_n_threads(ctx, n, n)
