"""What the commands that answer (run, chat) print, in one place: the answer streamed to stdout with any
reasoning kept apart, the sampling with where each value came from, and the --verbose reports.

Not a command itself: run and chat both use it (the layer contract keeps commands from importing
each other).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, TextIO

from runner import interrupt, ui
from runner.engine import rpc
from runner.engine.answer import FINISH_INTERRUPTED, FINISH_LENGTH, FINISH_STOP, Result, Timings, result_json
from runner.engine.llamacpp import supports_gpu_offload
from runner.engine.logprobs import TokenLogprob
from runner.engine.promptcache import CacheUse, PromptCache
from runner.engine.request import Request
from runner.engine.speculate import SpecStats
from runner.engine.text.constrain import CUT_SHORT, ConstraintError
from runner.engine.text.reasoning import ANSWER
from runner.engine.text.sampling import SamplingConfig, catalog_defaults, resolve_sources
from runner.limits import flash_attn_name
from runner.loader import LoadedModel

LOOP_WARNING = (  # FINISH_REPEAT: an answer with no limit that went round in a loop
    "the answer went round in a loop (the same tokens over and over) and was stopped there; "
    "--max-tokens N lets it run to N tokens"
)


# what --json's "timings" shows of runner.engine.answer.TIMINGS
RUN_TIMINGS = (
    "startup_s",
    "load_s",
    "ttft_s",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "total_s",
    "threads",
    "thread_changes",
)


def sampling_for(loaded: LoadedModel, overrides: dict[str, Any]) -> tuple[SamplingConfig, dict[str, str]]:
    """Flags (or /set) > the GGUF's general.sampling.* keys > the catalog's recommendation > llama.cpp."""
    catalog = {}
    if loaded.entry is not None and loaded.entry.sampling:
        catalog = catalog_defaults(dict(loaded.entry.sampling), f"models.toml [models.{loaded.entry.name}]")
    return resolve_sources(loaded.header.metadata, overrides, catalog=catalog)


def describe_sampling(config: SamplingConfig, sources: dict[str, str]) -> str:
    return ", ".join(f"{name}={getattr(config, name)} ({sources[name]})" for name in sources)


class AnswerWriter:
    """The answer to `out` as it comes; reasoning dimmed there when it is a terminal, else on stderr
    (so a pipe gets the answer alone), or nowhere (hide). `quiet`: print nothing (--json gathers)."""

    def __init__(
        self, out: TextIO, *, hide_reasoning: bool = False, quiet: bool = False, markdown: bool = False
    ) -> None:
        self.out = out
        self.hide_reasoning = hide_reasoning or quiet
        self.quiet = quiet
        self.tty = _isatty(out)
        self._markdown = ui.markdown_stream(out) if markdown and self.tty and not quiet else None
        width = _columns(out) if self.tty and self._markdown is None else 0
        self._wrap = ui.WordWrap(out, width) if width else None  # a terminal breaks lines inside words
        self._update: Any = None
        self._answer: list[str] = []  # for the Markdown view only, which redraws it whole
        self._last: dict[int, str] = {}  # stream id -> the last character written there
        self._reasoned = False
        self.lost: OSError | None = None  # the output went away mid-answer: nothing more is written

    def __enter__(self) -> AnswerWriter:
        if self._markdown is not None:
            self._update = self._markdown.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._markdown is not None:
            self._markdown.__exit__(*exc)

    def write(self, kind: str, text: str) -> None:
        if not text or self.quiet:
            return
        if kind == ANSWER:
            if self._reasoned and self.tty and self._update is None:
                self._put(self.out, "\n\n" if self._last.get(id(self.out)) != "\n" else "\n")
                self._reasoned = False
            if self._update is not None:
                self._answer.append(text)
                self._update("".join(self._answer))
            else:
                self._put(self.out, text)
            return
        if self.hide_reasoning:
            return
        self._reasoned = True
        if self.tty:
            self._put(self.out, text, dim=True)
        else:
            self._put(sys.stderr, text)

    def end(self) -> None:
        """End the lines this answer left open."""
        for stream in (sys.stderr, self.out):
            if self._last.get(id(stream), "\n") != "\n":
                self._put(stream, "\n")

    def _put(self, stream: TextIO, text: str, *, dim: bool = False) -> None:
        """A write a reader that went away fails (EPIPE, EIO) stops the answer and keeps what came
        (runner.interrupt.output_lost), where its OSError would have lost the answer."""
        if self.lost is not None:
            return
        try:
            if stream is self.out and self._wrap is not None:
                self._wrap.write(text, dimmed=dim)
            else:
                stream.write(ui.dim(text) if dim else text)
                stream.flush()
        except OSError as exc:
            self.lost = exc
            interrupt.output_lost(exc)
            return
        self._last[id(stream)] = text[-1]


def stream_answer(
    loaded: LoadedModel,
    request: Request,
    writer: AnswerWriter,
    *,
    prompt_cache: PromptCache | None = None,
    if_lost: Callable[[Result], None] | None = None,
) -> Result:
    """What run and chat answer with: the engine's one loop for one request, reasoning split from the
    answer there, written as it comes. `prompt_cache`: see Engine.stream. `if_lost`: given what came
    so far (finish_reason "interrupted", `result.error` saying why) if a worker goes away mid-answer,
    on ggml's thread, just before the process ends (runner.engine.rpc.if_lost)."""
    answer: list[str] = []
    reasoning: list[str] = []
    generated = [0]
    last = None

    shown = threading.Lock()  # held from keeping a piece to writing it: what is kept is what was shown

    def so_far(why: str) -> Result:
        # on ggml's thread, while the main thread may be between a piece and its write: let the write
        # end, then keep the lock, so nothing more is written before the process ends (a write that a
        # reader who stopped reading blocks is waited for 2 s at most)
        shown.acquire(timeout=2)
        timings = Timings(prompt_tokens=len(request.prompt.tokens), completion_tokens=generated[0])
        return Result("".join(answer), FINISH_INTERRUPTED, timings, reasoning="".join(reasoning), error=why)

    # only an answer over workers (--rpc) can lose one, and only it pays for keeping what came when it
    # does: the count of tokens, the hook, the lock (a token costs ~0.4 ms on a tiny model: it shows)
    devices = loaded.plan.estimate.devices
    workers = if_lost is not None and any(d.device not in ("cpu", "gpu") for d in devices)
    watched = rpc.if_lost(lambda why: if_lost(so_far(why))) if workers and if_lost else nullcontext()
    counted = (lambda _token: generated.__setitem__(0, generated[0] + 1)) if workers else None
    with watched:
        for chunk in loaded.engine.stream(request, prompt_cache=prompt_cache, on_token=counted):
            if not chunk.text:
                last = chunk
            elif workers:
                with shown:
                    (answer if chunk.kind == ANSWER else reasoning).append(chunk.text)
                    writer.write(chunk.kind, chunk.text)
                last = chunk
            else:
                writer.write(chunk.kind, chunk.text)
                last = chunk
    assert last is not None and last.result is not None
    return last.result


def shape_problem(result: Result) -> str | None:
    """How an answer fails the --format/--schema its request asked for (runner.engine.request.finish
    found it), said with the flag that gives a cut answer room; None where it holds."""
    if result.invalid is None:
        return None
    cut = result.finish_reason != FINISH_STOP and result.invalid.endswith(CUT_SHORT)
    return result.invalid + ("; raise --max-tokens (or --ctx) for a longer answer" if cut else "")


def shaped(result: Result) -> str:
    """A constrained answer as it goes out: its text, trimmed; ConstraintError (exit 1) where it is
    not the shape asked for, so a script never reads half a JSON."""
    problem = shape_problem(result)
    if problem is not None:
        raise ConstraintError(problem)
    return result.text.strip()


def logprobs_json(engine: Any, scored: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """--logprobs in --json: each answer token's text, id and log-probability, with its alternatives."""

    def token(t: int, logprob: float) -> dict[str, Any]:
        return {"token": engine.model.token_bytes(t).decode("utf-8", "replace"), "id": t, "logprob": logprob}

    return [{**token(s.token, s.logprob), "top_logprobs": [token(t, lp) for t, lp in s.top]} for s in scored]


def to_json(model: str, result: Result) -> dict[str, Any]:
    """run --json (and run -c --json): the model as typed, then the answer's one JSON form; where the
    model thought, its timings count the reasoning's tokens apart."""
    data = {"model": model, **result_json(result, RUN_TIMINGS)}
    if result.timings.reasoning_tokens:
        data["timings"]["reasoning_tokens"] = result.timings.reasoning_tokens
    return data


def open_prompt_cache(enabled: bool, size: str | None) -> PromptCache | None:
    """The prompt cache run and chat use (runner.engine.promptcache), or None with --no-prompt-cache;
    a bad --prompt-cache-size is refused before anything loads."""
    from runner.engine import promptcache

    limit = promptcache.parse_size(size) if size is not None else promptcache.DEFAULT_LIMIT
    if not enabled or limit == 0:
        return None
    return promptcache.PromptCache(promptcache.folder(), limit, ui.warn)


def describe_prompt_cache(use: CacheUse) -> str:
    if use.loaded_tokens:
        return f" · {use.loaded_tokens:,} prompt tokens from the prompt cache"
    if use.stored_tokens:
        return (
            f" · {use.stored_tokens:,} prompt tokens stored in the prompt cache ({use.write_s * 1000:.0f} ms)"
        )
    return ""


def describe_speculation(spec: SpecStats) -> str:
    """One line part: how speculation went, or "" when it was off."""
    if spec.mode == "none":
        return ""
    if not spec.steps:
        return f" · spec {spec.mode}: nothing drafted"
    stopped = ", then off: it did not pay" if spec.stopped else ""
    return (
        f" · spec {spec.mode}: {spec.accepted}/{spec.drafted} drafts kept ({spec.acceptance:.0%}), "
        f"{spec.mean_accepted:.1f} per batch{stopped}"
    )


def describe_model(loaded: LoadedModel) -> str:
    """The model as typed and the file it is, each once: a path typed is the file itself."""
    try:
        typed_path = Path(loaded.name).expanduser().resolve() == loaded.path.resolve()
    except (OSError, ValueError):
        typed_path = False
    return str(loaded.path) if typed_path else f"{loaded.name} ({loaded.path})"


def describe_load(loaded: LoadedModel, *, model: bool = True) -> str:
    """How the model was loaded, on one line; model=False: without the model itself (/show has a row)."""
    engine = loaded.engine
    workers = [d.device for d in loaded.plan.estimate.devices if d.device not in ("cpu", "gpu")]
    if workers and engine.model.n_gpu_layers:
        layers = "all layers" if engine.model.n_gpu_layers < 0 else f"{engine.model.n_gpu_layers} layers"
        offload = f"{layers} across the workers {', '.join(workers)}"
    elif not supports_gpu_offload():
        offload = "CPU only (this llama.cpp build cannot offload; see the README for a GPU build)"
    else:
        offload = (
            "all layers on the GPU"
            if engine.model.n_gpu_layers < 0
            else f"{engine.model.n_gpu_layers} layers on the GPU"
        )
    fa = f"flash attention {flash_attn_name(engine.context.flash_attn)}"
    # --ctx means a sequence's context everywhere: the total beside it where sequences share one
    ctx = f"ctx {engine.context.n_ctx}"
    if engine.context.n_seq > 1:
        ctx = f"ctx {engine.context.n_ctx_seq} a sequence ({engine.context.n_ctx} in all)"
    load = f"{ctx} · KV {engine.context.kv_type} · {fa} · threads {engine.context.threads.n} · {offload}"
    return f"{describe_model(loaded)} · {load}" if model else load


def describe_timings(result: Result) -> str:
    t: Timings = result.timings
    reason = result.finish_reason + (" (context full)" if result.context_full else "")
    if result.finish_reason == FINISH_LENGTH and not result.context_full:
        reason += " (--max-tokens)"
    return (
        f"start-up {t.startup_s:.2f} s · load {t.load_s:.2f} s · prompt {t.prompt_tokens} tokens · "
        f"ttft {t.ttft_s:.3f} s · "
        f"prefill {t.prefill_tokens_per_s:.1f} tok/s · generated {t.completion_tokens} tokens · "
        f"decode {t.decode_tokens_per_s:.1f} tok/s{describe_threads(t)} · finish {reason}"
        f"{describe_speculation(t.speculation)}{describe_prompt_cache(t.prompt_cache)}"
    )


def describe_threads(t: Timings) -> str:
    """' on N threads', and how often the count changed, when it did (runner.engine.threads)."""
    if not t.threads:
        return ""
    changed = f", changed {t.thread_changes}x" if t.thread_changes else ""
    return f" on {t.threads} thread{'s' if t.threads != 1 else ''}{changed}"


def _columns(stream: TextIO) -> int:
    """The terminal's width, or 0 when it cannot be told."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
