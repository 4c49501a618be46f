"""The only module that knows rich: messages, progress and tables.

Messages and progress go to stderr: stdout belongs to the answer. The one exception is table_to,
which writes a command's answer (a table) to the stream it is given.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TextIO

PREFIX = "runner: "


@lru_cache(maxsize=1)
def console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def echo(text: str) -> None:
    """Plain text on stderr, as is (a table that goes with a message)."""
    console().print(_escape(text))


def info(message: str) -> None:
    console().print(f"[dim]{PREFIX}[/]{_escape(message)}")


def warn(message: str) -> None:
    console().print(f"[yellow]{PREFIX}warning:[/] {_escape(message)}")


def error(message: str) -> None:
    """One line, no traceback: the CLI's way of reporting a RunnerError."""
    console().print(f"[red]{PREFIX}error:[/] {_escape(message)}")


def confirm(question: str) -> bool:
    """Ask on stderr, read one line from stdin: True only for y or yes; end of input is no."""
    try:
        answer = console().input(_escape(f"{question} [y/N] "))
    except EOFError:
        return False
    return answer.strip().lower() in {"y", "yes"}


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


@contextmanager
def markdown_stream(out: TextIO) -> Iterator[Callable[[str], None]]:
    """An answer rendered as Markdown on the terminal `out` while it grows: yields update(text)."""
    from rich.console import Console
    from rich.live import Live
    from rich.markdown import Markdown

    with Live(console=Console(file=out), refresh_per_second=8, vertical_overflow="visible") as live:
        yield lambda text: live.update(Markdown(text))


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


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
