"""`runner bench MODEL --quality [FILE]`: how well a model predicts a text (runner.engine.quality):
its perplexity, and with --reference OTHER the KL-divergence of its next-token distributions from
OTHER's, the 99th percentile and the share of positions where both rank the same token first.

The reference runs once per text, context and file: its top tokens are kept under the cache
(quality/, a few MiB a text) so a second quant compares without running it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any, TextIO

from runner import ui
from runner.commands.output import describe_load
from runner.engine.quality import (
    TOP_K,
    Quality,
    Reference,
    check_ctx,
    score_text,
    tokens_hash,
    vocabulary_mismatch,
)
from runner.errors import DownloadError, UsageError
from runner.loader import LoadedModel, open_model
from runner.paths import cache_dir
from runner.settings import LoadSettings

DEFAULT_TEXT = Path(__file__).resolve().parent.parent / "data" / "quality.txt"
DEFAULT_CTX = 512  # llama-perplexity's customary context for comparisons
KEPT_FORMAT = 1  # raised whenever a kept pass would no longer be what a pass now computes


def read_text(source: str | None) -> tuple[str, str]:
    """The text to score and what to call it: FILE, or the default shipped with runner."""
    path = DEFAULT_TEXT if not source else Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--quality {source}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--quality {source}: cannot read it as UTF-8 text ({exc})") from None
    if not text.strip():
        raise UsageError(f"--quality {source}: the file is empty")
    return text, "the default text (runner/data/quality.txt)" if not source else str(path)


def quality(
    model: str,
    *,
    out: TextIO,
    as_json: bool,
    source: str | None,
    reference: str | None = None,
    ctx: int | None = None,
    threads: int | None = None,
) -> Quality:
    ctx = ctx or DEFAULT_CTX
    check_ctx(ctx)
    text, name = read_text(source)
    kept = None
    if reference is not None:
        _check_vocabularies(model, reference)
        kept = _reference(reference, text, ctx, threads)
    loaded = _open(model, ctx, threads)
    try:
        ui.info(f"scoring {name} with {describe_load(loaded)}")
        tokens = loaded.engine.model.tokenize(text, parse_special=False)  # as llama-perplexity
        figures, _ = score_text(loaded.engine.context, tokens, ctx, reference=kept, progress=_progress)
    finally:
        loaded.close()
    if as_json:
        head = {"model": model, "reference": reference, "text": name}
        out.write(json.dumps({**head, **figures.as_dict()}) + "\n")
    else:
        _table(figures, out)
    return figures


def _open(model: str, ctx: int, threads: int | None) -> LoadedModel:
    # each chunk's second half scored in one decode: ctx / 2 rows of logits (the plan counts them)
    return open_model(
        model, LoadSettings(ctx=ctx, threads=threads, chat_template=False, output_rows=ctx // 2)
    )


def _check_vocabularies(model: str, reference: str) -> None:
    """The two vocabularies compared from the headers (read from the files, or a few MB from the Hub),
    before the reference is scored: a reference of another vocabulary scores other tokens, and its
    pass would be thrown away. A header that cannot be read before a fetch (a PyPI mirror's model not
    yet here) leaves the check to the tokens' own, after the reference's pass."""
    from runner.hub.catalog import load_catalog
    from runner.hub.headers import read_model
    from runner.hub.refs import resolve

    catalog = load_catalog()
    try:
        ours, theirs = (read_model(resolve(name, catalog)).merged for name in (model, reference))
    except DownloadError:
        return
    why = vocabulary_mismatch(ours, theirs)
    if why is not None:
        raise UsageError(
            f"--reference {reference} has another vocabulary than {model} ({why}): the KL-divergence "
            "compares models of one vocabulary, such as two quants of the same weights"
        )


def _progress(done: int, total: int) -> None:
    ui.info(f"  chunk {done}/{total}")


def _reference(model: str, text: str, ctx: int, threads: int | None) -> Reference:
    """The reference's top tokens on this text: from the cache, else a pass of its own (kept)."""
    loaded = _open(model, ctx, threads)
    try:
        tokens = loaded.engine.model.tokenize(text, parse_special=False)  # as llama-perplexity
        path = _kept_path(loaded.path, tokens, ctx)
        kept = _load(path)
        if kept is not None:
            ui.info(f"reference: {loaded.name}, its pass kept in {path}")
            return kept
        ui.info(f"reference: {describe_load(loaded)}, scored once and kept")
        _, kept = score_text(loaded.engine.context, tokens, ctx, keep=True, progress=_progress)
    finally:
        loaded.close()
    assert kept is not None
    _save(path, kept)
    return kept


def _kept_path(model: Path, tokens: list[int], ctx: int) -> Path:
    """Where a reference pass is kept: named by what it was (the format, TOP_K), the file (path, size,
    time), the tokens and ctx."""
    stat = model.stat()
    parts = (KEPT_FORMAT, TOP_K, model.resolve(), stat.st_size, stat.st_mtime_ns, tokens_hash(tokens), ctx)
    key = "\0".join(str(part) for part in parts)
    return cache_dir() / "quality" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"


def _load(path: Path) -> Reference | None:
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            hashed, ctx = str(data["tokens_hash"]), int(data["ctx"])
            return Reference(hashed, ctx, data["ids"], data["logp"], data["nll"])
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):  # none yet, or unreadable: scored again
        return None


def _save(path: Path, kept: Reference) -> None:
    """Written whole, then renamed: a pass stopped half-way is never read as a reference."""
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(f".{os.getpid()}.part")
    with open(part, "wb") as f:
        np.savez(f, tokens_hash=kept.tokens_hash, ctx=kept.ctx, ids=kept.ids, logp=kept.logp, nll=kept.nll)
    os.replace(part, path)


def _table(q: Quality, out: TextIO) -> None:
    rows: list[tuple[str, Any]] = [
        ("text", f"{q.tokens:,} tokens, {q.chunks} chunks of {q.ctx}, {q.scored:,} positions scored"),
        ("perplexity", f"{q.perplexity:.4f} ± {q.perplexity_error:.4f}"),
    ]
    if q.kld_mean is not None:
        rows += [
            ("reference perplexity", f"{q.reference_perplexity:.4f}"),
            ("KL-divergence, mean", f"{q.kld_mean:.6f} ± {q.kld_error:.6f}"),
            ("KL-divergence, 99%", f"{q.kld_p99:.6f}"),
            ("same top token", f"{100 * (q.same_top or 0):.2f}%"),
        ]
    rows.append(("time", f"{q.seconds:.1f} s"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out.write(f"{key:<{width}}  {value}\n")
