"""`runner fit`: weights, KV cache and compute per device, the plan, and a verdict, before any download."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from runner import loader, ui
from runner.gguf import GGUFHeader
from runner.hub import fetch
from runner.hub.catalog import load_catalog
from runner.hub.headers import ModelHeaders, read_model, read_remote
from runner.hub.quants import Choice, offer
from runner.hub.refs import HubRef, LocalRef, resolve
from runner.limits import check_range, flash_attn_name, flash_attn_setting
from runner.memory.devices import Machine
from runner.memory.plan import (
    Plan,
    check_asked,
    confirm,
    departures,
    device_table,
    held,
    largest_context,
    make_plan,
    trained_context,
)

BANDWIDTH_PROBE_BYTES = 64 << 20


@dataclass(frozen=True)
class Request:
    model: str
    ctx: int | None = None
    kv_type: str | None = None
    flash_attn: str | None = None  # --flash-attn as typed
    gpu_layers: int | None = None
    parallel: int = 1
    offline: bool = False
    as_json: bool = False

    @property
    def asked(self) -> dict[str, Any]:
        """What the user set of the plan, as make_plan, confirm and departures take it. With
        --parallel N, as `run --parallel`: --ctx is each sequence's (default 2048), N of them in all."""
        return dict(
            ctx=loader.total_ctx(self.ctx, self.parallel),
            gpu_layers=self.gpu_layers,
            kv_type=self.kv_type,
            flash_attn=flash_attn_setting(self.flash_attn),
        )


def fit_model(request: Request, *, out: TextIO) -> None:
    check_range(request.parallel, "--parallel", 1, 256)
    check_asked(ctx=request.ctx, gpu_layers=request.gpu_layers)
    flash_attn_setting(request.flash_attn)
    ref = resolve(request.model, load_catalog())
    machine = loader.machine()
    if isinstance(ref, HubRef) and ref.quant is None and ref.file is None and ref.entry is None:
        _per_quant(ref, request, machine, out)
        return
    model = read_model(ref, offline=request.offline)
    warnings = _warn(model.merged, machine, request)
    plan = _plan(model.merged, machine, request, model.path)
    speed = decode_speed(model.merged, plan, machine)
    chose = (
        departures(
            plan,
            model.merged,
            machine,
            ctx=request.ctx,
            gpu_layers=request.gpu_layers,
            kv_type=request.kv_type,
        )
        if plan.fits
        else []
    )
    if request.as_json:
        report = {**to_json(ref, model, plan, machine, speed), "chosen": chose, "warnings": warnings}
        out.write(json.dumps(report) + "\n")
        return
    _describe(ref, model, plan, machine, speed, out, chose, request.ctx)


def _warn(header: GGUFHeader, machine: Machine, request: Request) -> list[str]:
    """What run would say of the same settings, said the same way (on stderr), and returned."""
    warnings = loader.setting_warnings(header, machine, ctx=request.ctx)
    for warning in warnings:
        ui.warn(warning)
    return warnings


def _plan(header: GGUFHeader, machine: Machine, request: Request, path: Path | None = None) -> Plan:
    """The plan; for a local file (one sequence) checked by a dry run where the estimate approximates."""
    plan = make_plan(header, machine, n_seq=request.parallel, **request.asked)
    if path is None or request.parallel != 1:
        return plan
    return confirm(plan, header, machine, loader.dry_run_of(path), **request.asked)


def verdict(plan: Plan) -> str:
    if not plan.fits:
        return "does not fit"
    if plan.n_gpu_layers == 0:
        return "fits, CPU only"
    workers = any(d.device not in ("cpu", "gpu") for d in plan.estimate.devices)
    where = "across the workers" if workers else "on the GPU"
    return f"fits fully {where}" if plan.full_offload else f"fits partly {where} ({plan.n_gpu_layers} layers)"


def layers_per_worker(plan: Plan, machine: Machine) -> list[tuple[str, int]]:
    """(endpoint, layers it holds, the output layer counting as one) under the plan's split."""
    from runner.memory.plan import worker_shares
    from runner.memory.split import layer_owners

    shares = worker_shares(machine)
    n_layer = plan.estimate.n_layers - 1
    owners = layer_owners(n_layer, n_layer + 1 - plan.n_gpu_layers, [s for _, s in shares])
    return [(e, sum(1 for i in owners.values() if i == k)) for k, (e, _) in enumerate(shares)]


def to_json(
    ref: LocalRef | HubRef, model: ModelHeaders, plan: Plan, machine: Machine, speed: float | None
) -> dict:
    est = plan.estimate
    return {
        "model": ref.display,
        "file": model.source,
        "size_bytes": model.size,
        "ctx": plan.n_ctx // plan.n_seq,  # each sequence's, as --ctx is
        "trained_ctx": trained_context(model.headers[0]),
        "gpu_layers": plan.n_gpu_layers,
        "layers": est.n_layers,
        "parallel": plan.n_seq,
        "kv_type": plan.type_k,
        "flash_attn": flash_attn_name(plan.flash_attn),
        "fits": plan.fits,
        "verdict": verdict(plan),
        "estimate": {
            "weights_bytes": est.weights_bytes,
            "kv_bytes": est.kv_bytes,
            "compute_bytes": est.compute_bytes,
            "output_bytes": est.output_bytes,
            "overhead_bytes": est.overhead_bytes,
            "total_bytes": est.total_bytes,
        },
        "devices": [  # as the table: the parts add up to total_bytes, what the verdict counts
            {
                "device": h.device,
                "weights_bytes": h.weights_bytes,
                "kv_bytes": h.kv_bytes,
                "compute_bytes": h.compute_bytes,
                "compute_reserved_bytes": h.compute_reserved_bytes,
                "output_bytes": h.output_bytes,
                "other_bytes": h.other_bytes,
                "total_bytes": h.verdict.needed_bytes,
                "available_bytes": h.verdict.budget_bytes,
                "fits": h.verdict.fits,
            }
            for h in held(plan)
        ],
        "machine": {
            "ram_total_bytes": machine.ram_total_bytes,
            "ram_available_bytes": machine.ram_available_bytes,
            "gpus": [
                {"name": g.name, "total_bytes": g.total_bytes, "free_bytes": g.free_bytes}
                for g in machine.gpus
            ],
            "can_offload": machine.can_offload,
            "workers": [
                {"endpoint": w.endpoint, "free_bytes": w.free_bytes, "total_bytes": w.total_bytes}
                for w in machine.workers
            ],
        },
        "alternatives": list(plan.alternatives),
        "decode_tokens_per_s_estimate": round(speed, 1) if speed else None,
    }


def _describe(
    ref: LocalRef | HubRef,
    model: ModelHeaders,
    plan: Plan,
    machine: Machine,
    speed: float | None,
    out: TextIO,
    chose: list[str],
    asked_ctx: int | None,
) -> None:
    h, est = model.headers[0], plan.estimate
    trained = trained_context(h)
    per_seq = plan.n_ctx // plan.n_seq
    notes = [f"trained {trained:,}"] if trained else []
    if asked_ctx and per_seq != asked_ctx:
        notes.insert(0, f"--ctx {asked_ctx:,} padded to a multiple of 256")
    rows = [
        (
            "model",
            f"{ref.display} ({h.architecture}, {est.n_layers - 1} layers, {ui.human_bytes(model.size)})",
        ),
        (
            "context",
            f"{per_seq:,} tokens"
            + (f" for each of {plan.n_seq} sequences" if plan.n_seq > 1 else "")
            + (f" ({'; '.join(notes)})" if notes else ""),
        ),
        ("KV cache type", plan.type_k),
        ("flash attention", flash_attn_name(plan.flash_attn)),
    ]
    if machine.workers:
        spread = ", ".join(f"{n} on {e}" for e, n in layers_per_worker(plan, machine)) if plan.use_gpu else ""
        rows.append(("offload", f"{plan.n_gpu_layers} of {est.n_layers} layers: {spread or 'none'}"))
    elif machine.usable_gpus:
        rows.append(
            ("offload", f"{plan.n_gpu_layers} of {est.n_layers} layers on {machine.usable_gpus[0].name}")
        )
    else:
        rows.append(
            (
                "offload",
                "none: " + ("no GPU found" if not machine.gpus else "this llama.cpp build is CPU-only"),
            )
        )
    width = max(len(r[0]) for r in rows) + 2
    out.writelines(f"{label:<{width}}{value}\n" for label, value in rows)
    out.write("\n")
    out.writelines(line + "\n" for line in device_table(plan))
    out.write("\n")
    for part in held(plan):
        if part.partly_held:
            out.write(
                f"compute: of the {ui.human_bytes(part.compute_reserved_bytes)} llama.cpp reserves on the "
                f"{part.device.upper()}, the process holds only the pages a batch writes\n"
            )
    out.write("other: in no buffer (vocabulary, KV cell bookkeeping, work buffers, a GPU's context)\n")
    out.write(f"verdict: {verdict(plan)}\n")
    if est.compute_from_engine:
        out.write("compute buffers: llama.cpp's own figures, from a dry run of this load\n")
    if chose:
        out.write(f"chosen for this machine: {'; '.join(chose)}\n")
    if plan.alternatives:
        out.write(f"would fit: {' or '.join(plan.alternatives)}\n")
    if speed and plan.fits:
        out.write(f"decode: ~{speed:.0f} tok/s at most (estimate: bytes read per token / memory bandwidth)\n")


def _per_quant(ref: HubRef, request: Request, machine: Machine, out: TextIO) -> None:
    commit, files = fetch.remote_listing(ref)
    rows: list[tuple[Choice, ModelHeaders, Plan, int | None]] = []
    for choice in offer(files):
        model = read_remote(ref, commit, choice, quiet=True)
        if not rows:  # the quants of one model: its trained context is theirs
            _warn(model.merged, machine, request)
        plan = _plan(model.merged, machine, request)
        largest = _largest_ctx(model.merged, machine, request, plan)
        rows.append((choice, model, plan, largest))
    if request.as_json:
        out.write(
            json.dumps(
                [
                    {
                        "quant": c.quant,
                        "file": c.primary.path,
                        "size_bytes": m.size,
                        "fits": p.fits,
                        "verdict": verdict(p),
                        "ctx": p.n_ctx // p.n_seq,
                        "gpu_layers": p.n_gpu_layers,
                        "largest_ctx": big,
                    }
                    for c, m, p, big in rows
                ]
            )
            + "\n"
        )
        return
    out.write(f"{'quant':<10}{'size':>10}  {'verdict':<30}{'largest context':>16}  file\n")
    for choice, model, plan, largest in rows:
        big = f"{largest:,}" if largest else "-"
        out.write(
            f"{(choice.quant or '?'):<10}{ui.human_bytes(model.size):>10}  {verdict(plan):<30}{big:>16}  "
            f"{choice.primary.path}\n"
        )


def _largest_ctx(header: GGUFHeader, machine: Machine, request: Request, plan: Plan) -> int | None:
    """The largest context up to the trained one that fits with the plan's offload."""
    kv = request.kv_type or "f16"
    return largest_context(
        header,
        machine,
        upper=trained_context(header) or 4096,
        n_gpu_layers=plan.n_gpu_layers,
        kv=(kv, kv),
        n_seq=request.parallel,
    )


def cpu_bandwidth() -> float:
    """Bytes per second one core moves in a memcpy (read + write), best of three, pages touched first."""
    src = bytearray(b"\x01") * BANDWIDTH_PROBE_BYTES
    dst = bytearray(src)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        dst[:] = src
        best = min(best, time.perf_counter() - start)
    return 2 * BANDWIDTH_PROBE_BYTES / best if best > 0 else 0.0


def bytes_per_token(header: GGUFHeader, plan: Plan) -> int:
    """Weights read to decode one token: all but the embedding table (one row), active experts only."""
    n_expert = header.arch_get("expert_count") or 0
    n_used = header.arch_get("expert_used_count") or 0
    total = 0
    for t in header.tensors:
        if t.name == "token_embd.weight":
            continue
        share = n_used / n_expert if n_expert and "_exps" in t.name else 1.0
        total += int(t.nbytes * share)
    return total + plan.estimate.kv_bytes // 8  # the cache read at about an eighth full


def decode_speed(header: GGUFHeader, plan: Plan, machine: Machine) -> float | None:
    """Tokens per second if decode is bound by memory bandwidth, the layers split as planned.

    GPU bandwidth comes from NVML (memory clock x bus width); without it a GPU plan gets no figure.
    """
    per_token = bytes_per_token(header, plan)
    gpu_share = plan.n_gpu_layers / plan.estimate.n_layers if plan.estimate.n_layers else 0.0
    seconds = 0.0
    if gpu_share:
        gpu_bw = machine.usable_gpus[0].bandwidth if machine.usable_gpus else None
        if not gpu_bw:
            return None
        seconds += per_token * gpu_share / gpu_bw
    if gpu_share < 1:
        cpu_bw = cpu_bandwidth()
        if not cpu_bw:
            return None
        seconds += per_token * (1 - gpu_share) / cpu_bw
    return 1 / seconds if seconds > 0 else None
