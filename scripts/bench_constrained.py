"""Structured output measured: schema coverage beside llama-server, constrained decode speed, compile time.

    python scripts/bench_constrained.py [--model smollm2] [--sample DIR] [--count 60] [--max-tokens 256]
        [--rounds 3] [--llama-server PATH] [--skip-peer] [--json]

1. Coverage. The team's corpus (tests/data/schemas/*.json: a schema, a prompt, an answer limit each) and
   --count real configuration-file schemas from a SchemaStore checkout (--sample: its src/schemas/json;
   every k-th file of at most 64 KB by name, so the same sample each run; nothing of it is kept in this
   repository), each asked once of runner (in process, one engine) and once of llama-server (the pinned
   llama.cpp's, response_format json_schema), greedy, the same model, prompt and limit. Per side: the
   schemas accepted (not refused: llama-server accepts keywords it then ignores), and of the answers
   that finished (not cut by the limit), those that validate against the schema as given (jsonschema,
   with its format checker). Targets: every finished runner answer validates; runner answers at least
   as many schemas with valid JSON as llama-server (JSONSchemaBench's empirical coverage).
2. Compile time: p50 and p95 of runner's compile per schema (constraint(): checked, bounded, compiled
   by llguidance), first compile of each (the cache by text left out).
3. Decode speed, constrained over unconstrained, at 1 and at 16 sequences (runner's one loop): the same
   prompts, greedy; each unconstrained answer runs to its constrained twin's length (ignore_end), so
   both sides decode the same tokens and the ratio is the mask's cost. --rounds interleaved, medians.
   Target: >= 0.9 at both.
The server under 2,000 json_schema requests (throughput and RSS) is scripts/bench_serve_memory.py.
Progress on stderr; the table (or --json) on stdout. llama-server runs with --no-repack on an AMX CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
from benchlib import free_port, machine, model_file, peer_flags, progress, start, stop, target, wait_ready

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "schemas"
LLAMA_SERVER = Path("/tmp/peers/build/bin/llama-server")
MAX_SAMPLE_BYTES = 64 << 10
CTX = 4096
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 40},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 4},
        "role": {"enum": ["engineer", "teacher", "artist", "other"]},
    },
    "required": ["name", "age", "city", "hobbies", "role"],
    "additionalProperties": False,
}
PEOPLE = ["a pilot", "a baker", "a poet", "a nurse", "a chess player", "a farmer", "a judge", "a diver"]


def cases(sample: Path | None, count: int) -> list[dict[str, Any]]:
    """The corpus, then the sample: name, source, schema, prompt, max_tokens (None: --max-tokens)."""
    found = []
    for path in sorted(CORPUS.glob("*.json")):
        case = json.loads(path.read_text())
        found.append({"name": path.stem, "source": "corpus", "schema": case["schema"],
                      "prompt": case["prompt"], "max_tokens": case.get("max_tokens")})  # fmt: skip
    if sample is not None:
        files = sorted(p for p in sample.glob("*.json") if p.stat().st_size <= MAX_SAMPLE_BYTES)
        step = max(1, len(files) // count) if count else 1
        for path in files[::step][:count]:
            try:
                schema = json.loads(path.read_text(encoding="utf-8-sig"))
            except ValueError:
                continue
            if not isinstance(schema, dict):
                continue
            title = schema.get("title") if isinstance(schema.get("title"), str) else path.stem
            prompt = f"Write a short example of a {title} file (JSON). Answer with the JSON only."
            found.append({"name": path.stem, "source": "schemastore", "schema": schema,
                          "prompt": prompt, "max_tokens": None})  # fmt: skip
    return found


def verdict(schema: dict[str, Any], text: str) -> str:
    """valid, invalid (not JSON, or breaks the schema) or unchecked (the schema cannot be resolved)."""
    try:
        value = json.loads(text)
    except ValueError:
        return "invalid"
    try:
        cls = jsonschema.validators.validator_for(schema)
        errors = list(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(value))
    except Exception:  # a remote $ref (never fetched), a schema jsonschema itself cannot walk
        return "unchecked"
    return "valid" if not errors else "invalid"


def runner_side(
    args: argparse.Namespace, found: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[float]]:
    from runner.engine.answer import FINISH_STOP
    from runner.engine.engine import Engine
    from runner.engine.prompt import render_prompt
    from runner.engine.text.constrain import constraint
    from runner.engine.text.sampling import SamplingConfig
    from runner.engine.text.template import Message
    from runner.errors import RunnerError
    from runner.gguf import read_header

    header = read_header(args.model_path)
    results, compiles = [], []
    with Engine(args.model_path, n_ctx=CTX, n_threads=args.threads) as engine:
        for i, case in enumerate(found):
            began = time.perf_counter()
            try:
                rule = constraint(schema=json.dumps(case["schema"]))
            except RunnerError as exc:
                results.append({"status": "refused", "why": str(exc)[:200]})
                continue
            compiles.append(time.perf_counter() - began)
            assert rule is not None
            tokens = render_prompt(engine, header, [Message("user", case["prompt"])]).tokens
            limit = case["max_tokens"] or args.max_tokens
            result = engine.generate(
                tokens, SamplingConfig(temperature=0), max_tokens=limit, guide=rule.guide
            )
            finished = result.finish_reason == FINISH_STOP
            status = verdict(case["schema"], result.text) if finished else "unfinished"
            results.append({"status": status, "tokens": result.timings.completion_tokens})
            progress(f"  runner {i + 1}/{len(found)} {case['name']}: {status}")
    return results, compiles


async def peer_side(args: argparse.Namespace, found: list[dict[str, Any]], log: Path) -> list[dict[str, Any]]:
    port = free_port()
    command = [str(args.llama_server), "-m", str(args.model_path), "--port", str(port), "-c", str(CTX)]
    command += ["-np", "1", "-t", str(args.threads), "--jinja", *peer_flags()]
    process = start(command, log)
    results = []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
            await wait_ready(client, process, 120)
            for i, case in enumerate(found):
                wanted = {"type": "json_schema", "json_schema": {"name": "x", "schema": case["schema"]}}
                body = {
                    "messages": [{"role": "user", "content": case["prompt"]}],
                    "temperature": 0, "max_tokens": case["max_tokens"] or args.max_tokens,
                    "response_format": wanted,
                }  # fmt: skip
                reply = await client.post("/v1/chat/completions", json=body)
                if reply.status_code != 200:
                    why = reply.text[:200]
                    results.append({"status": "refused" if reply.status_code < 500 else "error", "why": why})
                else:
                    choice = reply.json()["choices"][0]
                    text = choice["message"].get("content") or ""
                    finished = choice["finish_reason"] == "stop"
                    status = verdict(case["schema"], text) if finished else "unfinished"
                    results.append({"status": status, "tokens": reply.json()["usage"]["completion_tokens"]})
                progress(f"  llama-server {i + 1}/{len(found)} {case['name']}: {results[-1]['status']}")
    finally:
        stop(process)
    return results


def shares(results: list[dict[str, Any]]) -> dict[str, Any]:
    count = {
        s: sum(r["status"] == s for r in results) for s in ("valid", "invalid", "unchecked", "unfinished")
    }
    enforced = sum(count.values())
    finished = count["valid"] + count["invalid"]
    return {
        "schemas": len(results), "enforced": enforced, **count,
        "enforced_share": enforced / len(results) if results else 0.0,
        "valid_share": count["valid"] / finished if finished else None,
    }  # fmt: skip


def speed(args: argparse.Namespace) -> dict[str, list[float]]:
    """Constrained over unconstrained decode tok/s, at 1 and 16 sequences, --rounds interleaved."""
    from runner.engine.batch import run_batch
    from runner.engine.engine import Engine
    from runner.engine.prompt import render_prompt
    from runner.engine.request import Request, bare
    from runner.engine.text.constrain import constraint
    from runner.engine.text.sampling import SamplingConfig
    from runner.engine.text.template import Message
    from runner.gguf import read_header

    rule = constraint(schema=json.dumps(PERSON))
    assert rule is not None
    header = read_header(args.model_path)
    greedy = SamplingConfig(temperature=0)
    ratios: dict[str, list[float]] = {"1": [], "16": []}
    for n in (1, 16):
        with Engine(args.model_path, n_ctx=n * 1024, n_threads=args.threads, n_seq=n) as engine:
            prompts = [
                render_prompt(
                    engine, header, [Message("user", f"Describe {PEOPLE[i % len(PEOPLE)]} (#{i}) as JSON.")]
                ).tokens
                for i in range(n)
            ]

            def timed(jobs: list[Request]) -> tuple[float, dict[int, int]]:
                lengths: dict[int, int] = {}
                stats = run_batch(
                    engine, jobs, lambda done: lengths.__setitem__(done.index, done.timings.completion_tokens)
                )
                return stats.completion_tokens / stats.wall_s, lengths

            for rnd in range(args.rounds):
                guided, lengths = timed([bare(p, greedy, max_tokens=300, guide=rule.guide) for p in prompts])
                free, _ = timed(
                    [bare(p, greedy, max_tokens=lengths[i], ignore_end=True) for i, p in enumerate(prompts)]
                )
                ratios[str(n)].append(guided / free)
                progress(
                    f"  decode at {n}: round {rnd + 1}: {guided:.1f} vs {free:.1f} tok/s "
                    f"= {guided / free:.3f}"
                )
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--sample", type=Path, help="a SchemaStore checkout's src/schemas/json")
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--skip-peer", action="store_true", help="runner's figures only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.model_path = model_file(args.model)
    found = cases(args.sample, args.count)
    progress(f"{len(found)} schemas ({sum(c['source'] == 'corpus' for c in found)} from the corpus)")
    ours, compiles = runner_side(args, found)
    theirs: list[dict[str, Any]] = []
    if not args.skip_peer:
        log = Path(tempfile.mkdtemp(prefix="bench-constrained-")) / "llama-server.log"
        progress(f"llama-server's log: {log}")
        theirs = asyncio.run(peer_side(args, found, log))
    ratios = speed(args)
    compiles.sort()
    report: dict[str, Any] = {
        "machine": machine(),
        "model": str(args.model_path),
        "runner": {
            source: shares([r for r, c in zip(ours, found, strict=False) if c["source"] == source])
            for source in ("corpus", "schemastore")
        },
        "compile_ms": {
            "p50": 1000 * statistics.median(compiles),
            "p95": 1000 * compiles[min(len(compiles) - 1, int(0.95 * len(compiles)))],
        },
        "decode_ratio": {n: statistics.median(v) for n, v in ratios.items()},
        "schemas": [
            {"name": c["name"], "source": c["source"], "runner": r, **({"llama_server": t} if theirs else {})}
            for c, r, t in zip(found, ours, theirs or [None] * len(found), strict=False)
        ],
    }
    if theirs:
        report["llama_server"] = {
            source: shares([t for t, c in zip(theirs, found, strict=False) if c["source"] == source])
            for source in ("corpus", "schemastore")
        }
    lines = [f"# {report['machine']}; {args.model_path.name}, greedy, up to {args.max_tokens} tokens", ""]
    lines.append("| schemas | side | accepted | finished valid | invalid | unfinished | unchecked |")
    lines.append("|---|---|---|---|---|---|---|")
    for source in ("corpus", "schemastore"):
        for side in ("runner", "llama_server"):
            s = report.get(side, {}).get(source)
            if not s or not s["schemas"]:
                continue
            valid = f"{s['valid']}/{s['valid'] + s['invalid']}"
            lines.append(
                f"| {source} ({s['schemas']}) | {side} | {s['enforced']} ({100 * s['enforced_share']:.0f}%) "
                f"| {valid} | {s['invalid']} | {s['unfinished']} | {s['unchecked']} |"
            )
    lines.append("")
    lines.append(
        f"compile p50 {report['compile_ms']['p50']:.2f} ms, p95 {report['compile_ms']['p95']:.2f} ms"
    )
    for n, ratio in report["decode_ratio"].items():
        lines.append(target(f"constrained decode / unconstrained at {n} sequence(s)", ratio, 0.9, True))
    invalid = sum(report["runner"][s]["invalid"] for s in report["runner"])
    verdict_line = "PASS" if not invalid else "FAIL"
    lines.append(f"runner's finished answers that broke their schema: {invalid} (target 0) {verdict_line}")
    if theirs:  # JSONSchemaBench's empirical coverage: the schemas answered with JSON that validates
        ours_n = sum(report["runner"][s]["valid"] for s in report["runner"])
        theirs_n = sum(report["llama_server"][s]["valid"] for s in report["llama_server"])
        verdict_line = "PASS" if ours_n >= theirs_n else "FAIL"
        lines.append(
            f"schemas answered with valid JSON: runner {ours_n}, llama-server {theirs_n} of {len(found)} "
            f"(target runner >= llama-server) {verdict_line}"
        )
    text = "\n".join(lines)
    if args.json:
        print(text, file=sys.stderr)
        print(json.dumps(report, indent=2))
    else:
        print(text)


if __name__ == "__main__":
    main()
