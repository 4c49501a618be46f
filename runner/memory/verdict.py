"""A plan and its verdicts, and how they are told: what each device must hold (Held), the table `fit`
and a refusal print, and the refusal's one line. The plan itself is made in runner.memory.plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from runner import ui
from runner.memory.estimate import Estimate


@dataclass(frozen=True)
class Verdict:
    device: str  # "cpu" or "gpu"
    needed_bytes: int
    budget_bytes: int  # what the device has now, less the margin

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.budget_bytes


@dataclass(frozen=True)
class Plan:
    n_ctx: int
    n_gpu_layers: int  # layers on the GPU, the output layer counting as one; 0: CPU only
    type_k: str
    type_v: str
    estimate: Estimate
    verdicts: tuple[Verdict, ...]
    alternatives: tuple[str, ...] = field(default_factory=tuple)  # options that fit, when this does not
    use_gpu: bool = (
        False  # False on a GPU machine: load with no GPU device (no VRAM at all, not even compute)
    )
    flash_attn: bool | None = None  # None: llama.cpp's "auto"
    n_seq: int = 1  # sequences decoded together (--parallel), sharing n_ctx

    @property
    def fits(self) -> bool:
        return all(v.fits for v in self.verdicts)

    @property
    def full_offload(self) -> bool:
        return self.n_gpu_layers == self.estimate.n_layers


@dataclass(frozen=True)
class Held:
    """What one device must hold, in parts that add up to what its verdict counts (needed_bytes). On
    the CPU that is the process's resident memory (Estimate.host_rss_bytes): the mapped weights
    whole, and of the compute buffer llama.cpp reserves (compute_reserved_bytes) only the pages a
    batch writes. `projector`: a vision projector's share (--mmproj: its weights, its encoder's compute
    buffer, and on the CPU its memory in no buffer). `beside`: what is held beside the plan's context
    (a server's embedding context)."""

    device: str
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    output_bytes: int
    other_bytes: int  # in no buffer: the vocabulary, the KV cells' bookkeeping, work buffers, CUDA's context
    compute_reserved_bytes: int
    verdict: Verdict
    beside_bytes: int = 0
    projector_bytes: int = 0

    @property
    def partly_held(self) -> bool:
        """Only part of the compute buffer is held, by more than the table's rounding."""
        return ui.human_bytes(self.compute_bytes) != ui.human_bytes(self.compute_reserved_bytes)


def held(plan: Plan, beside: dict[str, int] | None = None) -> list[Held]:
    """Per device, the parts of what its verdict counts: they add up to needed_bytes. `beside`: bytes
    per device held beside the plan's context (runner serve's embedding context), counted in the
    verdict as runner serve counts them against its budget."""
    est = plan.estimate
    verdicts = {v.device: v for v in plan.verdicts}
    out = []
    for d in est.devices:
        v = verdicts[d.device]
        weights = d.weights_bytes
        if d.device == "cpu" and est.host_rss_bytes:  # check() counts the resident memory
            weights = sum(b.nbytes for b in est.buffers if b.device == "cpu" and b.kind == "model")
        parts = weights + d.kv_bytes + d.output_bytes + d.overhead_bytes + d.projector_bytes
        compute = v.needed_bytes - parts
        extra = (beside or {}).get(d.device, 0)
        if extra:
            v = replace(v, needed_bytes=v.needed_bytes + extra)
        out.append(
            Held(
                d.device,
                weights,
                d.kv_bytes,
                compute,
                d.output_bytes,
                d.overhead_bytes,
                d.compute_bytes,
                v,
                extra,
                d.projector_bytes,
            )
        )
    return out


def device_table(plan: Plan, beside: dict[str, int] | None = None, beside_label: str = "") -> list[str]:
    """Per device what it must hold (weights, KV cache, compute, output, other, a vision projector's
    share, and what is held beside the plan's context under `beside_label`: they add up to its needs),
    what it has and whether
    that fits: aligned text lines. A compute buffer of which only part is held (the CPU's) shows
    both: "12.0 MB of 539.5 MB"."""
    extra = bool(beside and any(beside.values()))
    vision = plan.estimate.projector_bytes > 0
    parts = (
        "device",
        "weights",
        "KV cache",
        "compute",
        "output",
        "other",
        *(("projector",) if vision else ()),
    )
    header: tuple[str, ...] = (*parts, *((beside_label,) if extra else ()), "needs", "available", "")
    table: list[tuple[str, ...]] = [header]
    for h in held(plan, beside):
        compute = ui.human_bytes(h.compute_bytes)
        if h.partly_held:
            compute += f" of {ui.human_bytes(h.compute_reserved_bytes)}"
        table.append(
            (
                h.device.upper(),
                ui.human_bytes(h.weights_bytes),
                ui.human_bytes(h.kv_bytes),
                compute,
                ui.human_bytes(h.output_bytes),
                ui.human_bytes(h.other_bytes),
                *((ui.human_bytes(h.projector_bytes),) if vision else ()),
                *((ui.human_bytes(h.beside_bytes),) if extra else ()),
                ui.human_bytes(h.verdict.needed_bytes),
                ui.human_bytes(h.verdict.budget_bytes),
                "fits" if h.verdict.fits else "DOES NOT FIT",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in table
    ]


def describe_refusal(name: str, plan: Plan, smaller_quants: list[str] | None = None) -> str:
    """One line: what does not fit where, each short device's need (and a vision projector's share of
    it) against what it has, and the nearest options that fit."""
    vision = {d.device: d.projector_bytes for d in plan.estimate.devices}
    short = []
    for v in plan.verdicts:
        if v.fits:
            continue
        needs = ui.human_bytes(v.needed_bytes)
        if vision.get(v.device):
            needs += f", {ui.human_bytes(vision[v.device])} of it for the projector"
        short.append(f"{v.device.upper()} needs {needs}, has {ui.human_bytes(v.budget_bytes)}")
    workers = any(d.device not in ("cpu", "gpu") for d in plan.estimate.devices)
    where = "across the workers" if workers else "on the GPU" if plan.n_gpu_layers else "in RAM"
    tries = list(plan.alternatives) + [f"a smaller quant: {q}" for q in smaller_quants or []]
    options = "; try " + " or ".join(tries) if tries else ""
    per_seq = plan.n_ctx // plan.n_seq  # what --ctx gives, in every command
    context = f"a {per_seq:,}-token context" + (
        f" for each of {plan.n_seq} sequences" if plan.n_seq > 1 else ""
    )
    return (
        f"{name} does not fit {where} at {context} ({', '.join(short)}){options}; "
        "`runner fit` shows the whole estimate, --force loads it anyway"
    )
