"""The commands that load a pooling model (or a chat model's pooled states): embed and rerank."""

from __future__ import annotations

import sys

import typer

from runner.cli import options as o
from runner.cli.app import app, edge
from runner.cli.generate import settings_of


@app.command(no_args_is_help=True)
@edge
def embed(
    model: o.ModelArg,
    text: o.TextArg = None,
    each_line: o.EmbedEachLine = False,
    jsonl: o.EmbedJsonl = False,
    truncate: o.Truncate = False,
    ctx: o.EmbedCtx = None,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = None,
    force: o.Force = False,
    offline: o.Offline = False,
    verbose: o.Verbose = False,
    debug: o.Debug = False,
) -> None:
    """Embed texts as unit vectors, one JSON array a line on stdout.

    The model's own pooling, or the mean of its token states for a model that has none (a chat
    model); vectors at unit length, as OpenAI's and Ollama's APIs return them (docs/embed.md).

    \b
    Examples:
      runner embed smollm2 "The sky is blue."
      runner embed smollm2 --each-line < sentences.txt > vectors.jsonl
      runner embed smollm2 --each-line --jsonl --truncate < chunks.txt
    """
    from runner.commands.embed import EmbedRequest, embed_command

    tty = sys.stdin is None or sys.stdin.isatty()
    code = embed_command(
        EmbedRequest(
            model=model,
            text=text,
            each_line=each_line,
            jsonl=jsonl,
            truncate=truncate,
            settings=settings_of(locals(), spec=False),
            verbose=verbose,
        ),
        stdin=None if tty else sys.stdin.buffer,
        out=sys.stdout,
    )
    raise typer.Exit(code)


@app.command(no_args_is_help=True)
@edge
def rerank(
    model: o.ModelArg,
    query: o.QueryArg,
    documents: o.DocumentsArg = None,
    jsonl: o.RerankJsonl = False,
    top: o.Top = None,
    json_out: o.RerankJson = False,
    truncate: o.RerankTruncate = False,
    ctx: o.RerankCtx = None,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = None,
    force: o.Force = False,
    offline: o.Offline = False,
    verbose: o.Verbose = False,
    debug: o.Debug = False,
) -> None:
    """Sort documents by relevance to a query, best first.

    score<TAB>document a line on stdout. For a reranking model (pooling 'rank': bge-reranker,
    jina-reranker); the scores are llama.cpp's, as llama-server's /v1/rerank gives them
    (docs/rerank.md).

    \b
    Examples:
      runner rerank bge-reranker.gguf "why is the sky blue?" "Rayleigh scattering" "Cats purr"
      grep -h sky notes/*.txt | runner rerank bge-reranker.gguf "why is the sky blue?" --top 3
      runner rerank bge-reranker.gguf "sky" --jsonl --json < docs.jsonl
    """
    from runner.commands.rerank import RerankRequest, rerank_command

    tty = sys.stdin is None or sys.stdin.isatty()
    code = rerank_command(
        RerankRequest(
            model=model,
            query=query,
            documents=tuple(documents or ()),
            jsonl=jsonl,
            json=json_out,
            top=top,
            truncate=truncate,
            settings=settings_of(locals(), spec=False),
            verbose=verbose,
        ),
        stdin=None if tty else sys.stdin.buffer,
        out=sys.stdout,
    )
    raise typer.Exit(code)
