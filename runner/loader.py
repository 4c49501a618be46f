"""MODEL as typed -> a verified local GGUF -> a checked header -> a plan -> a loaded engine.

Every command opens models here, so a bad file fails before llama.cpp sees it, and a model that will
not fit is refused before anything is allocated (unless forced), with the options that would fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner import ui
from runner.catalog import load_catalog
from runner.engine import Engine
from runner.errors import WontFit
from runner.gguf import GGUFHeader, read_header
from runner.plan import Plan, check_asked, confirm, departures, dry_run_of, make_plan, trained_context
from runner.refs import HubRef, resolve
from runner.sampling import check_range

MAX_THREADS = 1024


@dataclass
class LoadedModel:
    name: str
    path: Path
    header: GGUFHeader
    plan: Plan
    engine: Engine

    def close(self) -> None:
        self.engine.close()


def plan_for(
    header: GGUFHeader,
    name: str,
    *,
    ctx: int | None = None,
    gpu_layers: int | None = None,
    kv_type: str | None = None,
    force: bool = False,
    smaller: Callable[[], list[str]] | None = None,
    path: Path | None = None,
) -> Plan:
    """The plan to load with; refuses (WontFit) what this machine cannot hold, unless forced.

    A refusal prints the estimate's table on stderr and names the nearest options that fit; `smaller`
    lists smaller quants of the same repo that fit (asked only when refusing: it reads remote headers).
    With the model's `path`, a plan whose compute buffers the estimate only approximates is checked
    by a dry run of the load (plan.confirm); without it, that check is left to a later call.
    """
    from runner import devices

    trained = trained_context(header)
    if ctx is not None and trained is not None and ctx > trained:
        ui.warn(
            f"--ctx {ctx} is beyond the {trained:,} tokens this model was trained on; answers may degrade"
        )
    machine = devices.probe()
    hint = machine.reinstall_hint()
    if hint:
        ui.warn(f"this llama.cpp build cannot use the {machine.gpus[0].name}; for a GPU build: {hint}")
    asked: dict[str, Any] = dict(ctx=ctx, gpu_layers=gpu_layers, kv_type=kv_type)
    plan = make_plan(header, machine, **asked)
    if path is not None:
        plan = confirm(plan, header, machine, dry_run_of(path), **asked)
    if not plan.fits and not force:
        from runner.fit import device_table

        ui.echo("\n".join(device_table(plan)))
        quants = smaller() if smaller is not None else []
        raise WontFit(describe_refusal(name, plan, quants))
    chose = departures(plan, header, machine, **asked)
    final = path is not None or plan.estimate.exact  # else a check with the file follows: say it then
    if chose and plan.fits and final:
        ui.info(f"{name} runs with {' and '.join(chose)}")
    return plan


def smaller_quants(
    ref: HubRef, size: int, *, ctx: int | None, kv_type: str | None
) -> Callable[[], list[str]]:
    def find() -> list[str]:
        from runner.fit import smaller_quants_that_fit

        return smaller_quants_that_fit(ref, size, ctx=ctx, kv_type=kv_type)

    return find


def describe_refusal(name: str, plan: Plan, smaller_quants: list[str] | None = None) -> str:
    short = [
        f"{v.device.upper()} needs {ui.human_bytes(v.needed_bytes)}, has {ui.human_bytes(v.budget_bytes)}"
        for v in plan.verdicts
        if not v.fits
    ]
    where = "on the GPU" if plan.n_gpu_layers else "in RAM"
    tries = list(plan.alternatives) + [f"a smaller quant: {q}" for q in smaller_quants or []]
    options = "; try " + " or ".join(tries) if tries else ""
    return (
        f"{name} does not fit {where} at a {plan.n_ctx:,}-token context ({', '.join(short)}){options}; "
        "`runner fit` shows the whole estimate, --force loads it anyway"
    )


def open_model(
    model: str,
    *,
    ctx: int | None = None,
    threads: int | None = None,
    gpu_layers: int | None = None,
    kv_type: str | None = None,
    force: bool = False,
    offline: bool = False,
    debug: bool = False,
) -> LoadedModel:
    """Resolve, fetch if needed, check the header, plan, then load."""
    check_asked(ctx=ctx, gpu_layers=gpu_layers)
    if threads is not None:
        check_range(threads, "--threads", 1, MAX_THREADS)
    ref = resolve(model, load_catalog())
    plan = None
    if isinstance(ref, HubRef):
        from runner import hub

        if hub.local_copy(ref) is None and hub.why_not_online(offline or hub.env_offline()) is None:
            from runner.headers import read_model

            remote = read_model(ref)  # the header only: refuse before downloading what will not fit
            plan = plan_for(
                remote.merged,
                ref.display,
                ctx=ctx,
                gpu_layers=gpu_layers,
                kv_type=kv_type,
                force=force,
                smaller=smaller_quants(ref, remote.size, ctx=ctx, kv_type=kv_type),
            )
        path = hub.locate(ref, offline=offline)
    else:
        path = ref.path
    header = read_header(path)
    header.check_complete()
    if plan is None or not plan.estimate.exact:  # again with the file, unless the remote plan was exact
        plan = plan_for(
            header, ref.display, ctx=ctx, gpu_layers=gpu_layers, kv_type=kv_type, force=force, path=path
        )
    engine = Engine(
        path,
        n_ctx=ctx or plan.n_ctx,
        n_threads=threads,
        n_gpu_layers=plan.n_gpu_layers if gpu_layers is None else gpu_layers,
        kv_type=kv_type or plan.type_k,
        use_gpu=plan.use_gpu or gpu_layers is not None,
        debug=debug,
    )
    return LoadedModel(name=ref.display, path=path, header=header, plan=plan, engine=engine)
