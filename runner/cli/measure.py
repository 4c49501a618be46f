"""The commands that measure a model against this machine: bench (its speed here, by running it) and
fit (its memory here, per device, from the GGUF header alone).
"""

from __future__ import annotations

import sys

from runner import options as o
from runner.cli.app import app, edge


@app.command(no_args_is_help=True)
@edge
def bench(
    model: o.ModelArg,
    repetitions: o.Repetitions = 3,
    threads: o.Threads = None,
    json: o.JsonObject = False,
    rpc: o.Rpc = None,
    debug: o.Debug = False,
) -> None:
    """Measure a model here: pp512, tg128, TTFT, end to end, batched.

    \b
    Examples:
      runner bench smollm2
      runner bench ./model.gguf --json
    """
    from runner.commands.bench import bench as run_bench

    run_bench(model, out=sys.stdout, as_json=json, repetitions=repetitions, threads=threads, rpc=rpc)


@app.command(no_args_is_help=True)
@edge
def fit(
    model: o.ModelArg,
    ctx: o.Ctx = None,
    kv_type: o.KvType = None,
    flash_attn: o.FlashAttn = None,
    gpu_layers: o.GpuLayers = None,
    parallel: o.Parallel = 1,
    offline: o.Offline = False,
    json: o.JsonObject = False,
    rpc: o.Rpc = None,
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
    """
    from runner.commands.fit import Request, fit_model

    fit_model(
        Request(
            model,
            ctx=ctx,
            kv_type=kv_type,
            flash_attn=flash_attn,
            gpu_layers=gpu_layers,
            parallel=parallel,
            offline=offline,
            as_json=json,
        ),
        out=sys.stdout,
    )
