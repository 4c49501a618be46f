"""The flags for images and audio: the files given, a clip's bound, and the projector that takes them
(runner.projector: an mmproj GGUF, or the one pulled with the model)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

Image = Annotated[
    Optional[list[str]],
    typer.Option(
        "--image",
        metavar="FILE",
        help="An image for a vision model (repeatable; - reads it from stdin): PNG, JPEG, WebP, GIF, BMP.",
        show_default=False,
    ),
]
AudioClip = Annotated[
    Optional[list[str]],
    typer.Option(
        "--audio",
        metavar="FILE",
        help="An audio clip for a model with an audio projector (repeatable; - reads it from stdin): "
        "WAV, MP3, FLAC or Ogg Vorbis.",
        show_default=False,
    ),
]
MaxAudioSeconds = Annotated[  # default: runner.audio.MAX_AUDIO_SECONDS
    float,
    typer.Option(
        "--max-audio-seconds", min=0.01, max=86400.0, help="A clip's length at most, from its header."
    ),
]
Mmproj = Annotated[
    Optional[str],
    typer.Option(
        "--mmproj",
        metavar="FILE|REF",
        help="The model's projector for --image and --audio: an mmproj GGUF, or its Hub reference "
        "(user/repo:FILE.gguf) [default: the one pulled with MODEL].",
        show_default=False,
    ),
]
ChatMmproj = Annotated[
    Optional[str],
    typer.Option(
        "--mmproj",
        metavar="FILE|REF",
        help="The model's projector, an mmproj GGUF or its Hub reference (user/repo:FILE.gguf): /image "
        "PATH attaches an image, /audio PATH a clip [default: the one pulled with MODEL].",
        show_default=False,
    ),
]
