"""Images in a chat: `/image PATH` (or a path pasted alone on a line, once the user says yes) attaches
an image to the next message; the images a conversation's messages carried are read again from their
files when it is resumed or loaded.

A kept message holds each image's sha256, size and path (runner.images.ImageRef), never its bytes. So a
resumed conversation reads each file again and checks its sha256: an image gone or changed since is
said once, and the message that carried it goes on without it (text only). The pixels come through
runner.images (Pillow, bounded) as `run --image`'s do, and reach the model the same way
(runner.engine.conversation.fit puts each message's images before its text).
`runner run -c PROMPT --image FILE` attaches its files the same way, to the turn it adds.
Not a command itself: a helper of session.py, slash.py and chat.py.
"""

from __future__ import annotations

import io
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from runner import ui
from runner.audio import AUDIO_SUFFIXES
from runner.commands.lineinput import IMAGE_SUFFIXES
from runner.errors import AudioError, ImageError, UsageError
from runner.images import MAX_IMAGES, Image, ImageRef, load_image, read_image_arg
from runner.store import StoredMessage

NO_PROJECTOR = "/image needs the model's vision projector: start the chat with --mmproj FILE"
NO_PROJECTOR_C = "--image needs the model's vision projector: give --mmproj FILE"  # run -c


def read_attachments(args: Sequence[str]) -> list[tuple[Path, Image]]:
    """/image's and `run -c --image`'s files, each read, decoded and checked now (a bad one:
    ImageError), by absolute path: a message keeps the path, and a resumed chat reads it again."""
    if len(args) > MAX_IMAGES:
        raise UsageError(f"{len(args)} images: at most {MAX_IMAGES} a message")
    read = []
    for arg in args:
        path = Path(arg).expanduser().absolute()
        image = read_image_arg(str(path), io.BytesIO())  # an absolute path: never "-", stdin
        for warning in image.warnings:
            ui.warn(warning)
        read.append((path, image))
    return read


MAX_CLIPS = 8  # audio clips in one prompt


def read_clips(
    args: Sequence[str], stdin: Any, *, images: Sequence[str] = (), max_seconds: float | None = None
) -> list[Any]:
    """`run --audio`'s clips (- : stdin), each read, decoded and bounded now (runner.audio: WAV; a bad
    one is an AudioError), before any model loads."""
    from runner.audio import read_audio_arg

    if len(args) > MAX_CLIPS:
        raise UsageError(f"{len(args)} audio clips: at most {MAX_CLIPS} a prompt")
    if list(args).count("-") + list(images).count("-") > 1:
        raise UsageError("- reads stdin once: give one image or clip that way")
    from runner.audio import MAX_AUDIO_SECONDS

    return [read_audio_arg(arg, stdin, max_seconds=max_seconds or MAX_AUDIO_SECONDS) for arg in args]


def row_clips(names: Any, max_seconds: float | None = None) -> list[Any]:
    """An --input row's "audio": local WAV files (as --audio takes them, no stdin), decoded and bounded."""
    if not isinstance(names, list) or not all(isinstance(n, str) and n not in ("", "-") for n in names):
        raise UsageError('"audio" must be a list of audio file paths')
    return read_clips(names, None, max_seconds=max_seconds)


class Attachments:
    """The images attached to the next message, and those the conversation's messages carried, decoded
    (by sha256: the same bytes are the same image, whatever the file's name)."""

    def __init__(self, engine: Any, max_audio_seconds: float = 600.0) -> None:
        self.engine = engine
        self.max_audio_seconds = max_audio_seconds  # a clip's length at most (--max-audio-seconds)
        self.pending: list[ImageRef] = []
        self._decoded: dict[str, Any] = {}  # Image or Audio; None: gone or changed since it was attached

    @property
    def vision(self) -> bool:
        return self.engine.vision is not None

    def attach(self, arg: str) -> None:
        """/image PATH: the file read, decoded and checked now (a bad one: ImageError, nothing attached).
        An image already attached (the same bytes, whatever the file's name) is not attached twice: said."""
        if not self.vision:
            raise UsageError(NO_PROJECTOR)
        if not arg:
            raise UsageError("/image PATH attaches an image to the next message (/image none drops them)")
        if len(self.pending) >= MAX_IMAGES:
            raise UsageError(f"at most {MAX_IMAGES} images a message: send it first (/image none drops them)")
        if is_audio_file(arg):
            self._attach_clip(arg)
            return
        [(path, image)] = read_attachments((arg,))
        same = next((r for r in self.pending if r.sha256 == image.sha256), None)
        if same is not None:
            named = "" if Path(same.path) == path else f" (as {Path(same.path).name}: the same image)"
            ui.info(f"{path.name} is already attached{named}; it goes once with your next message")
            return
        self.add(path, image)
        ui.info(
            f"attached {path.name} ({image.width}x{image.height}, {ui.count(image.size, 'byte')}): "
            "it goes with your next message"
        )

    def _attach_clip(self, arg: str) -> None:
        """/audio PATH (or a WAV given to /image, or pasted): the clip read, decoded and checked now,
        kept by its path and sha256 as an image is (an AudioError: nothing attached)."""
        from runner.audio import read_audio_arg

        if not self.engine.vision.hears:
            raise UsageError(
                f"{self.engine.vision.projector.name} takes no audio: start the chat with an audio --mmproj"
            )
        path = Path(arg).expanduser().absolute()
        clip = read_audio_arg(str(path), None, max_seconds=self.max_audio_seconds)
        if any(r.sha256 == clip.sha256 for r in self.pending):
            ui.info(f"{path.name} is already attached; it goes once with your next message")
            return
        self._decoded[clip.sha256] = clip
        self.pending.append(ImageRef(clip.sha256, clip.size, str(path)))
        ui.info(f"attached {path.name} ({clip.seconds:.1f} s of audio): it goes with your next message")

    def add(self, path: Path, image: Image) -> None:
        """An image read_attachments read, for the next message (kept by its path and sha256)."""
        self._decoded[image.sha256] = image
        self.pending.append(ImageRef(image.sha256, image.size, str(path)))

    def show(self) -> str:
        """/image alone: what the next message will carry."""
        if not self.pending:
            return "no image attached; /image PATH attaches one to the next message"
        return "the next message carries " + ", ".join(Path(r.path).name for r in self.pending)

    def drop(self) -> None:
        """/image none: the next message carries none."""
        ui.info(f"dropped {ui.count(len(self.pending), 'image')}" if self.pending else "no image attached")
        self.pending.clear()

    def tool_images(self, images: Sequence[tuple[str, bytes]], tool: str) -> tuple[tuple[ImageRef, ...], str]:
        """Images a tool returned, for a vision model: each decoded (untrusted bytes, bounded as any
        image), kept as a file of runner's data folder (a resumed chat reads it again, as it reads an
        attached one) and referred to by the tool's message; a note for each one that is not."""
        from runner.paths import data_dir

        refs, notes = [], ""
        for n, (mime, data) in enumerate(images, start=1):
            try:
                image = load_image(data, name=f"{tool}'s image {n}")
            except ImageError as exc:
                notes += f"\n[the tool returned an image that cannot be shown: {exc}]"
                continue
            folder = data_dir() / "tool-images"
            path = folder / f"{image.sha256}.{image.format.lower()}"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            except OSError as exc:
                notes += f"\n[the tool returned an image ({mime}) that could not be kept: {exc.strerror}]"
                continue
            self._decoded[image.sha256] = image
            refs.append(ImageRef(image.sha256, image.size, str(path)))
        return tuple(refs), notes

    def images_for(self, turns: Sequence[StoredMessage]) -> list[list[Image]]:
        """Each turn's images, decoded (read again where not yet); none without a projector."""
        if not self.vision:
            return [[] for _ in turns]
        return [[i for i in map(self._image, t.images) if i is not None] for t in turns]

    def resumed(self, turns: Sequence[StoredMessage]) -> None:
        """A resumed or loaded conversation: which images it referred to, each read again if still there."""
        refs = list({r.sha256: r for t in turns for r in t.images}.values())
        if not refs:
            return
        said = f"this conversation refers to {ui.count(len(refs), 'image')}"
        if not self.vision:
            names = ", ".join(Path(r.path).name for r in refs)
            ui.info(f"{said} ({names}); without a projector they are not sent (--mmproj FILE sends them)")
            return
        problems = {r.sha256: self._read(r) for r in refs if r.sha256 not in self._decoded}
        states = [
            f"{Path(r.path).name} ({'not sent' if problems.get(r.sha256) else 'read again'})" for r in refs
        ]
        ui.info(f"{said}: {', '.join(states)}")
        for problem in filter(None, problems.values()):
            ui.warn(problem)

    def _image(self, ref: ImageRef) -> Image | None:
        if ref.sha256 not in self._decoded:
            problem = self._read(ref)
            if problem:
                ui.warn(problem)
        return self._decoded[ref.sha256]

    def _read(self, ref: ImageRef) -> str | None:
        """An image a message carried, read from its file again and decoded; what is wrong, if it is
        gone or changed since (it is then left out: the message goes on text only)."""
        self._decoded[ref.sha256] = None
        without = "the message that carried it goes on without it (text only)"
        try:
            if is_audio_file(ref.path):  # a clip: kept as an image is, read again by runner.audio
                from runner.audio import read_audio_arg

                image: Any = read_audio_arg(ref.path, None, max_seconds=self.max_audio_seconds)
            else:
                image = read_image_arg(ref.path, io.BytesIO())
        except (ImageError, AudioError) as exc:
            return f"{exc}; {without}"
        if image.sha256 != ref.sha256:
            return f"{ref.path}: changed since it was attached (its sha256 differs); {without}"
        self._decoded[ref.sha256] = image
        return None


def pasted_path(line: str) -> Path | None:
    """The image file a line names, when the line is nothing else: a path as typed, quoted or with
    backslashed spaces (as terminals paste a dragged file), or a file:// URL; None for anything else."""
    text = line.strip()
    if not text or "\n" in text or len(text) > 4096:
        return None
    candidates = [text]
    try:
        words = shlex.split(text)
    except ValueError:
        words = []
    if len(words) == 1:
        candidates.append(words[0])
    if text.startswith("file://"):
        candidates.append(unquote(urlparse(text).path))
    for candidate in candidates:
        path = Path(candidate).expanduser()
        if path.suffix.lower() in (*IMAGE_SUFFIXES, *AUDIO_SUFFIXES) and path.is_file():
            return path
    return None


def is_audio_file(arg: str) -> bool:
    """A file to read as audio: a WAV by its first bytes, or another audio format by its name (the
    audio reader refuses it by name then); anything else is read as an image."""
    path = Path(arg).expanduser()
    if path.suffix.lower() in AUDIO_SUFFIXES:
        return True
    try:
        with path.open("rb") as f:
            head = f.read(12)
    except OSError:
        return False
    return head[:4] == b"RIFF" and head[8:12] == b"WAVE"
