"""`runner rerank`: a query and documents in, the documents sorted by relevance out
(runner.engine.rerank scores each pair).

Documents come from the arguments, or else one per stdin line (blank lines skipped), or with --jsonl
one per stdin line as JSON (`{"text": ...}` or a string). They are checked before the model loads
(at least one, at most MAX_DOCUMENTS, each text UTF-8 and not empty) and every pair is measured
before any is scored, so a bad input exits 2 with nothing on stdout. Plain output: `score<TAB>document`
a line, most relevant first (a document's newlines, tabs and backslashes written as \\n, \\t, \\\\);
--json: one object in the shape of /v1/rerank's answer, every document there as it came.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO, TextIO

from runner import interrupt, ui
from runner.commands.output import describe_model
from runner.engine.context import CTX_PAD, Interrupted
from runner.engine.embed import EmptyInput
from runner.engine.rerank import MAX_DOCUMENTS, PairTooLong, Reranker, check_count
from runner.errors import PromptTooLong, UsageError
from runner.loader import open_model
from runner.settings import DEFAULTS, LoadSettings


@dataclass(frozen=True)
class RerankRequest:
    model: str
    query: str
    documents: tuple[str, ...] = ()  # from the arguments; empty: from stdin
    jsonl: bool = False
    json: bool = False
    top: int | None = None
    truncate: bool = False
    settings: LoadSettings = DEFAULTS  # its ctx: the longest pair in tokens (None: embed.EMBED_CTX)
    verbose: bool = False


@dataclass
class Documents:
    """The documents, and how an error names one of them (`where(i)`: "line 3", "document 2")."""

    texts: list[str]
    lines: list[int] = field(default_factory=list)  # each one's stdin line; empty: from the arguments

    def where(self, index: int) -> str:
        return f"line {self.lines[index]}" if self.lines else f"document {index + 1}"


def rerank_command(request: RerankRequest, *, stdin: BinaryIO | None, out: TextIO) -> int:
    """Score every document against the query and write them, most relevant first; the exit code."""
    if not request.query.strip():
        raise UsageError("the query is empty")
    documents = read_documents(request, stdin)
    loaded = open_model(request.model, replace(request.settings, chat_template=False, generates=False))
    try:
        loaded.engine.context.close()  # the generation context: never used here
        reranker = Reranker(loaded.engine, request.settings.ctx, standalone=True, name=loaded.name)
        with interrupt.deferred(), reranker as r:
            if request.verbose:
                ui.info(
                    f"{describe_model(loaded)} · rank pooling · up to {r.n_ctx:,} tokens a pair · "
                    f"threads {loaded.engine.context.threads.n}"
                    + (" · the model's rerank template" if r.template is not None else "")
                )
            pairs = _pairs(r, request, documents, loaded.engine.model.n_ctx_train)
            start = time.perf_counter()
            scores: list[float] = []
            try:
                for batch in r.stream_scores(pairs):
                    scores.extend(batch)
                    if interrupt.requested():
                        break
            except Interrupted:
                pass
            if len(scores) < len(pairs):  # Ctrl-C: nothing is written; deferred() raises at its end
                return 130
            took = time.perf_counter() - start
            _write(request, documents.texts, scores, sum(len(p) for p in pairs), out)
            if request.verbose:
                tokens = sum(len(p) for p in pairs)
                ui.info(
                    f"{ui.count(len(pairs), 'document')}, {ui.count(tokens, 'token')} in {took:.2f} s "
                    f"({len(pairs) / max(took, 1e-9):.1f} documents/s)"
                )
    finally:
        loaded.close()
    return 0


def read_documents(request: RerankRequest, stdin: BinaryIO | None) -> Documents:
    """The documents: the arguments, or stdin's lines (plain or --jsonl); UsageError for bad input."""
    if request.documents:
        if request.jsonl:
            raise UsageError("--jsonl reads documents from stdin: leave the DOCUMENT arguments out")
        documents = Documents(list(request.documents))
    elif stdin is None:
        raise UsageError(
            "no documents: give them after the query, or pipe them in, one a line "
            "(runner rerank MODEL QUERY < docs.txt)"
        )
    else:
        documents = _stdin_documents(stdin.read(), request.jsonl)
    check_count(len(documents.texts), MAX_DOCUMENTS)
    for i, text in enumerate(documents.texts):
        if not text.strip():
            raise UsageError(f"{documents.where(i)}: the document is empty")
    return documents


def _stdin_documents(data: bytes, jsonl: bool) -> Documents:
    documents = Documents([], [])
    for n, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(f"line {n} is not UTF-8 text (byte {exc.start})") from None
        if not line.strip():
            continue
        documents.texts.append(_json_document(line, n) if jsonl else line)
        documents.lines.append(n)
        if len(documents.texts) > MAX_DOCUMENTS:
            break  # check_count names the bound
    return documents


def _json_document(line: str, n: int) -> str:
    """A --jsonl line's document: a JSON string, or an object whose "text" is one."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"line {n} is not JSON ({exc.msg} at column {exc.colno})") from None
    if isinstance(row, dict):
        row = row.get("text")
    if not isinstance(row, str):
        raise UsageError(f'line {n}: a document is a JSON string or an object with a string "text"')
    return row


def _pairs(r: Reranker, request: RerankRequest, documents: Documents, trained: int) -> list[list[int]]:
    """Every pair's tokens, measured before any is scored: an error names the document and the fix."""
    try:
        return r.pairs(request.query, documents.texts, truncate=request.truncate)
    except PairTooLong as exc:
        suggest = -(-exc.n_tokens // CTX_PAD) * CTX_PAD
        fix = f"--ctx {suggest} or --truncate" if not trained or suggest <= trained else "--truncate"
        raise PromptTooLong(
            f"{documents.where(exc.index)}: the query and this document make {exc.n_tokens:,} tokens, "
            f"more than the {exc.limit:,} a rerank pair takes here; use {fix}",
            tokens=exc.n_tokens,
            context=exc.limit,
        ) from None
    except EmptyInput as exc:
        raise UsageError(f"{documents.where(exc.index)}: the document has no tokens") from None


def ranked(scores: list[float], top: int | None) -> list[int]:
    """The documents' indexes, most relevant first (ties in input order), the first `top` of them."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return order[:top] if top is not None else order


def _write(request: RerankRequest, texts: list[str], scores: list[float], tokens: int, out: TextIO) -> None:
    order = ranked(scores, request.top)
    if request.json:
        results: list[dict[str, Any]] = [
            {"index": i, "relevance_score": scores[i], "document": {"text": texts[i]}} for i in order
        ]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        body = {"model": request.model, "results": results, "usage": usage}
        out.write(json.dumps(body, ensure_ascii=False) + "\n")
    else:
        for i in order:
            out.write(f"{scores[i]:.6f}\t{_one_line(texts[i])}\n")
    out.flush()


def _one_line(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
