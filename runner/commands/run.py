"""`runner run`: one prompt in, one answer out, streamed to stdout or reported as JSON."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

from runner import interrupt, phases, ui
from runner.commands.output import (
    LOOP_WARNING,
    AnswerWriter,
    describe_load,
    describe_sampling,
    describe_timings,
    logprobs_json,
    open_prompt_cache,
    sampling_for,
    shaped,
    stream_answer,
    to_json,
)
from runner.engine.answer import FINISH_INTERRUPTED, FINISH_REPEAT, Result, since_process_start
from runner.engine.cells import common_prefix
from runner.engine.logprobs import MAX_TOP
from runner.engine.prompt import read_prompt, render_prompt
from runner.engine.promptcache import PromptCache
from runner.engine.request import Request
from runner.engine.text.constrain import Constraint, constraint
from runner.engine.text.template import build_messages
from runner.errors import UsageError
from runner.images import MAX_IMAGES, read_image_arg
from runner.limits import check_answer_limits, check_range
from runner.loader import LoadedModel, open_model
from runner.settings import DEFAULTS, LoadSettings

if TYPE_CHECKING:  # tools (--mcp) are imported only by a run that asks for them
    from runner.commands.agent import Servers, ToolSettings
    from runner.tools.host import ToolHost


@dataclass(frozen=True)
class RunRequest:
    model: str
    prompt: str | None
    system: str | None = None
    raw: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)  # flag values, None = not given
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    settings: LoadSettings = DEFAULTS  # how the model loads (--ctx, --threads, --spec, --mmproj ...)
    prompt_cache: bool = True  # --no-prompt-cache: False
    prompt_cache_size: str | None = None  # --prompt-cache-size as typed
    as_json: bool = False
    verbose: bool = False
    think: bool | str | None = None  # --think [LEVEL] / --no-think (reasoning.think_settings)
    reasoning_budget: int | None = None  # --reasoning-budget N: thinking tokens at most
    hide_reasoning: bool = False
    schema: str | None = None  # --schema: inline JSON or a file
    format: str | None = None  # --format json
    grammar: str | None = None  # --grammar FILE (GBNF)
    logprobs: int | None = None  # --logprobs N: each answer token's log-probability in --json
    images: tuple[str, ...] = ()  # --image FILE (- : stdin), in order; load.mmproj their projector
    audio: tuple[str, ...] = ()  # --audio FILE (- : stdin), in order, after the images (runner.audio)
    max_audio_seconds: float = 600.0  # --max-audio-seconds: a clip's length at most, from its header
    tools: ToolSettings | None = None  # --mcp and the tool flags: the agent loop (runner.commands.agent)
    suffix: str | None = None  # --suffix: fill in the middle, the prompt as the prefix (runner.engine.infill)


def run_once(request: RunRequest, *, stdin: BinaryIO | None, out: TextIO) -> Result:
    """Check the flags, read the prompt and images, load, ask, answer; every flag refused before a load."""
    phases.begin(since_process_start())
    check_answer_limits(request.max_tokens, request.stop)
    if request.logprobs is not None:
        check_range(request.logprobs, "--logprobs", 0, MAX_TOP)
        if not request.as_json:
            raise UsageError("--logprobs goes with --json (the log-probabilities are a field of it)")
    cache = open_prompt_cache(request.prompt_cache, request.prompt_cache_size)
    constrained = constraint(schema=request.schema, format=request.format, grammar=request.grammar)
    tools = request.tools is not None  # a tool's images go to a vision model: --mmproj alone is asked
    images = read_images(request.images, None if tools or request.audio else request.settings.mmproj, stdin)
    if request.audio:
        from runner.commands.attach import read_clips

        images += read_clips(
            request.audio, stdin, images=request.images, max_seconds=request.max_audio_seconds
        )
    piped = "-" in request.images or "-" in request.audio
    prompt = read_prompt(request.prompt, None if piped else stdin)
    mmproj = request.settings.mmproj if images or tools else None
    servers = _servers(request, constrained)  # started beside the load
    try:
        loaded = open_model(
            request.model,
            replace(request.settings, chat_template=not request.raw, mmproj=mmproj, images=bool(images)),
        )
        try:
            host = servers.ready() if servers is not None else None
            cached = cache is not None and not images
            if host is not None:
                result = _answer_with_tools(loaded, request, (prompt, images), host, out)
            else:
                asked = (
                    _asked(loaded, request, prompt, images, constrained, cached=cached)
                    if request.suffix is None
                    else _infill_asked(loaded, request, prompt, constrained)
                )
                result = _answer(loaded, request, asked, cache, out)
        finally:
            loaded.close()
    finally:
        if servers is not None:
            servers.close()
    _report(loaded, request, result)
    return result


def _servers(request: RunRequest, constrained: Constraint | None) -> Servers | None:
    """The tool servers a run with a tool flag starts (the default file joins those of --mcp)."""
    tools = request.tools
    if tools is None:
        return None
    from runner.commands.agent import Servers

    tools.check()
    if request.raw or constrained is not None or request.logprobs is not None:
        raise UsageError("--mcp goes without --raw, --format, --schema, --grammar and --logprobs")
    return Servers(tools, default=True, verbose=request.verbose)


def _answer_with_tools(
    loaded: LoadedModel, request: RunRequest, asked: tuple[str, list[Any]], host: ToolHost, out: TextIO
) -> Result:
    """The answer through the agent loop (runner.commands.agent): each call shown on stderr, asked
    where stdin and stderr are a terminal, else run only where --allow-tools allows it; stdout gets
    the final answer alone (with --json, its `steps`)."""
    from runner.commands.agent import (
        Approvals,
        HeldCalls,
        Turns,
        answer_with_tools,
        ask_terminal,
        template_message,
    )
    from runner.commands.attach import Attachments
    from runner.engine.conversation import fit
    from runner.engine.text.tools import call_shape
    from runner.store import StoredMessage

    assert request.tools is not None
    prompt, images = asked
    sampling, _sources = sampling_for(loaded, request.sampling)
    system = request.system if request.system is not None else loaded.entry.system if loaded.entry else None
    attached = Attachments(loaded.engine, request.max_audio_seconds)  # a tool's images, for a vision model
    see = attached.tool_images if attached.vision else None
    turns = Turns([StoredMessage("user", prompt)], loaded.name, see=see)
    terminal = sys.stdin.isatty() and sys.stderr.isatty()
    approvals = Approvals(request.tools.allow, ask_terminal if terminal else None)

    def ask(choice: str | dict[str, Any]) -> Result:
        tools = [t.openai() for t in host.tools()] if choice != "none" else []
        messages = [template_message(m) for m in turns.turns]
        fitted = fit(
            loaded.engine,
            loaded.header,
            system,
            messages,
            max_tokens=request.max_tokens,
            enable_thinking=request.think,
            images=[images, *attached.images_for(turns.turns[1:])],
            tools=tools,
        )
        rendered = fitted.prompt
        forced = bool(tools) and choice not in ("auto", "none")
        shape = call_shape(tools, choice) if forced else None
        writer = HeldCalls(
            out,
            hold_all=True,
            verbose=request.verbose,
            hide_reasoning=request.hide_reasoning,
            quiet=request.as_json,
        )
        req = Request(rendered, sampling, request.max_tokens, request.stop, shape, tuple(tools), forced)
        req = replace(req, reasoning_budget=request.reasoning_budget)
        with interrupt.deferred(), writer:
            result = stream_answer(loaded, req, writer)
            writer.release(result)
        writer.end()
        return result

    result, steps = answer_with_tools(ask, host, request.tools, approvals, turns)
    if request.as_json:
        out.write(json.dumps({**to_json(loaded.name, result), "steps": [s.to_json() for s in steps]}) + "\n")
    return result


def _asked(
    loaded: LoadedModel,
    request: RunRequest,
    prompt: str,
    images: list[Any],
    shape: Constraint | None,
    cached: bool,
) -> Request:
    """The engine's Request: the prompt rendered with the system message and images (in llama-server's
    order), checked to fit, its stable head found where the disk cache will keep it."""
    sampling, sources = sampling_for(loaded, request.sampling)
    system = request.system
    if system is None and loaded.entry is not None and not request.raw:
        system = loaded.entry.system
    messages = build_messages(loaded.engine.markers(len(images)) + prompt, system)
    rendered = render_prompt(
        loaded.engine, loaded.header, messages, raw=request.raw, enable_thinking=request.think, images=images
    )
    loaded.engine.context.check_fits(rendered.tokens, request.max_tokens)
    head = stable_head(loaded, rendered.tokens, prompt, request, system) if cached else 0
    if request.verbose:
        ui.info(describe_load(loaded))
        ui.info(f"sampling: {describe_sampling(sampling, sources)}")
    return Request(
        rendered,
        sampling,
        max_tokens=request.max_tokens,
        stop=request.stop,
        shape=shape,
        logprobs=request.logprobs,
        head=head,
        reasoning_budget=request.reasoning_budget,
    )


def _infill_asked(loaded: LoadedModel, request: RunRequest, prompt: str, shape: Constraint | None) -> Request:
    """--suffix: the prompt as the prefix, laid out in the model's FIM tokens as llama-server's /infill
    lays them (NoInfill, exit 2, for a model without them)."""
    from runner.engine.infill import infill_prompt
    from runner.engine.text.fim import Infill

    if request.tools is not None or request.system is not None or request.images:
        raise UsageError("--suffix goes without --system, --image and the tool flags (the code alone)")
    sampling, _sources = sampling_for(loaded, request.sampling)
    context = loaded.engine.context
    filled = infill_prompt(
        loaded.engine.model, Infill(prompt, request.suffix or ""), context.n_ctx_seq, loaded.name
    )
    context.check_fits(filled.tokens, request.max_tokens)
    return Request(filled, sampling, request.max_tokens, request.stop, shape=shape, logprobs=request.logprobs)


def _answer(
    loaded: LoadedModel, request: RunRequest, asked: Request, cache: PromptCache | None, out: TextIO
) -> Result:
    """The answer streamed to `out` (a constrained one written whole once checked: a script never
    reads half a JSON), or as one JSON object."""
    quiet = request.as_json or asked.shape is not None
    writer = AnswerWriter(out, hide_reasoning=request.hide_reasoning, quiet=quiet)

    def lost(partial: Result) -> None:  # a worker went away: what came, as after a Ctrl-C
        _finish(out, writer, partial, loaded.name, request.as_json)

    with interrupt.deferred(), writer:  # Ctrl-C ends the answer between tokens, never mid-write
        answer = stream_answer(loaded, asked, writer, prompt_cache=cache, if_lost=lost)
        if asked.shape is not None and answer.finish_reason != FINISH_INTERRUPTED:
            answer = replace(answer, text=shaped(answer))
            if not request.as_json:
                out.write(answer.text + "\n")
        scored = logprobs_json(loaded.engine, answer.logprobs) if request.logprobs is not None else None
        _finish(out, writer, answer, loaded.name, request.as_json, scored)
    return answer


def _report(loaded: LoadedModel, request: RunRequest, result: Result) -> None:
    """What stderr says once the answer is out: a Ctrl-C (exit 130), a full context, a loop, --verbose."""
    if result.finish_reason == FINISH_INTERRUPTED:
        raise KeyboardInterrupt  # what was printed stays; the CLI exits 130
    if result.context_full:
        ui.warn(
            f"the answer stopped at the context limit ({loaded.engine.context.n_ctx} tokens); "
            "raise --ctx for more"
        )
    if result.finish_reason == FINISH_REPEAT:
        ui.warn(LOOP_WARNING)
    if request.verbose:
        ui.info(describe_timings(result))
        ui.info(phases.describe(result.timings.ttft_s))


def read_images(args: tuple[str, ...], mmproj: str | None, stdin: BinaryIO | None) -> list[Any]:
    """--image's files (- : stdin) decoded and bounded (runner.images) before any model loads."""
    if not args:
        if mmproj is not None:
            raise UsageError("--mmproj goes with --image")
        return []
    if args.count("-") > 1:
        raise UsageError("--image - reads stdin once: give one image that way")
    if len(args) > MAX_IMAGES:
        raise UsageError(f"{len(args)} images: at most {MAX_IMAGES} a prompt")
    if "-" in args and stdin is None:
        raise UsageError("--image - reads the image from stdin, which is a terminal here: pipe it in")
    loaded = []
    for arg in args:
        image = read_image_arg(arg, stdin)  # type: ignore[arg-type]  # None only without "-"
        for warning in image.warnings:
            ui.warn(warning)
        loaded.append(image)
    return loaded


def stable_head(
    loaded: LoadedModel, tokens: list[int], prompt: str, request: RunRequest, system: str | None
) -> int:
    """How many of the prompt's tokens are its stable head: the system prompt and piped stdin, not
    the final argument (which a shell loop changes from call to call). The tokens it shares with the
    same prompt rendered with other text in the argument's place, so a template's or tokenizer's
    joins are never counted in."""
    stable = (
        prompt[: len(prompt) - len(request.prompt)]
        if request.prompt and prompt.endswith(request.prompt)
        else prompt
    )
    probe = render_prompt(
        loaded.engine,
        loaded.header,
        build_messages(stable.rstrip("\n") + "\n\n\x00", system),
        raw=request.raw,
        enable_thinking=request.think,
        quiet=True,
    )
    return common_prefix(probe.tokens, tokens)


def _finish(
    out: TextIO,
    writer: AnswerWriter,
    answer: Result,
    model: str,
    as_json: bool,
    scored: list[dict[str, Any]] | None = None,
) -> None:
    if as_json:
        data = to_json(model, answer)
        if scored is not None:
            data["logprobs"] = scored
        out.write(json.dumps(data, ensure_ascii=False) + "\n")
    else:
        writer.end()
    out.flush()
