"""The only module that knows rich: messages, progress, tables, and an answer streamed to a terminal
(its words wrapped whole, or its Markdown drawn as it grows).

Messages and progress go to stderr: stdout belongs to the answer. The exceptions write a command's
answer to the stream they are given: table_to (a table), WordWrap and markdown_stream (an answer).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TextIO

PREFIX = "runner: "
REDRAWS_PER_S = 8  # a Markdown answer is drawn again at most this often while it streams
_stamped = False  # each message begins with when it was written (a server's log: stamp_messages)


@lru_cache(maxsize=1)
def console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def echo(text: str) -> None:
    """Plain text on stderr, as is (a table that goes with a message)."""
    console().print(_escape(text))


def stamp_messages(on: bool = True) -> None:
    """From now on each message begins with the moment it was written, ISO 8601 in UTC to the
    millisecond (2026-12-06T07:31:02.514Z): what a server's log needs, and a command's does not."""
    global _stamped
    _stamped = on


def _head() -> str:
    if not _stamped:
        return PREFIX
    now = time.time()
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(now))}.{int(now % 1 * 1000):03d}Z {PREFIX}"


def info(message: str) -> None:
    console().print(f"[dim]{_head()}[/]{_escape(message)}")


def faint(text: str) -> None:
    """Text shown dimmed on stderr, as is: what was said before (a resumed chat's last turns)."""
    console().print(f"[dim]{_escape(text)}[/]", soft_wrap=False)  # lines broken at spaces


def warn(message: str) -> None:
    console().print(f"[yellow]{_head()}warning:[/] {_escape(message)}")


def error(message: str) -> None:
    """One line, no traceback: the CLI's way of reporting a RunnerError."""
    console().print(f"[red]{_head()}error:[/] {_escape(message)}")


def confirm(question: str) -> bool:
    """Ask on stderr, read one line from stdin: True only for y or yes; end of input is no."""
    try:
        answer = console().input(_escape(f"{question} [y/N] "))
    except EOFError:
        return False
    return answer.strip().lower() in {"y", "yes"}


def ask(question: str) -> str | None:
    """Ask on stderr, read one line from stdin, as typed (None at the end of input)."""
    try:
        return str(console().input(_escape(f"{question} ")))
    except EOFError:
        return None


def table_to(
    out: TextIO, columns: Sequence[str], rows: Sequence[Sequence[str]], *, right: Collection[str] = ()
) -> None:
    """A command's table on out: aligned with a header on a terminal; piped, tab-separated rows only.

    Piped rows carry no header and no padding, so `cut -f1` or `awk -F'\t'` read them as they are.
    """
    if not out.isatty():
        out.writelines("\t".join(row) + "\n" for row in rows)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 3, 0, 0))
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left", overflow="fold")
    for row in rows:
        table.add_row(*(_escape(cell) for cell in row))
    Console(file=out, highlight=False).print(table)


@contextmanager
def download_progress(
    label: str, *, enabled: bool
) -> Iterator[Callable[[int, int], Callable[[int], None]] | None]:
    """A rich bar on stderr (bytes, rate, ETA): yields start(total, already) -> advance(n), or None."""
    if not enabled:
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console(), transient=True) as bar:

        def start(total: int, already: int) -> Callable[[int], None]:
            task = bar.add_task(label, total=total, completed=already)
            return lambda n: bar.advance(task, n)

        yield start


@contextmanager
def batch_progress(total: int, *, enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A rich bar on stderr for a batch: yields update(done, tokens) (done/total, tok/s, ETA), or None."""
    if not enabled:
        yield None
        return
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (
        TextColumn("answers"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
    )
    start = time.perf_counter()
    with Progress(*columns, console=console(), transient=True) as bar:
        task = bar.add_task("answers", total=total, rate="")

        def update(done: int, tokens: int) -> None:
            rate = tokens / max(time.perf_counter() - start, 1e-9)
            bar.update(task, completed=done, rate=f"{rate:.1f} tok/s")

        yield update


def dim(text: str) -> str:
    """Text a terminal shows faint (SGR 2, then 22: normal intensity), for a model's reasoning."""
    return f"\x1b[2m{text}\x1b[22m"


class WordWrap:
    """Text streamed to a terminal, its lines broken at a space before the edge rather than by the
    terminal inside a word ("to|pics"): each word is held until it ends (a space, a newline, the end of
    the answer), then written where it fits. A word wider than the terminal is the terminal's to break."""

    def __init__(self, out: TextIO, width: int) -> None:
        self.out = out
        self.width = width
        self.column = 0  # where the cursor is; == width: at the edge, the next character wraps
        self.blank = ""  # spaces after the last word, written only if the next word fits after them
        self.word = ""
        self.glued = False  # the held word goes on a part of it already written: never a break before it
        self.dimmed = False  # how the held word is shown

    def write(self, text: str, *, dimmed: bool = False) -> None:
        if dimmed != self.dimmed:
            self._word()
            self.dimmed = dimmed
        for piece in re.split(r"(\n|[ \t]+)", text):
            if not piece:
                continue
            if piece == "\n":
                self._word()
                self._emit("\n")
                self.column, self.blank, self.glued = 0, "", False
            elif piece[0] in " \t":
                self._word()
                self.blank, self.glued = self.blank + piece.expandtabs(8), False
            else:
                self.word += piece
                if len(self.word) >= self.width:  # no space in sight (a URL, CJK text): do not wait
                    self._word()
                    self.glued = True
        self.out.flush()

    def _word(self) -> None:
        if not self.word:
            return
        from rich.cells import cell_len

        size = cell_len(self.word)
        if self.column and not self.glued and self.column + len(self.blank) + size > self.width:
            self._emit("\n")  # the spaces that would end this line are dropped
            self.column = 0
        else:
            self._emit(self.blank)
            self.column += len(self.blank)
        self._emit(self.word)
        self.column += size
        if self.column > self.width:  # a word wider than the line: wrapped by the terminal
            self.column = (self.column - 1) % self.width + 1
        self.blank = self.word = ""

    def _emit(self, text: str) -> None:
        if text:
            self.out.write(dim(text) if self.dimmed else text)


@contextmanager
def markdown_stream(out: TextIO) -> Iterator[Callable[[str], None]]:
    """An answer rendered as Markdown on the terminal `out` while it grows: yields update(text).

    Only the bottom of the answer, what fits on the screen, is live (redrawn as it changes): a live
    region taller than the screen cannot be redrawn (the cursor cannot go up into the scrollback), and
    each redraw would leave another copy of its top there. The lines above it are printed once, for
    good, as they leave the screen. It is drawn at most REDRAWS_PER_S times a second, and at the end."""
    from rich.console import Console
    from rich.live import Live
    from rich.markdown import Markdown
    from rich.segment import SegmentLines

    terminal = Console(file=out)
    printed = 0  # lines of the rendered answer printed above the live region, for good
    latest, drawn = "", 0.0

    def draw(live: Live) -> None:
        nonlocal printed, drawn
        lines = terminal.render_lines(Markdown(latest), terminal.options, pad=False)
        fits = max(1, terminal.size.height - 1)  # the line the prompt comes back on stays free
        top = max(printed, len(lines) - fits)
        live.update(SegmentLines(lines[top:], new_lines=True), refresh=top == printed)
        if top > printed:  # drawn after the live region shrank: the screen never holds more than it
            live.console.print(SegmentLines(lines[printed:top], new_lines=True))
            printed = top
        drawn = time.monotonic()

    with Live(console=terminal, auto_refresh=False, vertical_overflow="visible") as live:

        def update(text: str) -> None:
            nonlocal latest
            latest = text
            if time.monotonic() - drawn >= 1 / REDRAWS_PER_S:
                draw(live)

        try:
            yield update
        finally:
            draw(live)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def count(n: int, noun: str, plural: str | None = None) -> str:
    """'1 thread', '2 threads', '1,024 tokens': a number and its noun, in the plural unless one."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


_UNITS = (("year", 365 * 86400), ("month", 30 * 86400), ("week", 7 * 86400), ("day", 86400))


def human_since(moment: float | None, now: float | None = None) -> str:
    """'never', 'today', '3 days ago' ... for a Unix time, to the day (as file access times move)."""
    if moment is None:
        return "never"
    seconds = (time.time() if now is None else now) - moment
    for unit, size in _UNITS:
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "today"


def human_when(moment: float | None, now: float | None = None) -> str:
    """When, by local dates: 'today 14:05', 'yesterday 23:10', then days back as human_since words
    them ('2 days ago', '1 week ago'); a moment after now (a clock set back) as its date and time."""
    from datetime import date

    if moment is None:
        return "never"
    now = time.time() if now is None else now
    clock = time.strftime("%H:%M", time.localtime(moment))
    days = (date.fromtimestamp(now) - date.fromtimestamp(moment)).days
    if days < 0:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(moment))
    if days < 2:
        return f"{'today' if days == 0 else 'yesterday'} {clock}"
    return human_since(now - days * 86400, now)  # by dates: the day before yesterday is 2 days ago


@contextmanager
def steps_progress(label: str, total: int, *, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A bar on stderr over a few long steps: yields step(what), called as each one starts (a no-op
    when not enabled). Drawn only then, with no refresh thread, so it takes no time from a step."""
    if not enabled:
        yield lambda _what: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"))
    with Progress(*columns, console=console(), transient=True, auto_refresh=False) as bar:
        task = bar.add_task("", total=total)
        started = 0

        def step(what: str) -> None:
            nonlocal started
            bar.update(task, completed=started, description=what)
            bar.refresh()
            started += 1

        yield step
