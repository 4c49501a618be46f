"""What the engine hands out: an answer's pieces (Chunk), the whole of it (Result, the one result type
every caller gets, one sequence or a batch), its Timings and finish reasons; the text assembly
between token bytes and those pieces (a UTF-8 character split across tokens held until complete, a
tail that may begin a stop string held until it cannot, and which stop string ended it); and the
clock since the process started (start-up in --json and --verbose).
"""

from __future__ import annotations

import codecs
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.engine.logprobs import TokenLogprob
from runner.engine.promptcache import CacheUse
from runner.engine.speculate import SpecStats

FINISH_STOP = "stop"  # end-of-generation token or a stop string
FINISH_LENGTH = "length"  # --max-tokens reached, or the context is full
FINISH_INTERRUPTED = "interrupted"  # Ctrl-C: the answer stopped within a token, what came is kept
FINISH_ERROR = "error"  # the job could not run (its prompt too long, its grammar refused): Result.error
FINISH_REPEAT = "repetition"  # no answer limit, and the answer went round in a loop (Job.stop_loops)
FINISH_TOOL_CALLS = "tool_calls"  # the answer is tool calls (runner.engine.request.finish read them)
LOOP_SPAN = 256  # a loop: the answer's last LOOP_SPAN tokens or more, the same LOOP_PERIOD_MAX at
LOOP_PERIOD_MAX = 512  # most over and over, three times at least


def looping(tokens: list[int]) -> int:
    """The period of the loop the tokens end in (the last max(3p, LOOP_SPAN) tokens repeat every p,
    p <= LOOP_PERIOD_MAX), the shortest; 0 if they end in none. A small model that writes the same
    paragraph again and again fills its context so: with no answer limit, that is where it stops."""
    if not tokens:
        return 0
    last = tokens[-1]
    for period in range(1, LOOP_PERIOD_MAX + 1):
        span = max(3 * period, LOOP_SPAN)
        if span > len(tokens):
            break
        if tokens[-1 - period] != last:  # most periods fail here, at no cost
            continue
        tail = tokens[-span:]
        if tail[period:] == tail[:-period]:
            return period
    return 0


@dataclass(frozen=True)
class Timings:
    load_s: float = 0.0
    prompt_tokens: int = 0  # tokens in the prompt
    prefill_tokens: int = 0  # of those, tokens evaluated (the rest came from the KV cache)
    prefill_s: float = 0.0
    ttft_s: float = 0.0  # start of the request to the first generated token
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # of those, the reasoning's (OpenAI's completion_tokens_details)
    decode_s: float = 0.0  # after the first token, to the last
    total_s: float = 0.0
    startup_s: float = 0.0  # the process's start to this request's first prefill (0: unknown)
    speculation: SpecStats = SpecStats()
    prompt_cache: CacheUse = CacheUse()  # tokens of the prompt loaded from, or written to, the disk cache
    threads: int = 0  # the decode threads most of the answer's tokens ran on (runner.engine.threads)
    thread_changes: int = 0  # how often that count changed during the answer

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens not evaluated: held by the sequence, copied in, or restored from a kept state."""
        return self.prompt_tokens - self.prefill_tokens

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        steps = self.completion_tokens - 1
        return steps / self.decode_s if steps > 0 and self.decode_s > 0 else 0.0


@dataclass(frozen=True)
class Chunk:
    """A piece of the answer (`kind` "answer" or "reasoning"); the last one carries the Result."""

    text: str
    kind: str = "answer"
    result: Result | None = None

    @property
    def finish_reason(self) -> str | None:
        return self.result.finish_reason if self.result is not None else None

    @property
    def timings(self) -> Timings | None:
        return self.result.timings if self.result is not None else None

    @property
    def context_full(self) -> bool:
        return self.result.context_full if self.result is not None else False


@dataclass(frozen=True)
class Result:
    """How an answer ended, from the loop to every edge: the answer's text (reasoning apart), why it
    ended (`finish_reason`; `stop`: the stop string that matched, None for an end-of-generation
    token), its timings (tokens, cache, speculation), and `error` for a job that could not run."""

    text: str
    finish_reason: str
    timings: Timings
    context_full: bool = False
    reasoning: str = ""
    stop: str | None = None
    error: str | None = None
    index: int = 0  # the job's index (answers of a batch come back in any order)
    logprobs: tuple[TokenLogprob, ...] = ()  # the answer's tokens' (Job.logprobs), text-less end tokens not
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # Job.echo: each prompt token's after the first
    tool_calls: tuple[dict[str, Any], ...] = ()  # {"name", "arguments": dict}, read by request.finish
    invalid: str | None = None  # how the answer fails the shape its request asked for (request.finish)


# Every field a Result's JSON may carry under "timings", in order: --json, --jsonl rows, the store's
# stats and a server's `timings` each take the ones they show (result_json), never renaming one.
TIMINGS = (
    "startup_s",  # the process's start to the first prefill
    "load_s",  # the model's load
    "prompt_tokens",
    "cached_tokens",  # of the prompt, not evaluated: held, copied or restored
    "prefill_tokens",  # of the prompt, evaluated
    "completion_tokens",
    "ttft_s",  # the request's start (a server: its arrival) to the first token
    "prefill_s",
    "decode_s",  # the first token to the last
    "total_s",  # the request's start to its last token (the load apart)
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "threads",
    "thread_changes",
    "drafted",  # speculative decoding: tokens drafted and verified
    "accepted",  # of those, kept
)


def timings_json(t: Timings, fields: Sequence[str] = TIMINGS) -> dict[str, Any]:
    """Timings as JSON: the `fields` asked for (TIMINGS' names), seconds to 0.1 ms, rates to 0.01."""
    values: dict[str, Any] = {
        "startup_s": round(t.startup_s, 3),
        "load_s": round(t.load_s, 4),
        "prompt_tokens": t.prompt_tokens,
        "cached_tokens": t.cached_tokens,
        "prefill_tokens": t.prefill_tokens,
        "completion_tokens": t.completion_tokens,
        "ttft_s": round(t.ttft_s, 4),
        "prefill_s": round(t.prefill_s, 4),
        "decode_s": round(t.decode_s, 4),
        "total_s": round(t.total_s, 4),
        "prefill_tokens_per_s": round(t.prefill_tokens_per_s, 2),
        "decode_tokens_per_s": round(t.decode_tokens_per_s, 2),
        "threads": t.threads,
        "thread_changes": t.thread_changes,
        "drafted": t.speculation.drafted,
        "accepted": t.speculation.accepted,
    }
    return {name: values[name] for name in fields}


def result_json(
    result: Result,
    timings: Sequence[str] = TIMINGS,
    usage: Sequence[str] = ("prompt_tokens", "completion_tokens"),
) -> dict[str, Any]:
    """The one JSON form of a Result, for every edge (--json, --jsonl, the store, a server's
    timings): text, reasoning (when there is any), finish_reason, tool_calls and error (when there
    are), usage and timings (the fields each edge shows), speculation (unless off) and prompt_cache
    (when the disk tier was used). An edge may leave fields out; none renames one."""
    t = result.timings
    data: dict[str, Any] = {"text": result.text}
    if result.reasoning.strip():
        data["reasoning"] = result.reasoning.strip()
    data["finish_reason"] = result.finish_reason
    if result.tool_calls:
        data["tool_calls"] = list(result.tool_calls)
    if result.error:
        data["error"] = result.error  # why it failed, or why an interrupted answer stopped (a worker gone)
    data["usage"] = {name: getattr(t, name) for name in usage}
    data["timings"] = timings_json(t, timings)
    spec = t.speculation
    if spec.mode != "none":
        data["speculation"] = {
            "mode": spec.mode,
            "drafted": spec.drafted,
            "accepted": spec.accepted,
            "acceptance_rate": round(spec.acceptance, 4),
            "mean_accepted": round(spec.mean_accepted, 3),
            "stopped": spec.stopped,
        }
    cache = t.prompt_cache
    if cache.loaded_tokens or cache.stored_tokens:
        data["prompt_cache"] = {
            "loaded_tokens": cache.loaded_tokens,
            "stored_tokens": cache.stored_tokens,
            "write_s": round(cache.write_s, 4),
        }
    return data


def since_process_start() -> float:
    """Seconds since this process started, to one clock tick (10 ms); 0.0 where unknown.

    On Linux from the kernel's clock since boot alone: the process's start in ticks (/proc/self/stat)
    against CLOCK_BOOTTIME. psutil's create_time() adds the boot time as /proc/stat gives it, in whole
    seconds, so time.time() minus it runs long by the boot time's lost fraction: up to 1 s, 0.19 s on
    the machine that found it (every start-up figure it gave was that much too long). Elsewhere psutil.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        started = int(stat[stat.rindex(b")") + 2 :].split()[19]) / os.sysconf("SC_CLK_TCK")
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        pass
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - a figure for --verbose, never a failure
        return 0.0


@dataclass
class TextAssembler:
    """Bytes in, text out: holds a split UTF-8 character and any tail that may begin a stop string."""

    stop: Sequence[str]
    pending: str = ""
    stopped: bool = False
    matched: str | None = None  # the stop string that ended the text
    _decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))

    def push(self, data: bytes) -> tuple[str, bool]:
        self.pending += self._decoder.decode(data)
        if not self.stop:
            out, self.pending = self.pending, ""
            return out, False
        hits = [(i, s) for s in self.stop if s and (i := self.pending.find(s)) >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda hit: hit[0])
            self.stopped = True
            out, self.pending = self.pending[:at], ""
            return out, True
        hold = max((_overlap(self.pending, s) for s in self.stop), default=0)
        cut = len(self.pending) - hold
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out, False

    def flush(self) -> str:
        """What is held back; bytes of a character the model never finished are dropped, not mangled."""
        out, self.pending = self.pending, ""
        self._decoder.reset()
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of stop."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
