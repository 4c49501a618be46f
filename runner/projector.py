"""--mmproj: a vision projector (an mmproj GGUF) beside a model, for images in its prompts.

A projector file is untrusted like a model, and the pinned libmtmd aborts or crashes the process on a
malformed one, so its header is read by the bounded reader and checked against what clip.cpp expects
of its projector type (runner.gguf.projector) before libmtmd opens it; its width must be the model's.
Before the model loads, the plan counts what libmtmd will allocate for it (memory(); runner.memory.
projector); then the engine attaches it (runner.engine.vision), on the GPU only where the plan put
layers there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.errors import UsageError
from runner.gguf import GGUFHeader, read_header


def attach(engine: Any, mmproj: str, header: GGUFHeader) -> None:
    """The projector at mmproj checked against the model's header, then attached to its engine; the
    engine closed if it cannot be (the caller has no model to close then)."""
    try:
        path = _file(mmproj)
        check(path, header)
        engine.attach_projector(path)
    except BaseException:
        engine.close()
        raise


def check(path: Path, header: GGUFHeader | None) -> Any:
    """The projector's facts (runner.gguf.projector.ProjectorInfo), or one line saying why not; its
    width checked against the model's where its header is given."""
    from runner.gguf.projector import check_projector

    width = header.arch_get("embedding_length") if header is not None else None
    return check_projector(read_header(path), text_n_embd=width if isinstance(width, int) else None)


def memory(mmproj: str, header: GGUFHeader | None = None) -> Any:
    """What libmtmd will allocate for the projector at mmproj, checked first (runner.memory.projector.
    ProjectorMemory: its weights and its encoder's compute buffer, either place the plan may put them)."""
    from runner.gguf.projector import check_projector
    from runner.memory.projector import estimate_projector

    path = _file(mmproj)
    projector = read_header(path)
    width = header.arch_get("embedding_length") if header is not None else None
    info = check_projector(projector, text_n_embd=width if isinstance(width, int) else None)
    return estimate_projector(projector, info)


def _file(mmproj: str) -> Path:
    path = Path(mmproj).expanduser()
    if not path.is_file():
        raise UsageError(f"--mmproj {mmproj}: no such file")
    return path
