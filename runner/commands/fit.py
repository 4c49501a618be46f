"""`runner fit`: weights, KV cache and compute per device, the plan, and a verdict, before any download."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from runner import loader, ui
from runner import projector as vision
from runner.gguf import GGUFHeader
from runner.hub import fetch
from runner.hub.catalog import load_catalog
from runner.hub.headers import ModelHeaders, read_model, read_remote
from runner.hub.quants import Choice, offer
from runner.hub.refs import HubRef, LocalRef, ModelRef, resolve
from runner.limits import check_range, flash_attn_name
from runner.memory import speed
from runner.memory.devices import Machine
from runner.memory.estimate import Load
from runner.memory.plan import (
    Held,
    Plan,
    check_asked,
    departures,
    device_table,
    held,
    largest_context,
    trained_context,
)
from runner.memory.projector import ProjectorMemory
from runner.memory.speed import Decode
from runner.settings import DEFAULTS, LoadSettings


@dataclass(frozen=True)
class Request:
    model: str
    settings: LoadSettings = DEFAULTS  # --ctx, --kv-type, --flash-attn, --gpu-layers, --mmproj, --offline
    parallel: int | None = None  # None: 1, or with --serve runner serve's default
    as_json: bool = False
    serve: bool = False  # plan as runner serve plans with the same flags, and count what it counts

    @property
    def planning(self) -> LoadSettings:
        """What the plan is asked, as loader.choose_plan takes it: the flags (with --parallel N, as
        `run --parallel`: --ctx is each sequence's, default 2048, N of them in all), and with --serve
        what runner serve asks beside them (loader.serve_planning)."""
        serving = loader.serve_planning(self.parallel) if self.serve else dict(parallel=self.parallel or 1)
        return replace(self.settings, **serving)


def fit_model(request: Request, *, out: TextIO) -> None:
    if request.parallel is not None:
        check_range(request.parallel, "--parallel", 1, 256)
    settings = request.settings
    check_asked(ctx=settings.ctx, gpu_layers=settings.gpu_layers)
    ref = resolve(request.model, load_catalog())
    machine = loader.machine()
    if isinstance(ref, HubRef) and ref.quant is None and ref.file is None and ref.entry is None:
        _per_quant(ref, request, machine, out)
        return
    model = read_model(ref, offline=settings.offline)
    warnings = _warn(model.merged, machine, request)
    projector = _projector(request, ref, model.merged)
    plan = _plan(model.merged, machine, request, model.path, projector)
    beside = loader.embedding_context(plan, model.merged) if request.serve else {}
    where = loader.speed_where(model.path, plan, machine)
    decode = speed.decode(model.merged, plan, machine, where)
    chose = _chose(plan, model.merged, machine, request) if plan.fits else []
    if request.as_json:
        report = {
            **to_json(ref, model, plan, machine, decode, beside, projector),
            "chosen": chose,
            "warnings": warnings,
        }
        out.write(json.dumps(report) + "\n")
        return
    _describe(ref, model, plan, machine, decode, out, chose, request.settings.ctx, beside, projector)


def _projector(request: Request, ref: ModelRef, header: GGUFHeader) -> ProjectorMemory | None:
    """--mmproj's memory (a file, or a Hub reference read remotely), or with --serve that of the
    projector pulled with the model, which serve attaches: counted as a load would count it."""
    found = vision.find(
        request.settings.mmproj, ref, paired=request.serve, offline=request.settings.offline, download=False
    )
    return vision.memory(found, header) if found is not None else None


def _chose(plan: Plan, header: GGUFHeader, machine: Machine, request: Request) -> list[str]:
    """What the plan chose that the flags did not say (plan.departures), and with --serve fewer
    sequences than runner serve's default where they would not fit, as serve chooses them."""
    asked = request.settings
    ctx = loader.total_ctx(asked.ctx, plan.n_seq)  # as plan_for asks it: a batch's context is set
    chose = departures(plan, header, machine, ctx=ctx, gpu_layers=asked.gpu_layers, kv_type=asked.kv_type)
    if request.serve and request.parallel is None and plan.n_seq < loader.SERVE_PARALLEL:
        chose.append(f"{plan.n_seq} sequences at once ({loader.SERVE_PARALLEL} would not fit)")
    return chose


def _warn(header: GGUFHeader, machine: Machine, request: Request) -> list[str]:
    """What run would say of the same settings, said the same way (on stderr), and returned."""
    asked = request.settings
    warnings = loader.setting_warnings(header, machine, ctx=asked.ctx, gpu_layers=asked.gpu_layers)
    for warning in warnings:
        ui.warn(warning)
    return warnings


def _plan(
    header: GGUFHeader,
    machine: Machine,
    request: Request,
    path: Path | None = None,
    projector: ProjectorMemory | None = None,
) -> Plan:
    """The plan a load with the same settings makes (loader.choose_plan: run's, or with --serve
    serve's); for a local file checked by a dry run where the estimate approximates. `projector`:
    --mmproj's memory, counted as run --mmproj counts it."""
    return loader.choose_plan(header, machine, request.planning, path=path, projector=projector)[0]


def fits(plan: Plan, beside: dict[str, int] | None = None) -> bool:
    """Every device holds what it needs: the plan's, and what is held beside it (--serve)."""
    return all(h.verdict.fits for h in held(plan, beside))


def verdict(plan: Plan, beside: dict[str, int] | None = None) -> str:
    if not fits(plan, beside):
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
    ref: LocalRef | HubRef,
    model: ModelHeaders,
    plan: Plan,
    machine: Machine,
    decode: Decode | None,
    beside: dict[str, int] | None = None,
    projector: ProjectorMemory | None = None,
) -> dict:
    est = plan.estimate
    parts = held(plan, beside)
    serving = None
    if beside:  # --serve: what runner serve asks beside the flags, and holds beside the plan's context
        serving = {"output_rows": loader.serve_planning(plan.n_seq)["output_rows"]}
        serving["embedding_bytes"] = sum(beside.values())
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
        "fits": fits(plan, beside),
        "verdict": verdict(plan, beside),
        # what the verdict counts on every device (the table's needs; with --serve, what runner serve
        # counts against its budget); estimate.total_bytes is what llama.cpp reserves, compute whole
        "needs_bytes": sum(h.verdict.needed_bytes for h in parts),
        "serve": serving,
        "estimate": {
            "weights_bytes": est.weights_bytes,
            "kv_bytes": est.kv_bytes,
            "compute_bytes": est.compute_bytes,
            "output_bytes": est.output_bytes,
            "overhead_bytes": est.overhead_bytes,
            "projector_bytes": est.projector_bytes,
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
                "embedding_bytes": h.beside_bytes,
                "projector_bytes": h.projector_bytes,
                "total_bytes": h.verdict.needed_bytes,
                "available_bytes": h.verdict.budget_bytes,
                "fits": h.verdict.fits,
            }
            for h in parts
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
        "decode": decode.to_json() if decode else None,
        "projector": _projector_json(plan, projector) if projector else None,
    }


def projector_parts(plan: Plan) -> dict[str, tuple[int, int, int]]:
    """A vision projector's share by device, as the plan places it: (weights, encoder compute buffer,
    the rest: on the CPU its memory in no buffer)."""
    out = {}
    for d in plan.estimate.devices:
        if not d.projector_bytes:
            continue
        weights, compute = (
            sum(b.nbytes for b in plan.estimate.buffers if b.device == d.device and b.kind == kind)
            for kind in ("mmproj", "mmproj compute")
        )
        out[d.device] = (weights, compute, d.projector_bytes - weights - compute)
    return out


def _projector_json(plan: Plan, projector: ProjectorMemory) -> dict[str, Any]:
    return {
        "type": projector.projector_type,
        "image_tokens": projector.image_tokens,  # an image of image_size (idefics3: a tile of it)
        "tiles": projector.tiles,
        "most_image_tokens": projector.most_tokens,  # the most one image takes
        "image_size": projector.image_size,
        "tensor_bytes": projector.tensor_bytes,
        "devices": [
            {"device": device, "weights_bytes": w, "compute_bytes": c, "other_bytes": o}
            for device, (w, c, o) in projector_parts(plan).items()
        ],
    }


def _describe(
    ref: LocalRef | HubRef,
    model: ModelHeaders,
    plan: Plan,
    machine: Machine,
    decode: Decode | None,
    out: TextIO,
    chose: list[str],
    asked_ctx: int | None,
    beside: dict[str, int] | None = None,
    projector: ProjectorMemory | None = None,
) -> None:
    """fit's report: what was planned, the device table and what its columns hold, then the verdict."""
    rows = _summary_rows(ref, model, plan, machine, asked_ctx, beside)
    width = max(len(r[0]) for r in rows) + 2
    out.writelines(f"{label:<{width}}{value}\n" for label, value in rows)
    out.write("\n")
    out.writelines(line + "\n" for line in device_table(plan, beside, "embedding"))
    out.write("\n")
    parts = held(plan, beside)
    out.writelines(_table_notes(plan, parts, beside, projector))
    out.writelines(_verdict_lines(plan, parts, beside, decode, chose))


def _summary_rows(
    ref: LocalRef | HubRef,
    model: ModelHeaders,
    plan: Plan,
    machine: Machine,
    asked_ctx: int | None,
    beside: dict[str, int] | None,
) -> list[tuple[str, str]]:
    """The report's head, (label, value) a row: the model, its context, KV cache, flash attention,
    the offload, and with --serve what serve would plan."""
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
        (
            "KV cache type",
            plan.type_k if est.kv_bytes else f"none: llama.cpp keeps no KV cache for {h.architecture}",
        ),
        ("flash attention", flash_attn_name(plan.flash_attn)),
        ("offload", _offload(plan, machine)),
    ]
    if beside:
        rows.append(("served", "as runner serve plans it with these flags: " + _serving(plan)))
    return rows


def _offload(plan: Plan, machine: Machine) -> str:
    """The layers the plan offloads, and where: the workers, the GPU, or none and why."""
    est = plan.estimate
    if machine.workers:
        spread = ", ".join(f"{n} on {e}" for e, n in layers_per_worker(plan, machine)) if plan.use_gpu else ""
        return f"{plan.n_gpu_layers} of {est.n_layers} layers: {spread or 'none'}"
    if machine.usable_gpus:
        return f"{plan.n_gpu_layers} of {est.n_layers} layers on {machine.usable_gpus[0].name}"
    return "none: " + ("no GPU found" if not machine.gpus else "this llama.cpp build is CPU-only")


def _table_notes(
    plan: Plan, parts: list[Held], beside: dict[str, int] | None, projector: ProjectorMemory | None
) -> list[str]:
    """What the device table's columns hold, a line each, where that needs saying."""
    lines = []
    for part in parts:
        if part.partly_held:
            lines.append(
                f"compute: of the {ui.human_bytes(part.compute_reserved_bytes)} llama.cpp reserves on the "
                f"{part.device.upper()}, the process holds only the pages a batch writes\n"
            )
    lines.append("other: in no buffer (vocabulary, KV cell bookkeeping, work buffers, a GPU's context)\n")
    if projector is not None:
        lines += _projector_lines(plan, projector)
    if beside:
        lines.append(
            "embedding: the context runner serve makes at a model's first embedding request, counted "
            "against its budget from the load on; not counted: prompt states kept between requests "
            "(--cache-ram), made from memory free then\n"
        )
    return lines


def _verdict_lines(
    plan: Plan, parts: list[Held], beside: dict[str, int] | None, decode: Decode | None, chose: list[str]
) -> list[str]:
    """What it needs in all, what llama.cpp reserves, the verdict, and what the plan chose or would."""
    est = plan.estimate
    needs = sum(p.verdict.needed_bytes for p in parts)
    counted = "what runner serve counts against its budget" if beside else "what the verdict counts"
    lines = [
        f"needs: {needs / 1e6:,.0f} MB in all (--json needs_bytes: {counted})\n",
        f"llama.cpp reserves: {est.total_bytes / 1e6:,.0f} MB for this context (--json estimate.total_bytes:"
        " its buffers, the compute buffers whole)\n",
        f"verdict: {verdict(plan, beside)}\n",
    ]
    if est.compute_from_engine:
        lines.append("compute buffers: llama.cpp's own figures, from a dry run of this load\n")
    if chose:
        lines.append(f"chosen for this machine: {'; '.join(chose)}\n")
    if plan.alternatives:
        lines.append(f"would fit: {' or '.join(plan.alternatives)}\n")
    if decode and fits(plan, beside):
        lines.append(f"decode: {decode.describe()}\n")
    if plan.n_seq > 1 and not beside:
        lines.append(
            "served: runner serve counts more with these flags (logprob rows, an embedding context): "
            "add --serve\n"
        )
    return lines


def _projector_lines(plan: Plan, projector: ProjectorMemory) -> list[str]:
    """What the table's projector column holds: per device its weights and encoder compute buffer
    (and on the CPU its memory in no buffer), as libmtmd would place them for this plan."""
    kind = f"{projector.projector_type}, {projector.per_image()}"
    lines = []
    for device, (weights, compute, other) in projector_parts(plan).items():
        parts = [f"{ui.human_bytes(weights)} of weights"] if weights else []
        parts.append(f"a {ui.human_bytes(compute)} encoder compute buffer")
        if other:
            what = "graph metadata, the image, its embeddings, work buffer"
            parts.append(f"{ui.human_bytes(other)} in no buffer ({what})")
        held = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
        lines.append(f"projector: {kind}: on the {device.upper()} {held}\n")
    return lines


def _serving(plan: Plan) -> str:
    rows = loader.serve_planning(plan.n_seq)["output_rows"]
    return (
        f"{ui.count(plan.n_seq, 'sequence')} at once, an output buffer of {rows} rows of logits "
        "(a scored prompt), an embedding context"
    )


def _per_quant(ref: HubRef, request: Request, machine: Machine, out: TextIO) -> None:
    commit, files = fetch.remote_listing(ref)
    rows: list[tuple[Choice, ModelHeaders, Plan, int | None, str]] = []
    projector = None
    for choice in offer(files):
        model = read_remote(ref, commit, choice, quiet=True)
        if not rows:  # the quants of one model: its trained context and its width are theirs
            _warn(model.merged, machine, request)
            projector = _projector(request, ref, model.merged)
        plan = _plan(model.merged, machine, request, projector=projector)
        largest = _largest_ctx(model.merged, machine, request, plan, projector)
        beside = loader.embedding_context(plan, model.merged) if request.serve else {}
        rows.append((choice, model, plan, largest, verdict(plan, beside)))
    if request.as_json:
        out.write(
            json.dumps(
                [
                    {
                        "quant": c.quant,
                        "file": c.primary.path,
                        "size_bytes": m.size,
                        "fits": said != "does not fit",
                        "verdict": said,
                        "ctx": p.n_ctx // p.n_seq,
                        "gpu_layers": p.n_gpu_layers,
                        "largest_ctx": big,
                    }
                    for c, m, p, big, said in rows
                ]
            )
            + "\n"
        )
        return
    out.write(f"{'quant':<10}{'size':>10}  {'verdict':<30}{'largest context':>16}  file\n")
    for choice, model, _plan_of, largest, said in rows:
        big = f"{largest:,}" if largest else "-"
        out.write(
            f"{(choice.quant or '?'):<10}{ui.human_bytes(model.size):>10}  {said:<30}{big:>16}  "
            f"{choice.primary.path}\n"
        )


def _largest_ctx(
    header: GGUFHeader, machine: Machine, request: Request, plan: Plan, projector: ProjectorMemory | None
) -> int | None:
    """The largest context up to the trained one that fits with the plan's offload (and --mmproj's
    projector)."""
    kv = request.settings.kv_type or "f16"
    upper = trained_context(header) or 4096  # each sequence's
    load = Load(
        n_ctx=upper * plan.n_seq,
        n_gpu_layers=plan.n_gpu_layers,
        n_seq=plan.n_seq,
        type_k=kv,
        type_v=kv,
        projector=projector,
    )
    return largest_context(header, machine, load)
