"""Decode speed before a load: what `runner bench` measured of this model here, else an upper bound.

`runner bench` keeps its tg128 figure per model file, machine (CPU, cores, llama.cpp build), threads
and device (`remember`); `runner fit` shows that figure, with its date, when one matches (`decode`).
Where none does it shows the memory-bandwidth bound (bytes read per token / bandwidth), said to be
one: on a few CPU cores decode is bound by compute and per-layer costs, several times below it, and
by a share that differs from model to model (this 2-core Xeon: SmolLM2, Q4_1, at 0.2-0.5 of its
bound; a 245 MB Q8_0 llama with half its layers at about 1), so a bound scaled by another model's
share would be off by 2x or more. What bench measured of the model nearest in size is shown beside
the bound, for scale, not as an estimate.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from runner.memory.devices import Machine
from runner.memory.plan import Plan

BANDWIDTH_PROBE_BYTES = 64 << 20
STORE = "speed.json"  # under runner's cache dir (runner.paths.cache_dir)
MEASURED, BOUND = "measured", "bound"


# -- the bound ----------------------------------------------------------------------------------


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


def bytes_per_token(header: Any, plan: Plan) -> int:
    """Weights read to decode one token: all but the embedding table (one row of it), active experts
    only; a model without its own output matrix reads the whole embedding table for its logits."""
    n_expert = header.arch_get("expert_count") or 0
    n_used = header.arch_get("expert_used_count") or 0
    tied = all(t.name != "output.weight" for t in header.tensors)
    total = 0
    for t in header.tensors:
        if t.name == "token_embd.weight" and not tied:
            continue
        share = n_used / n_expert if n_expert and "_exps" in t.name else 1.0
        total += int(t.nbytes * share)
    return total + plan.estimate.kv_bytes // 8  # the cache read at about an eighth full


def bound(header: Any, plan: Plan, machine: Machine) -> float | None:
    """Tokens per second if decode were bound by memory bandwidth alone, the layers split as planned:
    an upper bound. GPU bandwidth comes from NVML (memory clock x bus width); without it a GPU plan
    gets no figure."""
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


# -- what a measurement is of -------------------------------------------------------------------


@dataclass(frozen=True)
class Where:
    """What a decode speed holds for: the model file, this machine with this llama.cpp build, the
    threads (the most the engine may use), the devices the layers are on."""

    file: str  # the model file's real path; "" for a model not on this machine (nothing measured)
    size: int
    mtime_ns: int
    machine: str  # machine_id()
    threads: int
    device: str  # device_of()

    @property
    def device_class(self) -> str:
        """The device without the layer count: where a measurement may calibrate another model's bound."""
        return self.device.split(": ")[0]


def model_file(path: Path) -> tuple[str, int, int]:
    """(real path, size, mtime_ns): a model file as a measurement names it (a copy or a new download
    of it is another file, measured again)."""
    real = path.resolve()
    st = real.stat()
    return str(real), st.st_size, st.st_mtime_ns


def machine_id(build: str) -> str:
    """This machine as its speed depends on it: the CPU's model and counts, and the llama.cpp build
    (`build`: its version and the CPU features it was compiled for, from the engine)."""
    import hashlib

    text = "|".join([cpu_name(), str(os.cpu_count()), build])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's word for it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def device_of(plan: Plan, machine: Machine) -> str:
    """Where the plan decodes: "cpu", or the GPU (or the --rpc workers) with the layers it holds."""
    if not plan.use_gpu or plan.n_gpu_layers == 0:
        return "cpu"
    if machine.workers:
        where = "rpc " + ",".join(w.endpoint for w in machine.workers)
    else:
        where = machine.usable_gpus[0].name if machine.usable_gpus else "gpu"
    return f"{where}: {plan.n_gpu_layers} of {plan.estimate.n_layers} layers"


# -- measurements kept --------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One `runner bench` figure, kept: tg128 and, for calibrating other models, its bound."""

    model: str  # the name bench was given, to show
    tokens_per_s: float  # tg128's median
    bound_tokens_per_s: float | None  # bound() of the plan bench loaded, then
    bytes_per_token: int
    measured_at: str  # ISO 8601, UTC


def _store() -> Path:
    from runner.paths import cache_dir

    return cache_dir() / STORE


def _records() -> list[dict[str, Any]]:
    try:
        found = json.loads(_store().read_text())
    except (OSError, ValueError):
        return []
    return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []


def remember(where: Where, measured: Measured) -> None:
    """Keep a measurement, in place of any earlier one of the same model, machine, threads and device.
    An unwritable cache keeps nothing (bench's figures are printed either way)."""
    key = asdict(where)
    kept = [r for r in _records() if {k: r.get(k) for k in key} != key]
    kept.append({**key, **asdict(measured)})
    path = _store()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass


def _measured(record: dict[str, Any]) -> Measured | None:
    try:
        return Measured(
            str(record["model"]),
            float(record["tokens_per_s"]),
            None if record.get("bound_tokens_per_s") is None else float(record["bound_tokens_per_s"]),
            int(record["bytes_per_token"]),
            str(record["measured_at"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def lookup(where: Where) -> Measured | None:
    """What bench measured of exactly this (model, machine, threads, device), if it did."""
    key = asdict(where)
    for record in _records():
        if {k: record.get(k) for k in key} == key:
            return _measured(record)
    return None


def nearest(where: Where, per_token: int) -> Measured | None:
    """Of bench's measurements on this machine at the same threads and device class, with a bound, the
    model nearest in bytes read per token (the bound is furthest off for the smallest models)."""
    found = []
    for record in _records():
        m = _measured(record)
        same = (record.get("machine"), record.get("threads")) == (where.machine, where.threads)
        device = str(record.get("device", "")).split(": ")[0]
        if m and same and device == where.device_class and m.bound_tokens_per_s and m.bytes_per_token > 0:
            found.append(m)
    if not found or per_token <= 0:
        return None
    latest_first = sorted(found, key=lambda m: m.measured_at, reverse=True)  # a tie: the latest
    return min(latest_first, key=lambda m: abs(math.log(m.bytes_per_token / per_token)))


# -- the figure fit shows -----------------------------------------------------------------------


@dataclass(frozen=True)
class Decode:
    """A decode speed and what it is: bench's measurement of this model here (MEASURED), or the
    memory-bandwidth bound (BOUND), with what bench measured here of the model nearest in size against
    its own bound, to show how far below the bound this machine decodes (`nearest`)."""

    tokens_per_s: float
    source: str  # MEASURED or BOUND
    measured_at: str | None = None  # MEASURED: when bench measured it
    nearest: Measured | None = None  # BOUND: bench's measurement here of the model nearest in size

    @property
    def nearest_of_bound(self) -> float | None:
        """The nearest model's measured speed as a share of its own bound."""
        near = self.nearest
        return near.tokens_per_s / near.bound_tokens_per_s if near and near.bound_tokens_per_s else None

    def describe(self) -> str:
        rate = f"~{self.tokens_per_s:.0f} tok/s"
        if self.source == MEASURED:
            return f"{rate} (measured by runner bench on this machine, {_day(self.measured_at)})"
        near, share = self.nearest, self.nearest_of_bound
        seen = (
            f"runner bench measured {near.model} here at {share:.2f} of its bound ({near.tokens_per_s:.0f} "
            "tok/s), but that share differs from model to model"
            if near and share
            else "on a CPU decode is often several times slower"
        )
        return (
            f"{rate} at most (an upper bound: bytes read per token / memory bandwidth; {seen}; "
            "runner bench MODEL measures it, and fit shows that figure after)"
        )

    def to_json(self) -> dict[str, Any]:
        near, share = self.nearest, self.nearest_of_bound
        return {
            "tokens_per_s": round(self.tokens_per_s, 1),
            "source": self.source,
            "measured_at": self.measured_at,
            "nearest_measured": (
                {"model": near.model, "tokens_per_s": near.tokens_per_s, "of_bound": round(share, 3)}
                if near and share
                else None
            ),
        }


def decode(header: Any, plan: Plan, machine: Machine, where: Where | None) -> Decode | None:
    """The decode speed fit shows: bench's measurement of this model here, else the bound (with the
    nearest model bench measured here, for scale). `where`: the model, machine, threads and device it
    would run on (None: the bound alone)."""
    if where is not None and where.file:
        found = lookup(where)
        if found is not None:
            return Decode(found.tokens_per_s, MEASURED, found.measured_at)
    limit = bound(header, plan, machine)
    if limit is None:
        return None
    near = nearest(where, bytes_per_token(header, plan)) if where is not None else None
    return Decode(limit, BOUND, nearest=near)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _day(moment: str | None) -> str:
    return (moment or "")[:10]
