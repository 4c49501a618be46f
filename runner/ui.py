"""The only module that knows rich: messages, progress and tables, all on stderr.

stdout belongs to the model's answer; nothing here ever writes to it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

PREFIX = "runner: "


@lru_cache(maxsize=1)
def console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()


def info(message: str) -> None:
    console().print(f"[dim]{PREFIX}[/]{_escape(message)}")


def warn(message: str) -> None:
    console().print(f"[yellow]{PREFIX}warning:[/] {_escape(message)}")


def error(message: str) -> None:
    """One line, no traceback: the CLI's way of reporting a RunnerError."""
    console().print(f"[red]{PREFIX}error:[/] {_escape(message)}")


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


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
