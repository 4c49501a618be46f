"""Will it fit? From a GGUF header and this machine to an offload, a context and a verdict.

The estimate is runner.memory.estimate's (what the pinned llama.cpp allocates); the plan adds a
safety margin per device and searches: the context the user asked for (or the largest up to
DEFAULT_CTX_CAP and the trained context, halving), at each an f16 then a q8_0 KV cache unless one was
asked for, every layer on the GPU if the build can offload, else as many layers as fit. When nothing
fits it names the nearest options that do. Where the estimate only approximates (a GPU device, an
architecture without its own graph), confirm() checks the plan against llama.cpp's own dry run of
the load, which the loader passes in. A vision projector (--mmproj: runner.memory.projector) is
counted with the model in every option tried, on the device libmtmd would put it. What a plan is
asked for, the flags and the rest, comes as one Ask.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from runner.errors import InvalidSetting
from runner.limits import DEFAULT_CTX, MAX_INT32, check_ctx, check_range
from runner.memory.devices import Machine
from runner.memory.estimate import Estimate, Load, estimate, with_compute
from runner.memory.projector import ProjectorMemory
from runner.memory.verdict import Held as Held  # re-exported: what a plan holds, as tables say it
from runner.memory.verdict import Plan, Verdict
from runner.memory.verdict import describe_refusal as describe_refusal
from runner.memory.verdict import device_table as device_table
from runner.memory.verdict import held as held

DEFAULT_CTX_CAP = DEFAULT_CTX  # without --ctx: the trained context, at most this
MIN_AUTO_CTX = 2048  # without --ctx, a smaller context than this is offered, not chosen
CPU_MARGIN = 0.10  # of the RAM available now: the OS, the shell, other programs
GPU_MARGIN_MIN = 256 << 20  # per GPU: at least this, or GPU_MARGIN of its memory
GPU_MARGIN = 0.03


@dataclass(frozen=True)
class Ask:
    """What a plan is asked for (make_plan's, confirm's): the flags as a load gives them, None leaving
    the choice to the plan. A variation of one is dataclasses.replace of it."""

    ctx: int | None = None  # the context in all, n_seq sequences' together; None: the trained one or less
    gpu_layers: int | None = None  # -1: every layer; None: all where the build offloads, or the most that fit
    kv_type: str | None = None  # K's and V's; None: f16, or q8_0 where f16 would not fit (see make_plan)
    flash_attn: bool | None = None  # None: llama.cpp's "auto"; False rules out a quantized V cache
    n_seq: int = 1  # sequences that share the context
    output_rows: int = 0  # the most rows of logits one decode asks for (estimate.Load.output_rows)
    projector: ProjectorMemory | None = None  # a vision projector loaded beside the model
    # what a dry run found the estimate's compute buffers off by, buffer type -> bytes (see confirm)
    adjust: Mapping[str, int] | None = None

    def load(self, n_ctx: int, n_gpu_layers: int, kv: tuple[str, str]) -> Load:
        """What estimate() is asked at this context, offload and cache (K, V), the rest as asked."""
        return Load(
            n_ctx=n_ctx,
            n_gpu_layers=n_gpu_layers,
            n_seq=self.n_seq,
            type_k=kv[0],
            type_v=kv[1],
            flash_attn=self.flash_attn,
            output_rows=self.output_rows,
            projector=self.projector,
        )


ASK_NOTHING = Ask()  # every choice the plan's: one sequence, no projector


def worker_shares(machine: Machine) -> tuple[tuple[str, float], ...]:
    """(endpoint, share) of the --rpc workers: the split the plan and the load use (tensor_split),
    by what each may hold."""
    have = budgets(machine)
    return tuple((w.endpoint, float(max(1, have[w.endpoint]))) for w in machine.workers)


def budgets(machine: Machine) -> dict[str, int]:
    out = {"cpu": int(machine.ram_available_bytes * (1 - CPU_MARGIN))}
    for worker in machine.workers:  # a worker's RAM, with the margin this machine's RAM gets
        out[worker.endpoint] = int(worker.free_bytes * (1 - CPU_MARGIN))
    gpus = machine.usable_gpus
    if gpus:  # one GPU: llama.cpp's layer split over several is not modelled yet
        gpu = gpus[0]
        out["gpu"] = max(0, gpu.free_bytes - max(GPU_MARGIN_MIN, int(gpu.total_bytes * GPU_MARGIN)))
    return out


def check(est: Estimate, machine: Machine) -> tuple[Verdict, ...]:
    have = budgets(machine)
    verdicts = []
    for usage in est.devices:
        needed = est.host_rss_bytes if usage.device == "cpu" and est.host_rss_bytes else usage.total_bytes
        verdicts.append(Verdict(usage.device, needed, have.get(usage.device, 0)))
    return tuple(verdicts)


def check_asked(*, ctx: int | None, gpu_layers: int | None) -> None:
    """--ctx and --gpu-layers within what llama.cpp takes (-1: every layer), else InvalidSetting."""
    if ctx is not None:
        check_ctx(ctx)
    if gpu_layers is not None:
        check_range(gpu_layers, "--gpu-layers", -1, MAX_INT32)


def trained_context(header: Any) -> int | None:
    value = header.arch_get("context_length")
    return value if isinstance(value, int) and value > 0 else None


def _try(header: Any, machine: Machine, load: Load, adjust: Mapping[str, int] | None = None) -> Plan:
    """The plan of one load, checked against this machine: with a GPU device where load.gpu says (None:
    where the build offloads; without one, no layer offloaded), the compute buffers corrected by
    `adjust` (Ask.adjust)."""
    use_gpu = machine.offloads if load.gpu is None else load.gpu
    load = replace(load, gpu=use_gpu, n_gpu_layers=load.n_gpu_layers if use_gpu else 0)
    workers = worker_shares(machine) if use_gpu else ()
    try:
        est = estimate(header, load, repack_types=machine.repack_types, workers=workers)
    except ValueError as exc:  # e.g. an unknown KV type, or a quantized V cache without flash attention
        raise InvalidSetting(f"--kv-type {load.type_v}: {exc}") from exc
    if adjust:  # what a dry run found the estimate's compute buffers to be off by
        mine = {b.name: b.nbytes for b in est.buffers if b.kind == "compute"}
        fixed = {n: max(0, mine.get(n, 0) + adjust.get(n, 0)) for n in {*mine, *adjust}}
        est = replace(with_compute(est, fixed), compute_from_engine=False)  # still to be confirmed
    return Plan(
        n_ctx=est.n_ctx,
        n_gpu_layers=est.n_gpu_layers,
        type_k=load.type_k,
        type_v=load.type_v,
        estimate=est,
        verdicts=check(est, machine),
        use_gpu=use_gpu,
        flash_attn=load.flash_attn,
        n_seq=load.n_seq,
    )


def _contexts(top: int, floor: int) -> list[int]:
    """top, then halvings down to floor (each a multiple of 256, as llama.cpp pads them)."""
    out, n = [], top
    while n >= floor:
        out.append(n)
        n //= 2
    return out or [top]


def _most_layers(attempt: Callable[[Load], Plan | None], load: Load) -> Plan | None:
    """The plan with the most GPU layers that fits, load's otherwise (binary search; fewer layers, less
    VRAM): each offload tried by `attempt` (None: not an option)."""
    full = attempt(replace(load, n_gpu_layers=-1))
    if full is None:
        return None
    # fewer layers offloaded: less on the GPU or workers, more here; so search the most layers the
    # offload devices hold (their need only grows with layers), then check this machine at that
    # count, where it holds least
    lo, hi, best = 0, full.estimate.n_layers, None
    while lo <= hi:
        mid = (lo + hi) // 2
        plan = attempt(replace(load, n_gpu_layers=mid))
        if plan is not None and all(v.fits for v in plan.verdicts if v.device != "cpu"):
            best, lo = plan, mid + 1
        else:
            hi = mid - 1
    return best if best is not None and best.fits else None


def make_plan(header: Any, machine: Machine, ask: Ask = ASK_NOTHING) -> Plan:
    """The offload and context to load with, for what `ask` asks (Ask); `fits` False means none was
    found (see alternatives).

    Without a kv_type the cache is f16, or q8_0 where that keeps the context or the full offload
    f16 would lose (q8_0 keys and values cost next to nothing in quality; llama.cpp needs flash
    attention for them, so a model without it stays f16). flash_attn None is llama.cpp's "auto";
    False rules out a quantized V cache. A vision projector (ask.projector) is counted in every option.
    """
    kv_type, gpu_layers = ask.kv_type, ask.gpu_layers
    kvs = [(kv_type, kv_type)] if kv_type else [("f16", "f16"), ("q8_0", "q8_0")]
    trained = trained_context(header) or DEFAULT_CTX_CAP
    top = ask.ctx or min(trained, DEFAULT_CTX_CAP)
    contexts = [top] if ask.ctx else _contexts(top, min(MIN_AUTO_CTX, top))
    gpu = machine.offloads
    layers = 0 if not gpu else (-1 if gpu_layers is None else gpu_layers)

    def attempt(load: Load) -> Plan | None:
        try:
            return _try(header, machine, load, ask.adjust)
        except InvalidSetting:
            if kv_type:  # the user's choice: say why it cannot be
                raise
            return None  # q8_0 without flash attention: not an option for this model

    first = _try(header, machine, ask.load(contexts[0], layers, kvs[0]), ask.adjust)
    for n_ctx in contexts:
        for kv in kvs:
            same = (n_ctx, kv) == (contexts[0], kvs[0])  # the first attempt is `first`: not twice
            plan = first if same else attempt(ask.load(n_ctx, layers, kv))
            if plan is not None and plan.fits:
                return plan
    if gpu and gpu_layers is None:
        partials = [p for kv in kvs if (p := _most_layers(attempt, ask.load(top, -1, kv)))]
        best = max(partials, key=lambda p: p.n_gpu_layers, default=None)  # f16 on a tie
        if best is not None and best.n_gpu_layers > 0:
            return best
        for n_ctx in contexts:  # with a GPU device, even 0 layers use VRAM for compute: drop the GPU
            for kv in kvs:
                cpu_only = attempt(replace(ask.load(n_ctx, 0, kv), gpu=False))
                if cpu_only is not None and cpu_only.fits:
                    return cpu_only
    found = _alternatives(header, machine, first, ask)
    return replace(first, alternatives=tuple(found))


DRY_RUN_ROUNDS = 3


def confirm(
    plan: Plan,
    header: Any,
    machine: Machine,
    dry: Callable[[Plan], dict[str, int] | None],
    ask: Ask = ASK_NOTHING,
) -> Plan:
    """plan, checked against llama.cpp's own compute buffers where the estimate only approximates
    them (a GPU device, an architecture without its own graph): `dry` is a dry run of the planned
    load (the engine's, which the loader passes in: runner.loader.dry_run_of). A plan the dry run
    shows not to fit is made again with the estimate corrected by what the dry run found (`ask`,
    what make_plan was asked for plan, with that correction as its adjust), and checked again."""
    adjust: dict[str, int] = dict(ask.adjust or {})
    for _ in range(DRY_RUN_ROUNDS):
        est = plan.estimate
        if est.exact or est.compute_from_engine:
            return plan
        real = dry(plan)
        if real is None:  # llama.cpp would not say: the estimate stands
            return plan
        checked_est = with_compute(est, real)
        checked = replace(plan, estimate=checked_est, verdicts=check(checked_est, machine))
        if checked.fits or not plan.fits:
            return checked
        mine = {b.name: b.nbytes for b in est.buffers if b.kind == "compute"}
        for name in {*mine, *real}:
            adjust[name] = adjust.get(name, 0) + real.get(name, 0) - mine.get(name, 0)
        plan = make_plan(header, machine, replace(ask, adjust=dict(adjust)))
    return checked


def departures(
    plan: Plan, header: Any, machine: Machine, *, ctx: int | None, gpu_layers: int | None, kv_type: str | None
) -> list[str]:
    """What the plan chose that the user did not ask for and would not assume: a context below the
    default, a quantized KV cache, layers left on the CPU though there is a GPU."""
    out = []
    default_ctx = min(trained_context(header) or DEFAULT_CTX_CAP, DEFAULT_CTX_CAP)
    if ctx is None and plan.n_ctx < default_ctx:
        out.append(f"a {plan.n_ctx:,}-token context ({default_ctx:,} would not fit)")
    if kv_type is None and plan.type_k != "f16":
        out.append(f"a {plan.type_k} KV cache (f16 would not fit)")
    if machine.workers and gpu_layers is None and not plan.full_offload:
        layers = f"{plan.n_gpu_layers} of {plan.estimate.n_layers} layers"
        out.append(f"{layers} on the workers, the rest on this machine's CPU")
    if machine.usable_gpus and gpu_layers is None:
        name = machine.usable_gpus[0].name
        if not plan.use_gpu:
            out.append(f"the CPU only ({name} has no room even for llama.cpp's compute buffer)")
        elif not plan.full_offload:
            layers = f"{plan.n_gpu_layers} of {plan.estimate.n_layers} layers"
            out.append(f"{layers} on {name}, the rest on the CPU (slower)")
    return out


def largest_context(
    header: Any, machine: Machine, load: Load, adjust: Mapping[str, int] | None = None
) -> int | None:
    """The largest --ctx up to load's that fits with load's offload, cache and the rest, or None:
    each sequence's context, as --ctx is in every command (a multiple of 256, as llama.cpp pads),
    load.n_seq of them in the KV cache; load.n_ctx is all of them, the most tried. `adjust`: as
    make_plan's (Ask.adjust)."""
    lo, hi, best = 1, load.n_ctx // load.n_seq // 256, None
    while lo <= hi:
        mid = (lo + hi) // 2
        plan = _try(header, machine, replace(load, n_ctx=mid * 256 * load.n_seq), adjust)
        if plan.fits:
            best, lo = mid * 256, mid + 1
        else:
            hi = mid - 1
    return best


def _alternatives(header: Any, machine: Machine, failed: Plan, ask: Ask) -> list[str]:
    """The nearest options that fit: a smaller context, a quantized KV cache, partial offload. With
    ask.adjust (a dry run's correction of the compute buffers, as make_plan got it) each is judged the
    way the failed plan was, so what is offered fits llama.cpp's own figures, not only the estimate's.
    Each is judged with a row of logits a sequence in the output buffer, not ask.output_rows."""
    out = []
    n_seq, adjust = ask.n_seq, ask.adjust
    per_seq = failed.n_ctx // n_seq  # as --ctx gives it
    upper = min(per_seq - 256, trained_context(header) or per_seq)
    layers = failed.n_gpu_layers or 0
    kv = (failed.type_k, failed.type_v)
    load = replace(ask.load(failed.n_ctx, layers, kv), output_rows=0)
    smaller = largest_context(header, machine, replace(load, n_ctx=upper * n_seq), adjust)
    if smaller:
        out.append(f"--ctx {smaller}")
    if failed.type_k == "f16":
        q8 = replace(load, type_k="q8_0", type_v="q8_0")
        try:
            if _try(header, machine, q8, adjust).fits:
                out.append("--kv-type q8_0")
            else:
                most = largest_context(header, machine, replace(q8, n_ctx=upper * n_seq), adjust)
                if most and (smaller is None or most > smaller):
                    out.append(f"--kv-type q8_0 --ctx {most}")
        except InvalidSetting:  # q8_0 V needs flash attention, which this model may not get
            pass
    if machine.offloads:
        partial = _most_layers(lambda each: _try(header, machine, each, adjust), load)
        if partial is not None and partial.n_gpu_layers < failed.estimate.n_layers:
            out.append(f"--gpu-layers {partial.n_gpu_layers}")
    return out
