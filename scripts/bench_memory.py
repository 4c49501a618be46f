"""Compare runner.memory.estimate's estimates with what llama.cpp really allocates.

Each (model, context) runs in a fresh process that loads the model the way runner's engine
does (runner.engine.engine.Engine: default model and context params, n_ctx, 2 threads), records
llama.cpp's own "... buffer size = N MiB" log lines, fills the context with tokens (so
the compute buffer is touched as far as a full context touches it) and reports its peak
RSS. The parent prints a markdown
table: each component's estimate against the log, the % error, and the RSS check.

    .venv/bin/python scripts/bench_memory.py                 # SmolLM2 + the synthetic models
    .venv/bin/python scripts/bench_memory.py --variants      # + KV types, n_seq, n_ubatch, FA off
    .venv/bin/python scripts/bench_memory.py MODEL.gguf --ctx 2048,8192,max
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SYNTH_DIR = Path(os.environ.get("RUNNER_BENCH_SYNTH", "/tmp/runner-bench-synth"))
MiB = 1 << 20
LOG_LINE = re.compile(r"(\w+):\s+(\S+)\s+(model|KV|RS|output|compute) buffer size =\s+([\d.]+) MiB")
KINDS = {"model": "weights", "KV": "kv", "RS": "kv", "output": "output", "compute": "compute"}
GGML_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8}
# (label, estimate.Load fields) run through the low-level API with --variants, on SmolLM2 at 4096
VARIANTS = [
    ("K/V q8_0", dict(type_k="q8_0", type_v="q8_0")),
    ("K q4_0", dict(type_k="q4_0")),
    ("n_seq 3", dict(n_seq=3)),
    ("n_ubatch 1024", dict(n_ubatch=1024)),
    ("n_ubatch 128", dict(n_ubatch=128)),
    ("FA off", dict(flash_attn=False)),
]


def smollm2() -> Path:
    """The default model, fetched (once) through runner's own catalog entry."""
    from runner.hub.catalog import load_catalog
    from runner.hub.fetch import locate
    from runner.hub.refs import from_entry

    return locate(from_entry(load_catalog().default_entry))


def vram_used_mib() -> float | None:
    """GPU 0's used memory from nvidia-smi, or None without one."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return float(out.split()[0]) if out.strip() else None


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def child(path: str, n_ctx: int, variant: dict, fill: bool) -> None:
    """Load, record the log, fill the context, print one JSON line."""
    from runner.engine.engine import Engine
    from runner.engine.llamacpp import LLAMA_LOG, Placement, cpu_repacks, llama

    lib = llama()
    base = rss_kib("VmRSS")
    vram_base = vram_used_mib()
    log: list[str] = []
    LLAMA_LOG.listeners.append(lambda _level, text: log.append(text))
    if set(variant) <= {"n_gpu_layers"}:
        engine = Engine(
            path, n_ctx=n_ctx, n_threads=2, placement=Placement(n_gpu_layers=variant.get("n_gpu_layers", 0))
        )
        ctx, n_ubatch = engine.context.ctx, 512
    else:  # what Engine does, plus the variant's context params
        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = 0
        mparams.use_extra_bufts = cpu_repacks()
        model = lib.llama_model_load_from_file(os.fsencode(path), mparams)
        cparams = lib.llama_context_default_params()
        cparams.n_ctx, cparams.n_threads, cparams.n_threads_batch = n_ctx, 2, 2
        cparams.type_k = GGML_TYPE[variant.get("type_k", "f16")]
        cparams.type_v = GGML_TYPE[variant.get("type_v", "f16")]
        cparams.n_seq_max = variant.get("n_seq", 1)
        cparams.n_ubatch = variant.get("n_ubatch", 512)
        if variant.get("flash_attn") is False:
            cparams.flash_attn_type = 0
        ctx = lib.llama_init_from_model(model, cparams)
        n_ubatch = cparams.n_ubatch
    n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(lib.llama_get_model(ctx)))
    # fill every sequence's cells (or evaluate one ubatch): the graph grows with the cells in use
    n_seq = variant.get("n_seq", 1)
    per_seq = lib.llama_n_ctx(ctx) // n_seq - 1 if fill else min(n_ubatch, lib.llama_n_ctx(ctx))
    rc = decode_fill(lib, ctx, n_seq, per_seq, lib.llama_n_batch(ctx), n_vocab)
    buffers = [(m.group(2), m.group(3), float(m.group(4))) for m in LOG_LINE.finditer("".join(log))]
    vram = vram_used_mib()
    vram_mib = vram - vram_base if vram is not None and vram_base is not None else None
    dry = None
    if "n_gpu_layers" in variant:  # after the measurements: llama.cpp's own compute figures (no_alloc)
        from runner.engine.llamacpp import dry_run

        layers = variant["n_gpu_layers"]
        dry = dry_run(path, Placement(n_gpu_layers=layers), n_ctx=n_ctx)
    print(
        json.dumps(
            {
                "buffers": buffers,
                "rss_base_kib": base,
                "rss_peak_kib": rss_kib("VmHWM"),
                "rc": rc,
                "vram_mib": vram_mib,
                "dry_compute": dry,
            }
        )
    )


def decode_fill(lib, ctx, n_seq: int, per_seq: int, n_batch: int, n_vocab: int) -> int:
    """Decode per_seq tokens into each sequence, n_batch tokens a call, the last token's logits."""
    batch = lib.llama_batch_init(n_batch, 0, 1)
    rc = 0
    for seq in range(n_seq):
        for start in range(0, per_seq, n_batch):
            n = min(n_batch, per_seq - start)
            for i in range(n):
                batch.token[i] = ((start + i) * 7919 + seq) % n_vocab
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = seq
                batch.logits[i] = i == n - 1
            batch.n_tokens = n
            rc = lib.llama_decode(ctx, batch) or rc
    lib.llama_batch_free(batch)
    return rc


def measure(path: Path, n_ctx: int, variant: dict | None = None, fill: bool = True) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        str(path),
        str(n_ctx),
        json.dumps(variant or {}),
        str(int(fill)),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{path.name} n_ctx={n_ctx}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def pct(est: float, real: float) -> str:
    """The error against a log value printed to 0.01 MiB: within its rounding counts as none."""
    if abs(est - real) <= 0.005 * MiB:
        return "+0.0%"
    if real == 0:
        return "0.0%" if est == 0 else "n/a"
    return f"{(est - real) / real * 100:+.1f}%"


def row(label: str, path: Path, n_ctx: int, variant: dict | None = None, fill: bool = True):
    from runner.engine.llamacpp import repack_types
    from runner.gguf import read_header
    from runner.memory.estimate import Load, estimate

    real = measure(path, n_ctx, variant, fill)
    kwargs = dict(variant or {})
    if "n_gpu_layers" in kwargs:
        kwargs["gpu"] = kwargs["n_gpu_layers"] != 0
    est = estimate(read_header(path), Load(n_ctx=n_ctx, **kwargs), repack_types=repack_types())
    got = {k: 0.0 for k in ("weights", "kv", "compute", "output")}
    for _name, kind, mib in real["buffers"]:
        got[KINDS[kind]] += mib * MiB
    want = {k: 0.0 for k in got}
    for b in est.buffers:
        want[KINDS[b.kind]] += b.nbytes
    total_real, total_est = sum(got.values()), sum(want.values())
    rss_real = (real["rss_peak_kib"] - real["rss_base_kib"]) * 1024
    rss_est = est.host_rss_bytes
    cells, errors = [], []
    for k in ("weights", "kv", "compute", "output"):
        cells.append(f"{want[k] / MiB:.2f} / {got[k] / MiB:.2f} ({pct(want[k], got[k])})")
        close = abs(want[k] - got[k]) <= 0.005 * MiB
        errors.append(0.0 if close or not got[k] else abs(want[k] - got[k]) / got[k] * 100)
    cells.append(f"{total_est / MiB:.2f} / {total_real / MiB:.2f} ({pct(total_est, total_real)})")
    cells.append(f"{rss_est / MiB:.1f} / {rss_real / MiB:.1f} ({pct(rss_est, rss_real)})")
    errors.append(abs(total_est - total_real) / total_real * 100)
    if "n_gpu_layers" in kwargs:  # both GPU columns, "n/a" where a figure is missing (no nvidia-smi)
        vram, dry = real.get("vram_mib"), real.get("dry_compute")
        gpu = est.device("gpu")
        want = gpu.total_bytes if gpu else 0  # the estimate's GPU total against what nvidia-smi saw
        cells.append("n/a" if vram is None else f"{want / MiB:.0f} / {vram:.0f} ({pct(want, vram * MiB)})")
        if dry is None:  # else what runner's dry-run check would put in the estimate, against the log
            cells.append("n/a")
        else:
            dry_bytes, logged = sum(dry.values()), got["compute"]
            cells.append(f"{dry_bytes / MiB:.2f} / {logged / MiB:.2f} ({pct(dry_bytes, logged)})")
    mark = "" if est.exact else " (approx.)"
    return f"| {label}{mark} | {est.n_ctx} | " + " | ".join(cells) + " |", errors


def contexts(path: Path, spec: str) -> list[int]:
    from runner.gguf import read_header
    from runner.memory.estimate import Load, estimate

    header = read_header(path)
    out = []
    for item in spec.split(","):
        n = int(header.arch_get("context_length", 8192)) if item == "max" else int(item)
        if item == "max":  # the trained maximum, when it fits in half the RAM
            ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            if estimate(header, Load(n_ctx=n)).total_bytes > ram // 2:
                continue
        if n not in out:
            out.append(n)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "models", nargs="*", type=Path, help="GGUF files (default: SmolLM2 and the synthetic set)"
    )
    ap.add_argument("--ctx", default="2048,8192,max", help="contexts; 'max' is the trained one if it fits")
    ap.add_argument(
        "--variants", action="store_true", help="also KV types, n_seq, n_ubatch, FA off on SmolLM2"
    )
    ap.add_argument(
        "--no-fill", action="store_true", help="evaluate one ubatch instead of filling the context"
    )
    ap.add_argument(
        "--gpu-layers", default="", help="comma-separated n_gpu_layers to measure (a GPU build), e.g. -1,16"
    )
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), json.loads(args.child[2]), args.child[3] == "1")
        return

    models = [(p.stem, p) for p in args.models]
    if not models:
        sys.path.insert(0, str(ROOT / "tests"))
        import synth

        models = [("SmolLM2-135M Q4_1", smollm2())]
        models += [(f"synth {n}", p) for n, p in synth.write_all(SYNTH_DIR).items()]
    layer_runs = [int(n) for n in args.gpu_layers.split(",") if n.strip()] or [None]
    vram = " GPU total / VRAM used (nvidia-smi) | dry-run compute / log |" if args.gpu_layers else ""
    print("Estimate / llama.cpp log, MiB (error). RSS: host_rss_bytes / the process's peak RSS growth.\n")
    print(f"| model | n_ctx | weights | KV / state | compute | output | total | RSS |{vram}")
    print("|---|---|---|---|---|---|---|---|" + ("---|---|" if vram else ""))
    worst = 0.0
    for label, path in models:
        for n_ctx in contexts(path, args.ctx):
            for layers in layer_runs:
                variant = None if layers is None else {"n_gpu_layers": layers}
                name = label if layers is None else f"{label}, {layers} GPU layers"
                line, errors = row(name, path, n_ctx, variant, fill=not args.no_fill)
                worst = max(worst, *errors)
                print(line, flush=True)
    if args.variants:
        for label, variant in VARIANTS:
            line, errors = row(f"SmolLM2 {label}", smollm2(), 4096, variant, fill=not args.no_fill)
            worst = max(worst, *errors)
            print(line, flush=True)
    print(f"\nworst component or total error: {worst:.2f}%")


if __name__ == "__main__":
    main()
