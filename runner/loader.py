"""MODEL as typed -> a verified local GGUF -> a loaded engine. Every command opens models here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runner import ui
from runner.catalog import load_catalog
from runner.engine import DEFAULT_CTX, Engine
from runner.gguf import GGUFHeader, read_header
from runner.refs import LocalRef, ModelRef, resolve
from runner.sampling import check_range

MIN_CTX = 32
MAX_THREADS = 1024


@dataclass
class LoadedModel:
    name: str
    path: Path
    header: GGUFHeader
    engine: Engine

    def close(self) -> None:
        self.engine.close()


def locate(model: str, *, offline: bool = False) -> tuple[ModelRef, Path]:
    ref = resolve(model, load_catalog())
    if isinstance(ref, LocalRef):
        return ref, ref.path
    from runner import hub

    return ref, hub.locate(ref, offline=offline)


def trained_context(header: GGUFHeader) -> int | None:
    value = header.arch_get("context_length")
    return value if isinstance(value, int) and value > 0 else None


def open_model(
    model: str,
    *,
    ctx: int | None = None,
    threads: int | None = None,
    gpu_layers: int | None = None,
    offline: bool = False,
    debug: bool = False,
) -> LoadedModel:
    """Resolve, fetch if needed, check the header, then load: bad files fail before llama.cpp sees them."""
    if ctx is not None:
        check_range(ctx, "--ctx", MIN_CTX, None)
    if threads is not None:
        check_range(threads, "--threads", 1, MAX_THREADS)
    ref, path = locate(model, offline=offline)
    header = read_header(path)
    header.check_complete()
    trained = trained_context(header)
    if ctx is not None and trained is not None and ctx > trained:
        ui.warn(
            f"--ctx {ctx} is beyond the {trained:,} tokens this model was trained on; answers may degrade"
        )
    n_ctx = ctx or min(DEFAULT_CTX, trained or DEFAULT_CTX)
    engine = Engine(path, n_ctx=n_ctx, n_threads=threads, n_gpu_layers=gpu_layers, debug=debug)
    return LoadedModel(name=ref.display, path=path, header=header, engine=engine)
