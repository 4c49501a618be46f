"""The commands that measure a model against this machine: bench (its speed here, by running it) and
fit (its memory here, per device, from the GGUF header alone); and doctor, which measures the install
itself (what its llama.cpp build, devices, caches and the Hub can do here).
"""

from __future__ import annotations

import sys

import typer

from runner.cli import media_options as m
from runner.cli import options as o
from runner.cli.app import app, edge
from runner.errors import UsageError


@app.command(no_args_is_help=True)
@edge
def bench(
    model: o.ModelArg,
    repetitions: o.Repetitions = 3,
    threads: o.Threads = None,
    json: o.JsonObject = False,
    rpc: o.Rpc = None,
    quality: o.Quality = None,
    reference: o.Reference = None,
    ctx: o.QualityCtx = None,
    debug: o.Debug = False,
) -> None:
    """Measure a model here: pp512, tg128, TTFT, end to end, batched.

    With --quality: how well it predicts a text instead (perplexity, and the KL-divergence from
    --reference's predictions).

    \b
    Examples:
      runner bench smollm2
      runner bench ./model.gguf --json
      runner bench ./model-Q3_K_M.gguf --quality --reference ./model-Q8_0.gguf
    """
    if quality is None:
        if reference is not None or ctx is not None:
            raise UsageError("--reference and --ctx go with --quality")
        from runner.commands.bench import bench as run_bench

        run_bench(model, out=sys.stdout, as_json=json, repetitions=repetitions, threads=threads, rpc=rpc)
        return
    if rpc is not None:
        raise UsageError("--quality runs on this machine alone (no --rpc)")
    from runner.commands.quality import quality as run_quality

    text = quality or None  # --quality alone: the text shipped with runner
    run_quality(
        model, out=sys.stdout, as_json=json, source=text, reference=reference, ctx=ctx, threads=threads
    )


@app.command(no_args_is_help=True)
@edge
def fit(
    model: o.ModelArg,
    ctx: o.Ctx = None,
    kv_type: o.KvType = None,
    flash_attn: o.FlashAttn = None,
    gpu_layers: o.GpuLayers = None,
    parallel: o.Parallel = None,
    serve: o.FitServe = False,
    offline: o.Offline = False,
    json: o.JsonObject = False,
    rpc: o.Rpc = None,
    mmproj: m.Mmproj = None,
    debug: o.Debug = False,
) -> None:
    """Will it fit? Memory per device, the offload plan and a verdict.

    Weights, KV cache, compute and output buffers per device, as the pinned llama.cpp allocates them,
    from the GGUF header alone: a model not cached is read on the Hub, nothing downloaded.

    For a repo without a quant, one row per quant: size, verdict, the largest context that fits.

    \b
    Examples:
      runner fit smollm2
      runner fit bartowski/Llama-3.2-3B-Instruct-GGUF:Q4_K_M --ctx 32768 --kv-type q8_0
      runner fit bartowski/Llama-3.2-3B-Instruct-GGUF            # every quant
      runner fit ./model.gguf --json
      runner fit ./model.gguf --serve --parallel 4 --ctx 2048     # what runner serve counts
    """
    from runner.commands.fit import Request, fit_model
    from runner.settings import LoadSettings

    settings = LoadSettings.from_flags(
        flash_attn, ctx=ctx, kv_type=kv_type, gpu_layers=gpu_layers, offline=offline, mmproj=mmproj
    )
    fit_model(Request(model, settings, parallel=parallel, as_json=json, serve=serve), out=sys.stdout)


@app.command()
@edge
def doctor(offline: o.Offline = False, json: o.JsonObject = False, debug: o.Debug = False) -> None:
    """What this install can do: llama.cpp's backends, devices, caches, the Hub; each fix named.

    One line per part: runner and llama.cpp versions, the build's backends (CPU features and AMX, RPC,
    CUDA/Metal/Vulkan/ROCm, libmtmd), the devices llama.cpp sees and their free memory, a GPU here that
    the build cannot use, the model and prompt caches, the conversation store, the settings runner
    reads, and whether the Hub answers (one request, 3 s at most; not with --offline). Exit 1 when
    something is missing, with the command that fixes it.

    \b
    Examples:
      runner doctor
      runner doctor --offline --json
    """
    from runner.commands.doctor import doctor as run_doctor

    code = run_doctor(out=sys.stdout, as_json=json, offline=offline)
    if code:
        raise typer.Exit(code)
