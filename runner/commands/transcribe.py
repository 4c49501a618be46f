"""`runner transcribe MODEL FILE...`: each audio file's text on stdout, for pipes and scripts.

One file: its text. Several: `path<TAB>text` lines (a tab or a newline in a text written as \\t and
\\n), or with --jsonl one JSON object a file. --json: one file's object with its duration, tokens and
timings. The prompt is llama-server's ASR prompt (common_chat_get_asr_prompt: "Transcribe audio to
text", `(language: X)` added for --language, --prompt in its place), the clip after it, in a user
message with no system message, as llama-server's /v1/audio/transcriptions asks; greedy unless
--temperature says otherwise. Every file is read and checked before the model loads (runner.audio);
each one is then a Request through the engine's one loop, as `run --audio` is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, TextIO

from runner.engine.prompt import render_prompt
from runner.engine.request import Request
from runner.engine.text.template import Message
from runner.errors import UsageError
from runner.loader import LoadedModel, open_model
from runner.settings import DEFAULTS, LoadSettings

ASR_PROMPT = "Transcribe audio to text"  # llama-server's common_chat_get_asr_prompt
MAX_FILES = 1000


@dataclass(frozen=True)
class TranscribeRequest:
    model: str
    files: tuple[str, ...]
    language: str | None = None
    prompt: str | None = None  # a hint in place of the ASR prompt, as Whisper's API takes one
    temperature: float = 0.0
    max_tokens: int | None = None  # None: until the model ends (a loop stops it), or the context is full
    as_json: bool = False
    jsonl: bool = False
    max_seconds: float = 600.0  # a clip's length at most (--max-audio-seconds), from its header
    settings: LoadSettings = DEFAULTS


def asr_prompt(prompt: str | None, language: str | None) -> str:
    """The user text before the clip: the hint given, or the ASR prompt, and the language asked."""
    text = prompt if prompt else ASR_PROMPT
    return f"{text} (language: {language})" if language else text


def transcribe(request: TranscribeRequest, *, stdin: Any, out: TextIO) -> int:
    """Read every file, load the model with its audio projector, answer each file; exit code 0."""
    from runner.commands.attach import read_clips

    if not request.files:
        raise UsageError("transcribe takes one audio file or more (- reads one from stdin)")
    if len(request.files) > MAX_FILES:
        raise UsageError(f"{len(request.files)} files: at most {MAX_FILES} a command")
    if request.as_json and len(request.files) > 1:
        raise UsageError("--json is one file's object: give one file, or --jsonl for several")
    if request.files.count("-") > 1:
        raise UsageError("- reads stdin once: give one clip that way")
    clips = [read_clips((f,), stdin, max_seconds=request.max_seconds)[0] for f in request.files]
    loaded = open_model(request.model, replace(request.settings, images=True))
    try:
        if loaded.engine.vision is None or not loaded.engine.vision.hears:
            raise UsageError(
                f"{loaded.name}'s projector takes no audio: give an audio projector with --mmproj"
            )
        for name, clip in zip(request.files, clips, strict=True):
            result = _one(loaded, request, clip)
            _write(out, request, name, clip, result, len(request.files))
            out.flush()
    finally:
        loaded.close()
    return 0


def _one(loaded: LoadedModel, request: TranscribeRequest, clip: Any) -> Any:
    from runner.engine.text.sampling import SamplingConfig

    text = asr_prompt(request.prompt, request.language) + loaded.engine.markers(1)
    rendered = render_prompt(loaded.engine, loaded.header, [Message("user", text)], quiet=True, images=[clip])
    loaded.engine.context.check_fits(rendered.tokens, request.max_tokens)
    sampling = SamplingConfig(temperature=request.temperature)
    return loaded.engine.answer(Request(rendered, sampling, max_tokens=request.max_tokens))


def _write(out: TextIO, request: TranscribeRequest, name: str, clip: Any, result: Any, n: int) -> None:
    text = result.text.strip()
    if request.as_json or request.jsonl:
        from runner.engine.answer import result_json

        timings = ("ttft_s", "prefill_tokens_per_s", "decode_tokens_per_s", "total_s")
        obj = {"file": name, "duration_s": round(clip.seconds, 3), **result_json(result, timings)}
        obj["text"] = text
        if result.timings.total_s > 0:  # seconds of audio a second of wall time
            obj["real_time_factor"] = round(clip.seconds / result.timings.total_s, 2)
        out.write(json.dumps(obj, ensure_ascii=False) + "\n")
    elif n == 1:
        out.write(text + "\n")
    else:
        escaped = text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
        out.write(f"{name}\t{escaped}\n")
