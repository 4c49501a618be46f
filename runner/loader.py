"""MODEL as typed -> a verified local GGUF -> a checked header -> a plan -> a loaded engine.

Every command opens models here, so a bad file fails before llama.cpp sees it, and a model that will
not fit is refused before anything is allocated (unless forced), with the options that would fit.
The one module that joins the hub, the memory planner and the engine: what the planner needs of the
engine (the build's facts, a dry run of a load) it gets from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner import phases, ui
from runner.engine.context import CTX_PAD
from runner.engine.engine import Engine
from runner.engine.llamacpp import Placement
from runner.engine.speculate import SPEC_DRAFT, draft_mismatch
from runner.engine.text.template import TEMPLATE_KEY, compile_ahead
from runner.errors import CannotGenerate, InvalidSetting, WontFit
from runner.gguf import GGUFHeader, read_header
from runner.hub.catalog import CatalogEntry, load_catalog
from runner.hub.refs import HubRef, ModelRef, resolve
from runner.limits import MAX_THREADS, check_range
from runner.memory import arch, devices
from runner.memory.devices import Machine
from runner.memory.plan import (
    Ask,
    Plan,
    check_asked,
    confirm,
    departures,
    describe_refusal,
    device_table,
    make_plan,
    trained_context,
)
from runner.projector import attach as attach_projector
from runner.projector import fetched, planned
from runner.projector import memory as projector_memory
from runner.settings import DEFAULTS, LoadSettings

if TYPE_CHECKING:
    from runner.memory.projector import ProjectorMemory
    from runner.memory.speed import Where

UNQUANTIZED_KV = ("f16", "f32", "bf16")
# Flash attention in a chat on the CPU: off. llama.cpp's "auto" turns it on, and its CPU kernel is
# faster while little is cached but slows as the cache fills: measured here (SmolLM2, 2 threads, f16
# cache), 20 new tokens after 40 cached take 102 ms with it and 120 ms without; after 580, 149 ms
# against 121 ms; after 1,500, 283 ms against 158 ms; one decoded token after 1,000 cached, 45 against
# 56 tok/s. The crossover is near 350 cached tokens, which a chat passes within a few turns, and a
# chat's next turn should not slow as the conversation grows. A one-shot run keeps "auto".
CPU_CHAT_FLASH_ATTN = False
DEFAULT_BATCH_CTX = 2048  # each sequence's context in a batch without --ctx: prompts and answers are short


def total_ctx(ctx: int | None, n_seq: int) -> int | None:
    """The context to plan for. --ctx is each sequence's in every command: with n_seq > 1 (a batch,
    fit --parallel) n_seq of them (default DEFAULT_BATCH_CTX each, padded as llama.cpp pads one
    sequence's, so each gets what one would); else --ctx as given."""
    if n_seq == 1:
        return ctx
    return -(-(ctx or DEFAULT_BATCH_CTX) // CTX_PAD) * CTX_PAD * n_seq


def setting_warnings(
    header: GGUFHeader, here: Machine, *, ctx: int | None, gpu_layers: int | None = None
) -> list[str]:
    """What every command that plans a load (run, chat, fit) says about the same settings on this
    machine, whether it fits or not: a --ctx past the trained context, a GPU this build cannot use,
    --gpu-layers on a build with no GPU backend."""
    out = []
    trained = trained_context(header)
    if ctx is not None and trained is not None and ctx > trained:
        out.append(
            f"--ctx {ctx:,} is beyond the {trained:,} tokens this model was trained on; answers may degrade"
        )
    hint = here.reinstall_hint()
    if hint:
        out.append(f"this llama.cpp build cannot use the {here.gpus[0].name}; for a GPU build: {hint}")
    elif gpu_layers and not here.offloads:
        out.append(f"--gpu-layers {gpu_layers}: {devices.NO_GPU_BACKEND}")
    return out


@dataclass
class LoadedModel:
    name: str
    path: Path
    header: GGUFHeader
    plan: Plan
    engine: Engine
    entry: CatalogEntry | None = None  # the catalog's alias, when MODEL was one

    def close(self) -> None:
        self.engine.close()


_WORKERS: tuple[devices.Remote, ...] = ()  # --rpc: the workers this process loads across


def connect_workers(rpc: str) -> tuple[devices.Remote, ...]:
    """--rpc HOST:PORT[,…]: each worker checked (runner.remote.probe: one line naming it, within 3 s,
    rather than ggml's abort), then its device added to llama.cpp's, so that this process's plans and
    loads split the layers over the workers (one device of each) in the plan's shares."""
    from runner import remote
    from runner.engine import rpc as engine_rpc
    from runner.engine.llamacpp import use_workers
    from runner.memory.plan import worker_shares

    global _WORKERS
    endpoints = remote.parse_endpoints(rpc)
    engine_rpc.require("--rpc")
    engine_rpc.report_aborts()  # a worker gone: one line and ABORT_EXIT, for the parent to name it
    found = remote.probe_all(endpoints)
    _WORKERS = tuple(devices.Remote(w.endpoint, w.free_bytes, w.total_bytes) for w in found)
    shares = dict(worker_shares(devices.Machine(0, 0, workers=_WORKERS)))  # the workers' part only
    use_workers([(engine_rpc.add_worker(w.endpoint)[0], shares[w.endpoint]) for w in _WORKERS])
    return _WORKERS


def machine() -> Machine:
    """This machine as the installed llama.cpp build sees it: RAM and GPUs, whether the build can
    offload, which weight types its CPU backend repacks as it loads them, and the --rpc workers."""
    from runner.engine.llamacpp import repack_types, supports_gpu_offload

    return devices.probe(can_offload=supports_gpu_offload(), repack_types=repack_types(), workers=_WORKERS)


def dry_run_of(path: Any) -> Callable[[Plan], dict[str, int] | None]:
    """plan.confirm()'s dry run for the model file at path: the load runner's engine makes of a plan."""
    from runner.engine.llamacpp import dry_run

    def dry(p: Plan) -> dict[str, int] | None:
        placement = Placement(p.n_gpu_layers, p.use_gpu, p.type_k, p.flash_attn)
        return dry_run(path, placement, n_ctx=p.n_ctx, n_seq=p.n_seq)

    return dry


def plan_for(
    header: GGUFHeader,
    name: str,
    settings: LoadSettings = DEFAULTS,
    *,
    path: Path | None = None,
    smaller: Callable[[], list[str]] | None = None,
    projector: ProjectorMemory | None = None,
) -> Plan:
    """The plan to load with; refuses (WontFit) what this machine cannot hold, unless forced.

    A refusal prints the estimate's table on stderr and names the nearest options that fit; `smaller`
    lists smaller quants of the same repo that fit (asked only when refusing: it reads remote headers).
    The plan itself is choose_plan's (see there for the rest).
    """
    here = machine()
    for warning in setting_warnings(header, here, ctx=settings.ctx, gpu_layers=settings.gpu_layers):
        ui.warn(warning)
    plan, asked = choose_plan(header, here, settings, path=path, projector=projector)
    if not plan.fits and not settings.force:
        ui.echo("\n".join(device_table(plan)))
        quants = smaller() if smaller is not None else []
        raise WontFit(describe_refusal(name, plan, quants))
    chose = departures(
        plan, header, here, ctx=asked.ctx, gpu_layers=settings.gpu_layers, kv_type=settings.kv_type
    )
    final = path is not None or plan.estimate.exact  # else a check with the file follows: say it then
    if chose and plan.fits and final:
        ui.info(f"{name} runs with {' and '.join(chose)}")
    return plan


def choose_plan(
    header: GGUFHeader,
    here: Machine,
    settings: LoadSettings = DEFAULTS,
    *,
    path: Path | None = None,
    projector: ProjectorMemory | None = None,
) -> tuple[Plan, Ask]:
    """The plan a load makes, fitting or not, and what make_plan was asked for it: plan_for's, and
    `runner fit`'s, so that fit says what a load would do with the same settings.

    With the model's `path`, a plan whose compute buffers the estimate only approximates is checked
    by a dry run of the load (plan.confirm); without it, that check is left to a later call.
    `settings.growing`: the context will fill up as the model runs (a chat), see CPU_CHAT_FLASH_ATTN.
    `settings.parallel` sequences share the context (a batch); with `most_parallel`, the most up to
    that which fit (halving), as the plan's n_seq. `output_rows`: the most rows of logits one decode
    asks for. `projector`: a vision projector's memory (runner.projector.memory), counted beside the model.
    """

    def asking(n: int) -> Ask:
        return Ask(
            ctx=total_ctx(settings.ctx, n),
            gpu_layers=settings.gpu_layers,
            kv_type=settings.kv_type,
            flash_attn=settings.flash_attn,
            n_seq=n,
            output_rows=settings.output_rows,
            projector=projector,
        )

    n_seq = settings.parallel
    while settings.most_parallel and n_seq > 1 and not make_plan(header, here, asking(n_seq)).fits:
        n_seq //= 2
    asked = asking(n_seq)
    plan = make_plan(header, here, asked)
    if (
        settings.growing
        and settings.flash_attn is None
        and not here.usable_gpus
        and plan.fits
        and plan.type_v in UNQUANTIZED_KV
    ):
        # off only where it costs nothing else: the same context and cache (its scores need memory)
        off_ask = replace(asked, ctx=plan.n_ctx, kv_type=plan.type_k, flash_attn=CPU_CHAT_FLASH_ATTN)
        off = make_plan(header, here, off_ask)
        if off.fits:
            plan, asked = off, replace(asked, flash_attn=CPU_CHAT_FLASH_ATTN)
    if path is not None:
        plan = confirm(plan, header, here, dry_run_of(path), asked)
    return plan, asked


# -- runner serve's plan: what it asks beyond the flags, and what it counts against its budget -----

SERVE_PARALLEL = 4  # runner serve's sequences without --parallel (llama-server's slots), fewer if need be


def serve_planning(parallel: int | None) -> dict[str, Any]:
    """What runner serve asks of the plan beside the flags (and `runner fit --serve` with it):
    --parallel sequences, or the most up to SERVE_PARALLEL that fit; and room in the output buffer
    for a scored prompt's rows of logits (logprobs' `echo`, runner.engine.logprobs.ROWS a decode)."""
    from runner.engine.logprobs import ROWS

    return dict(parallel=parallel or SERVE_PARALLEL, most_parallel=parallel is None, output_rows=ROWS)


def embedding_context(plan: Plan, header: GGUFHeader) -> dict[str, int]:
    """The embedding context a served model makes at its first embedding request
    (runner.engine.embed), by device: on the device of its KV cache."""
    from runner.engine.embed import EMBED_CTX, MAX_SEQS
    from runner.memory.estimate import embedding_context_bytes

    n_ctx = min(EMBED_CTX, plan.n_ctx // max(1, plan.n_seq))
    where = "gpu" if plan.full_offload and any(v.device == "gpu" for v in plan.verdicts) else "cpu"
    return {where: embedding_context_bytes(header, n_ctx=n_ctx, n_seq=MAX_SEQS)}


def serve_needs(plan: Plan, header: GGUFHeader) -> dict[str, int]:
    """What a served model holds, by device, as runner serve counts it against its budget: the plan's,
    and the embedding context, so that models on demand are loaded beside it only where both fit.
    Not counted: the prompt states a model keeps between requests (--cache-ram), made as prompts are
    set aside, from memory free then."""
    needs = {v.device: v.needed_bytes for v in plan.verdicts}
    for device, n in embedding_context(plan, header).items():
        needs[device] = needs.get(device, 0) + n
    return needs


def speed_where(path: Path | None, plan: Plan, here: Machine, threads: int | None = None) -> Where:
    """What a decode speed of this plan holds for (runner.memory.speed): the model file (None:
    not on this machine), this machine and its llama.cpp build, the most threads the engine may use
    (--threads, else the physical cores), the devices the plan puts the layers on."""
    from importlib.metadata import PackageNotFoundError, version

    from runner.engine.llamacpp import default_threads, llama
    from runner.memory import speed

    try:
        build = version("llama-cpp-python")
    except PackageNotFoundError:
        build = "?"
    build += " " + llama().llama_print_system_info().decode(errors="replace")
    file, size, mtime_ns = speed.model_file(path) if path is not None else ("", 0, 0)
    return speed.Where(
        file,
        size,
        mtime_ns,
        speed.machine_id(build),
        threads or default_threads(),
        speed.device_of(plan, here),
    )


def smaller_quants(
    ref: HubRef, size: int, *, ctx: int | None, kv_type: str | None
) -> Callable[[], list[str]]:
    """smaller_quants_that_fit, asked only when a refusal needs it."""

    def find() -> list[str]:
        return smaller_quants_that_fit(ref, size, ctx=ctx, kv_type=kv_type)

    return find


def smaller_quants_that_fit(
    ref: HubRef, size: int, *, ctx: int | None, kv_type: str | None, most: int = 3
) -> list[str]:
    """Up to `most` smaller quants of the same repo, largest first, that fit (headers read remotely)."""
    from runner.hub import fetch
    from runner.hub.headers import read_remote
    from runner.hub.quants import offer

    commit, files = fetch.remote_listing(ref)
    here = machine()
    smaller = sorted(
        (c for c in offer(files) if c.size is not None and c.size < size), key=lambda c: -(c.size or 0)
    )
    out = []
    for choice in smaller[:most]:
        model = read_remote(ref, commit, choice, quiet=True)
        plan = make_plan(model.merged, here, Ask(ctx=ctx, kv_type=kv_type))
        if plan.fits:
            out.append(f"{ref.repo}:{choice.quant or choice.primary.path} ({ui.human_bytes(model.size)})")
    return out


def locate_model(model: str, offline: bool = False) -> tuple[str, Path, GGUFHeader]:
    """MODEL as typed -> its name, its local file (fetched if a Hub model is not cached) and its
    header, checked whole: for a command that needs the file, not a loaded engine (runner tokens)."""
    ref = resolve(model, load_catalog())
    path, header = _checked_file(ref, offline)
    return ref.display, path, header


def _checked_file(ref: ModelRef, offline: bool) -> tuple[Path, GGUFHeader]:
    """A model's local file (fetched if a Hub model is not cached) and its header, checked whole."""
    if isinstance(ref, HubRef):
        from runner.hub import fetch

        path = fetch.locate(ref, offline=offline)
    else:
        path = ref.path
    header = read_header(path)
    header.check_complete()
    return path, header


def _draft_file(
    draft: str, target: GGUFHeader, target_path: Path, offline: bool
) -> tuple[str, Path, GGUFHeader]:
    """--draft MODEL, located (fetched if need be) and checked against the target before it loads."""
    ref = resolve(draft, load_catalog())
    path, header = _checked_file(ref, offline)
    why = draft_mismatch(target, header)
    if why is not None:
        raise InvalidSetting(f"--draft {ref.display} cannot draft for this model: {why}")
    size, target_size = path.stat().st_size, target_path.stat().st_size
    if size > target_size:
        raise InvalidSetting(
            f"--draft {ref.display} ({size / 1e6:,.0f} MB) is bigger than the model it would draft for "
            f"({target_size / 1e6:,.0f} MB): it would slow it down; use a smaller model of its family"
        )
    return ref.display, path, header


def _load_draft(drafting: tuple[str, Path, GGUFHeader], target: Engine, settings: LoadSettings) -> Engine:
    """The draft model's engine, planned (it must fit beside the loaded target) at the target's context,
    with as many sequences as the target (runner serve: each sequence drafts in its own)."""
    name, path, header = drafting
    asked = LoadSettings(
        ctx=target.context.n_ctx_seq,
        kv_type=target.context.kv_type,
        parallel=target.context.n_seq,
        force=settings.force,
    )
    plan = plan_for(header, name, asked, path=path)
    context = target.context
    return Engine(
        path,
        n_ctx=context.n_ctx,
        n_seq=context.n_seq,  # each of the target's sequences drafts in its own
        n_threads=settings.threads,
        placement=Placement(plan.n_gpu_layers, plan.use_gpu, context.kv_type, context.flash_attn),
        debug=settings.debug,
    )


def open_model(model: str, settings: LoadSettings = DEFAULTS) -> LoadedModel:
    """Resolve, fetch if needed, check the header, plan, then load (runner.settings.LoadSettings says
    how and what for). flash_attn None: the plan's choice (llama.cpp's "auto", or off for a `growing`
    context on the CPU: CPU_CHAT_FLASH_ATTN). A --draft model is checked against the target
    (vocabulary, size) before either loads; a projector is planned from its header and fetched once the
    plan with it fits; a reranker or an encoder is refused before it loads (CannotGenerate) unless
    `generates` is False."""
    check_asked(ctx=settings.ctx, gpu_layers=settings.gpu_layers)
    if settings.threads is not None:
        check_range(settings.threads, "--threads", 1, MAX_THREADS)
    ref = resolve(model, load_catalog())
    # a path, or (runner.projector.OnHub) one on the Hub, fetched once the plan fits
    found = planned(
        settings.mmproj,
        ref,
        paired=settings.vision or settings.images,
        needed=settings.images,
        offline=settings.offline,
    )
    plan, projector = _plan_before_download(ref, settings, found)
    path, header = _checked_file(ref, settings.offline)
    why = arch.cannot_generate(header.architecture, header.arch_get("pooling_type"))
    if settings.generates and why:
        raise CannotGenerate(ref.display, why)
    drafting = None
    if settings.spec == SPEC_DRAFT and settings.draft:
        drafting = _draft_file(settings.draft, header, path, settings.offline)
    if plan is None or not plan.estimate.exact:  # again with the file, unless the remote plan was exact
        if projector is None and found is not None:
            projector = projector_memory(found, header)
        plan = plan_for(header, ref.display, settings, path=path, projector=projector)
    mmproj = fetched(found)  # downloaded once the plan with it fits
    if settings.chat_template:
        compile_ahead(header.get(TEMPLATE_KEY))
    phases.mark("plan")
    engine = _load(path, plan, settings)
    phases.mark("load")
    _speculate(engine, drafting, settings, ref.display)
    if mmproj is not None:
        attach_projector(engine, mmproj, header)
    entry = ref.entry if isinstance(ref, HubRef) else None
    return LoadedModel(name=ref.display, path=path, header=header, plan=plan, engine=engine, entry=entry)


def _plan_before_download(
    ref: ModelRef, settings: LoadSettings, found: Any
) -> tuple[Plan | None, ProjectorMemory | None]:
    """A Hub model not cached, online: planned from its header (a few MB of range requests), so what
    will not fit is refused before anything downloads; the projector counted in that plan, its width
    checked against the model's. (None, None) where there is nothing to read ahead."""
    if not isinstance(ref, HubRef):
        return None, None
    from runner.hub import fetch

    if fetch.local_copy(ref) is not None or fetch.why_not_online(settings.offline or fetch.env_offline()):
        return None, None
    from runner.hub.headers import read_model

    remote = read_model(ref)  # the header only
    projector = projector_memory(found, remote.merged) if found is not None else None
    smaller = smaller_quants(ref, remote.size, ctx=settings.ctx, kv_type=settings.kv_type)
    return plan_for(remote.merged, ref.display, settings, smaller=smaller, projector=projector), projector


def _load(path: Path, plan: Plan, settings: LoadSettings) -> Engine:
    """The engine the plan says, the flags given winning over it."""
    return Engine(
        path,
        n_ctx=plan.n_ctx if plan.n_seq > 1 else settings.ctx or plan.n_ctx,
        n_threads=settings.threads,
        n_seq=plan.n_seq,
        placement=Placement(
            n_gpu_layers=plan.n_gpu_layers if settings.gpu_layers is None else settings.gpu_layers,
            use_gpu=plan.use_gpu or settings.gpu_layers is not None,
            kv_type=settings.kv_type or plan.type_k,
            flash_attn=plan.flash_attn if settings.flash_attn is None else settings.flash_attn,
        ),
        debug=settings.debug,
    )


def _speculate(
    engine: Engine, drafting: tuple[str, Path, GGUFHeader] | None, settings: LoadSettings, name: str
) -> None:
    """Speculative decoding as asked: a draft model's engine (planned beside the target), or n-grams."""
    if drafting is None:
        engine.speculate(settings.spec)
        return
    try:
        if not engine.speculate(SPEC_DRAFT, _load_draft(drafting, engine, settings)):
            ui.warn(f"{name} cannot drop rejected drafts (a recurrent model): decoding without --draft")
    except BaseException:
        engine.close()
        raise
