"""`runner run`: one prompt in, one answer out, streamed to stdout or reported as JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TextIO

from runner import ui
from runner.engine.engine import FINISH_LENGTH, Result, Timings, supports_gpu_offload
from runner.engine.prompt import prompt_tokens, read_prompt
from runner.engine.sampling import resolve as resolve_sampling
from runner.errors import UsageError
from runner.loader import LoadedModel, open_model


@dataclass(frozen=True)
class RunRequest:
    model: str
    prompt: str | None
    system: str | None = None
    raw: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)  # flag values, None = not given
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    ctx: int | None = None
    threads: int | None = None
    gpu_layers: int | None = None
    kv_type: str | None = None
    force: bool = False
    offline: bool = False
    as_json: bool = False
    verbose: bool = False
    debug: bool = False


def run_once(request: RunRequest, *, stdin: BinaryIO | None, out: TextIO) -> Result:
    if request.max_tokens is not None and request.max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1 (got {request.max_tokens})")
    if any(not s for s in request.stop):
        raise UsageError("--stop needs a non-empty string")
    prompt = read_prompt(request.prompt, stdin)
    loaded = open_model(
        request.model,
        ctx=request.ctx,
        threads=request.threads,
        gpu_layers=request.gpu_layers,
        kv_type=request.kv_type,
        force=request.force,
        offline=request.offline,
        debug=request.debug,
    )
    try:
        sampling = resolve_sampling(loaded.header.metadata, request.sampling)
        tokens = prompt_tokens(loaded.engine, loaded.header, prompt, system=request.system, raw=request.raw)
        loaded.engine.check_fits(tokens, request.max_tokens)
        if request.verbose:
            ui.info(describe_load(loaded))
            ui.info(f"sampling: {sampling.describe()}")
        parts: list[str] = []
        for chunk in loaded.engine.stream(tokens, sampling, max_tokens=request.max_tokens, stop=request.stop):
            parts.append(chunk.text)
            if not request.as_json and chunk.text:
                out.write(chunk.text)
                out.flush()
            last = chunk
        assert last.finish_reason is not None and last.timings is not None
        result = Result("".join(parts), last.finish_reason, last.timings, last.context_full)
    finally:
        loaded.close()
    if request.as_json:
        out.write(json.dumps(to_json(loaded.name, result), ensure_ascii=False) + "\n")
    elif result.text and not result.text.endswith("\n"):
        out.write("\n")
    out.flush()
    if result.context_full:
        ui.warn(
            f"the answer stopped at the context limit ({loaded.engine.n_ctx} tokens); raise --ctx for more"
        )
    if request.verbose:
        ui.info(describe_timings(result))
    return result


def to_json(model: str, result: Result) -> dict[str, Any]:
    t = result.timings
    return {
        "model": model,
        "text": result.text,
        "finish_reason": result.finish_reason,
        "usage": {"prompt_tokens": t.prompt_tokens, "completion_tokens": t.completion_tokens},
        "timings": {
            "load_s": round(t.load_s, 4),
            "ttft_s": round(t.ttft_s, 4),
            "prefill_tokens_per_s": round(t.prefill_tokens_per_s, 2),
            "decode_tokens_per_s": round(t.decode_tokens_per_s, 2),
            "total_s": round(t.load_s + t.total_s, 4),
        },
    }


def describe_load(loaded: LoadedModel) -> str:
    engine = loaded.engine
    where = str(loaded.path) if loaded.name == str(loaded.path) else f"{loaded.name} ({loaded.path})"
    if not supports_gpu_offload():
        offload = "CPU only (this llama.cpp build cannot offload; see the README for a GPU build)"
    else:
        offload = (
            "all layers on the GPU" if engine.n_gpu_layers < 0 else f"{engine.n_gpu_layers} layers on the GPU"
        )
    return f"{where} · ctx {engine.n_ctx} · KV {engine.kv_type} · threads {engine.n_threads} · {offload}"


def describe_timings(result: Result) -> str:
    t: Timings = result.timings
    reason = result.finish_reason + (" (context full)" if result.context_full else "")
    if result.finish_reason == FINISH_LENGTH and not result.context_full:
        reason += " (--max-tokens)"
    return (
        f"load {t.load_s:.2f} s · prompt {t.prompt_tokens} tokens · ttft {t.ttft_s:.3f} s · "
        f"prefill {t.prefill_tokens_per_s:.1f} tok/s · generated {t.completion_tokens} tokens · "
        f"decode {t.decode_tokens_per_s:.1f} tok/s · finish {reason}"
    )
