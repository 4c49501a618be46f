"""Where a one-shot run's start-up goes, for `runner run --verbose`: the interpreter and imports, the
model resolved and planned, the weights loaded, the prompt rendered and tokenized, the first token.

The command marks its own start (`begin`), and each phase's end is marked where it happens (the
loader, the engine). Nothing here imports anything: a mark is a perf_counter reading in a dict.
"""

from __future__ import annotations

import time

PHASES = (
    ("plan", "model resolved and planned"),
    ("load", "load"),
    ("prompt", "prompt rendered and tokenized"),
)

_marks: dict[str, float] = {}
_ahead = False  # the weights were loaded beside the imports (runner.engine.preload)
_began: tuple[float, float] | None = None  # perf_counter at the command's start, and the process's age


def begin(age: float) -> None:
    """The command starts, `age` seconds after its process did (runner.engine.answer's
    since_process_start): what came before it is the interpreter's start and the imports."""
    global _began, _ahead
    _marks.clear()
    _ahead = False
    _began = (time.perf_counter(), age)


def mark(phase: str) -> None:
    """A phase ends (its first end only: a second load, a draft model's, is not start-up)."""
    if _began is not None:
        _marks.setdefault(phase, time.perf_counter())


def loaded_ahead() -> None:
    """The weights came from runner.engine.preload's load, begun as the command line was read."""
    global _ahead
    _ahead = True


def describe(first_token_s: float) -> str:
    """One line: each phase's seconds; "" where the command did not mark its start."""
    if _began is None:
        return ""
    at, age = _began
    parts = [f"interpreter and imports {age:.2f} s"]
    for phase, name in PHASES:
        if phase in _marks:
            if phase == "load" and _ahead:
                name = "load, begun beside the imports"
            parts.append(f"{name} {_marks[phase] - at:.2f} s")
            at = _marks[phase]
    parts.append(f"first token {first_token_s:.2f} s")
    return "start-up: " + " · ".join(parts)
