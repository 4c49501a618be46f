"""--mmproj: a vision projector (an mmproj GGUF) beside a model, for images in its prompts.

A projector file is untrusted like a model, and the pinned libmtmd aborts or crashes the process on a
malformed one, so its header is read by the bounded reader and checked against what clip.cpp expects
of its projector type (runner.gguf.projector) before libmtmd opens it; its width must be the model's.
Then the engine attaches it (runner.engine.vision), on the GPU only where the plan put layers there.
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
        path = Path(mmproj).expanduser()
        if not path.is_file():
            raise UsageError(f"--mmproj {mmproj}: no such file")
        check(path, header)
        engine.attach_projector(path)
    except BaseException:
        engine.close()
        raise


def check(path: Path, header: GGUFHeader) -> Any:
    """The projector's facts (runner.gguf.projector.ProjectorInfo), or one line saying why not."""
    from runner.gguf.projector import check_projector

    width = header.arch_get("embedding_length")
    return check_projector(read_header(path), text_n_embd=width if isinstance(width, int) else None)
