"""Reranking scores against llama.cpp's own llama-server --reranking, on the same file and texts.

The model is scripts/make_test_reranker.py's (random weights, seed 0: the scores mean nothing, but
they must be llama.cpp's), once with llama-server's plain pair and once with a `rerank` chat template
(--template). For each: QUERY against every one of DOCUMENTS, (1) one document a request to
llama-server and one a `runner rerank` process, (2) all of them in one request and one `runner rerank`
call (batched: each side lays out its own batch). Every score must be within 1e-4 of llama-server's
(the largest difference is printed; exit 1 otherwise). llama-server's scores of (1), for seed 0, are
tests/test_rerank.py's expected numbers.

    python scripts/bench_rerank.py [--llama-server PATH] [--threads 2]

llama-server runs with its default flash attention ("auto", as runner's rerank context), with
--no-repack where the CPU has AMX (benchlib.peer_flags). Figures: docs/rerank.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from benchlib import free_port, machine, peer_flags, progress, start, stop, wait_ready

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from make_test_reranker import DOCUMENTS, QUERY, write_reranker  # noqa: E402

LLAMA_SERVER = Path("/tmp/peers/build/bin/llama-server")
TOLERANCE = 1e-4


async def server_scores(url: str, query: str, documents: list[str]) -> list[float]:
    """llama-server's scores in document order (it answers most relevant first)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        reply = (await client.post("/v1/rerank", json={"query": query, "documents": documents})).json()
    scores = [0.0] * len(documents)
    for result in reply["results"]:
        scores[result["index"]] = result["relevance_score"]
    return scores


def runner_scores(model: Path, query: str, documents: list[str], threads: int) -> list[float]:
    command = [sys.executable, "-m", "runner", "rerank", str(model), query, *documents]
    done = subprocess.run([*command, "--json", "--threads", str(threads)], capture_output=True, check=True)
    scores = [0.0] * len(documents)
    for result in json.loads(done.stdout)["results"]:
        scores[result["index"]] = result["relevance_score"]
    return scores


async def llama_server(binary: Path, model: Path, threads: int, log: Path) -> tuple[list[float], list[float]]:
    """(each document alone, all in one request) from llama-server --reranking."""
    port = free_port()
    command = [str(binary), "-m", str(model), "--reranking", "-t", str(threads)]
    process = start([*command, "--port", str(port), *peer_flags()], log)
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url) as client:
            await wait_ready(client, process, 60)
        alone = [(await server_scores(url, QUERY, [d]))[0] for d in DOCUMENTS]
        together = await server_scores(url, QUERY, DOCUMENTS)
    finally:
        stop(process)
    return alone, together


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(f"# rerank parity, {machine()}")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for template in (False, True):
            model = write_reranker(Path(tmp) / f"reranker{'-template' if template else ''}.gguf", 0, template)
            progress(f"llama-server --reranking on {model.name}")
            log = Path(tmp) / "llama-server.log"
            alone, together = asyncio.run(llama_server(args.llama_server, model, args.threads, log))
            progress(f"runner rerank on {model.name}")
            ours_alone = [runner_scores(model, QUERY, [d], args.threads)[0] for d in DOCUMENTS]
            ours_together = runner_scores(model, QUERY, DOCUMENTS, args.threads)
            d_alone = max(abs(a - b) for a, b in zip(alone, ours_alone, strict=True))
            d_together = max(abs(a - b) for a, b in zip(together, ours_together, strict=True))
            d_layout = max(abs(a - b) for a, b in zip(alone, together, strict=True))
            worst = max(worst, d_alone, d_together)
            print(f"\n{model.name}: {len(DOCUMENTS)} documents")
            print(f"  one a request:    max |runner - llama-server| = {d_alone:.2e}")
            print(f"  all in one:       max |runner - llama-server| = {d_together:.2e}")
            print(f"  llama-server itself, alone vs batched: {d_layout:.2e}")
            print(f"  llama-server's scores, one a request: {json.dumps(alone)}")
    ok = worst <= TOLERANCE
    print(f"\nlargest difference {worst:.2e} (<= {TOLERANCE}) {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
