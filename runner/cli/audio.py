"""The command that turns audio into text: transcribe (runner.commands.transcribe)."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from runner.cli import media_options as m
from runner.cli import options as o
from runner.cli.app import app, edge

AudioFiles = Annotated[
    list[str],
    typer.Argument(
        help="Audio files to transcribe: WAV, MP3, FLAC, Ogg Vorbis (- reads one from stdin).",
        show_default=False,
    ),
]
Language = Annotated[
    Optional[str],
    typer.Option(
        "--language", help="The clip's language (e.g. en, fr), added to the prompt.", show_default=False
    ),
]
Hint = Annotated[
    Optional[str],
    typer.Option(
        "--prompt",
        help='The text asked before the clip [default: llama-server\'s "Transcribe audio to text"].',
        show_default=False,
    ),
]
Greedy = Annotated[float, typer.Option("--temperature", min=0.0, max=2.0, help="Sampling temperature.")]


@app.command(no_args_is_help=True)
@edge
def transcribe(
    model: o.ModelArg,
    files: AudioFiles,
    mmproj: m.Mmproj = None,
    language: Language = None,
    prompt: Hint = None,
    temperature: Greedy = 0.0,
    max_tokens: o.MaxTokens = None,
    max_audio_seconds: m.MaxAudioSeconds = 600.0,
    json: o.JsonObject = False,
    jsonl: o.Jsonl = False,
    ctx: o.Ctx = None,
    threads: o.Threads = None,
    debug: o.Debug = False,
) -> None:
    """Transcribe audio files; the text alone goes to stdout.

    WAV, MP3, FLAC or Ogg Vorbis. One file: its text. Several: path<TAB>text lines, or --jsonl.

    \b
    Examples:
      runner transcribe ggml-org/ultravox-v0_5-llama-3_2-1b-GGUF note.wav
      runner transcribe MODEL a.wav b.wav --jsonl
      arecord -f S16_LE -r 16000 -d 5 | runner transcribe MODEL - --mmproj mmproj.gguf
    """
    from runner.commands.transcribe import TranscribeRequest
    from runner.commands.transcribe import transcribe as run_transcribe
    from runner.settings import LoadSettings

    settings = LoadSettings.from_flags(None, "none", ctx=ctx, threads=threads, mmproj=mmproj, debug=debug)
    request = TranscribeRequest(
        model=model,
        files=tuple(files),
        language=language,
        prompt=prompt,
        temperature=temperature,
        max_tokens=max_tokens,
        max_seconds=max_audio_seconds,
        as_json=json,
        jsonl=jsonl,
        settings=settings,
    )
    stdin = None if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer
    raise typer.Exit(run_transcribe(request, stdin=stdin, out=sys.stdout))
