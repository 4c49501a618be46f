"""Where chat's messages come from: a terminal (prompt_toolkit) or a pipe (one line, one turn).

On a terminal, prompt_toolkit does the keys: line editing, a persistent history with Ctrl-R search,
completion of slash commands and of /image's file paths, bracketed paste (a pasted block of lines
arrives as one message). Ctrl-C on an empty line only says how to quit; on a line being typed it
clears the line. Ctrl-D at an empty prompt ends the chat.

Both sources take `\"\"\"` blocks: a line starting with three quotes opens one, a line ending with them
closes it, and everything between is one message.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from runner import ui
from runner.errors import UsageError

FENCE = '"""'
PROMPT = ">>> "
MORE = "... "
QUIT_HINT = "Ctrl-D, /bye or /exit to quit"
IMAGE_COMMAND = "/image "  # what Tab completes a file's path after
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")  # the files it offers


def _block(first: str, more: Callable[[], str | None]) -> str | None:
    """The message a line starts: the line itself, or a \"\"\" block read to its closing fence."""
    if not first.lstrip().startswith(FENCE):
        return first
    body = first.lstrip()[len(FENCE) :]
    if body.rstrip().endswith(FENCE) and body.strip():  # """one line"""
        return body.rstrip()[: -len(FENCE)]
    lines = [body] if body else []
    while True:
        line = more()
        if line is None:  # the input ended inside a block: what came is the message
            return "\n".join(lines) if lines else None
        if line.rstrip().endswith(FENCE):
            lines.append(line.rstrip()[: -len(FENCE)])
            return "\n".join(lines).strip("\n")
        lines.append(line)


class PipeInput:
    """Lines of a pipe or file: each one a user turn (blank lines skipped), \"\"\" blocks allowed."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def _line(self) -> str | None:
        line = self.stream.readline()
        return None if line == "" else line.rstrip("\n")

    def read(self) -> str | None:
        while True:
            line = self._line()
            if line is None:
                return None
            if line.strip():
                return _block(line, self._line)

    def edit(self) -> str | None:
        raise UsageError("/edit needs a terminal")

    def confirm(self, question: str) -> bool | None:
        """Nobody to ask through a pipe: no (a line naming an image file goes as text; /image attaches)."""
        return False


class TerminalInput:
    """prompt_toolkit's PromptSession, imported only when a chat starts on a terminal."""

    def __init__(self, history_file: Path | None, commands: Sequence[str]) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.key_binding import KeyBindings

        history: Any = InMemoryHistory()
        if history_file is not None:
            try:
                history_file.parent.mkdir(parents=True, exist_ok=True)
                history_file.touch()
                history = FileHistory(str(history_file))
            except OSError as exc:
                ui.warn(f"input history is not kept ({exc})")
        keys = KeyBindings()

        @keys.add("c-c")
        def _ctrl_c(event: Any) -> None:
            buffer = event.app.current_buffer
            if buffer.text:
                buffer.reset()  # as a shell does: the line goes, the prompt stays
            else:
                event.app.exit(exception=KeyboardInterrupt())

        completer = _completer(commands)
        self._session: Any = PromptSession(
            history=history, completer=completer, complete_while_typing=False, key_bindings=keys
        )

    def _ask(self, prompt: str) -> str | None:
        while True:
            try:
                return str(self._session.prompt(prompt))
            except EOFError:
                return None
            except KeyboardInterrupt:
                ui.info(QUIT_HINT)

    def read(self) -> str | None:
        while True:
            line = self._ask(PROMPT)
            if line is None:
                return None
            if line.strip():
                return _block(line, lambda: self._ask(MORE))

    def confirm(self, question: str) -> bool | None:
        """A yes-or-no question on a prompt line of its own, kept out of the input history: Enter or y
        is yes, anything else no; Ctrl-C or Ctrl-D: None (neither: the line is dropped)."""
        from prompt_toolkit import prompt

        try:
            answer = str(prompt(question))
        except (EOFError, KeyboardInterrupt):
            return None
        return answer.strip().lower() in ("", "y", "yes")

    def edit(self) -> str | None:
        """The next message, written in $VISUAL or $EDITOR (vi if neither is set)."""
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
        with tempfile.NamedTemporaryFile("w+", suffix=".md", delete=False, encoding="utf-8") as f:
            path = Path(f.name)
        try:
            try:
                done = subprocess.run([*shlex.split(editor), str(path)], check=False)
            except OSError as exc:
                raise UsageError(f"cannot start the editor {editor!r}: {exc}") from exc
            if done.returncode != 0:
                raise UsageError(f"the editor {editor!r} exited with {done.returncode}; nothing sent")
            text = path.read_text(encoding="utf-8", errors="replace").strip()
        finally:
            path.unlink(missing_ok=True)
        return text or None


def _completer(commands: Sequence[str]) -> Any:
    """Tab completes a slash command's name, and after `/image ` the path of an image file (or of a
    folder on the way to one)."""
    from prompt_toolkit.completion import Completer, PathCompleter, WordCompleter
    from prompt_toolkit.document import Document

    names = [IMAGE_COMMAND if c == IMAGE_COMMAND.strip() else c for c in commands]  # the path goes next
    words = WordCompleter(names, sentence=True, match_middle=False)
    paths = PathCompleter(
        expanduser=True, file_filter=lambda name: os.path.isdir(name) or name.lower().endswith(IMAGE_SUFFIXES)
    )

    class ChatCompleter(Completer):
        def get_completions(self, document: Any, event: Any) -> Any:
            before = document.text_before_cursor
            if before.lower().startswith(IMAGE_COMMAND):
                path = before[len(IMAGE_COMMAND) :].lstrip()
                yield from paths.get_completions(Document(path, len(path)), event)
            else:
                yield from words.get_completions(document, event)

    return ChatCompleter()
