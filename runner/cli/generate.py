"""The commands that load a model and generate: run (one prompt, a pipe, a batch of prompts, or a chat
when there is no prompt) and chat. Both take the sampling flags, passed on by SamplingConfig's names.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer

from runner.cli import media_options as m
from runner.cli import options as o
from runner.cli import tool_options as to
from runner.cli.app import app, edge
from runner.errors import UsageError

if TYPE_CHECKING:
    from runner.commands.agent import ToolSettings
    from runner.settings import LoadSettings

SAMPLING_FLAGS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
)


# the flags a LoadSettings takes as they are (--flash-attn and --spec are checked: LoadSettings.from_flags)
LOAD_FLAGS = ("ctx", "threads", "gpu_layers", "kv_type", "draft", "mmproj", "force", "offline", "debug")


def _sampling(given: dict[str, Any]) -> dict[str, Any]:
    """The sampling flags of a command's parameters, by SamplingConfig's names (None: not given)."""
    return {name: given[name] for name in SAMPLING_FLAGS}


@app.command(no_args_is_help=True)
@edge
def run(
    model: o.ModelArg,
    prompt: o.PromptArg = None,
    system: o.System = None,
    raw: o.Raw = False,
    suffix: o.Suffix = None,
    temperature: o.Temperature = None,
    top_k: o.TopK = None,
    top_p: o.TopP = None,
    min_p: o.MinP = None,
    repeat_penalty: o.RepeatPenalty = None,
    presence_penalty: o.PresencePenalty = None,
    frequency_penalty: o.FrequencyPenalty = None,
    seed: o.Seed = None,
    max_tokens: o.MaxTokens = None,
    stop: o.Stop = None,
    ctx: o.Ctx = None,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = None,
    kv_type: o.KvType = None,
    flash_attn: o.FlashAttn = None,
    spec: o.Spec = None,
    draft: o.Draft = None,
    no_prompt_cache: o.NoPromptCache = False,
    prompt_cache_size: o.PromptCacheSize = None,
    force: o.Force = False,
    offline: o.Offline = False,
    json: o.Json = False,
    verbose: o.Verbose = False,
    think: to.Think = None,
    no_think: to.NoThink = False,
    reasoning_budget: to.ReasoningBudget = None,
    compact: to.Compact = None,
    compact_keep: to.CompactKeep = None,
    compact_prompt: to.CompactPrompt = None,
    hide_reasoning: o.HideReasoning = False,
    schema: o.Schema = None,
    format: o.Format = None,
    grammar: o.Grammar = None,
    each_line: o.EachLine = False,
    input: o.InputFile = None,
    parallel: o.RunParallel = None,
    jsonl: o.Jsonl = False,
    mcp: to.Mcp = None,
    allow_tools: to.AllowTools = None,
    max_tool_steps: to.MaxToolSteps = 10,
    tool_timeout: to.ToolTimeout = 60.0,
    tool_choice: to.ToolChoice = "auto",
    continue_: o.Continue = False,
    no_save: o.NoSave = False,
    rpc: o.Rpc = None,
    logprobs: o.Logprobs = None,
    image: m.Image = None,
    audio: m.AudioClip = None,
    max_audio_seconds: m.MaxAudioSeconds = 600.0,
    mmproj: m.Mmproj = None,
    debug: o.Debug = False,
) -> None:
    """Answer one prompt; the answer alone goes to stdout.

    With no prompt and no pipe, a chat opens (as runner chat MODEL).

    \b
    Examples:
      runner run smollm2 "Why is the sky blue?"
      cat notes.txt | runner run smollm2 "Summarize this"
      runner run ./model.gguf "Hi" --temperature 0 --max-tokens 50 --json
      runner run -c "And in one word?"             # one more turn of the last chat
      runner run smollm2 "Translate to French: {}" --each-line < lines.txt
      runner run smollm2 --input prompts.jsonl --jsonl --parallel 8
      runner run smollm2 "Name a city" --schema '{"type":"object","properties":{"city":{"type":"string"}}}'
    """
    _route(locals())


def _route(given: dict[str, Any]) -> None:
    """run's flags to what they ask for: a batch, a chat (or one more turn of it), or one answer."""
    tty = sys.stdin is None or sys.stdin.isatty()
    image, prompt = given["image"], given["prompt"]
    batch = given["each_line"] or given["input"] is not None
    if given["audio"] and (batch or given["continue_"] or (prompt is None and tty)):
        raise UsageError("--audio goes with one prompt (PROMPT, or text piped in)")
    if image and (batch or (not given["continue_"] and prompt is None and tty)):
        raise UsageError(
            "--image goes with one prompt (PROMPT, text piped in, or run -c PROMPT); with --input, a row's "
            '"images"; in a chat, /image PATH'
        )
    if given["suffix"] is not None and (batch or given["continue_"] or (prompt is None and tty)):
        raise UsageError(
            "--suffix goes with one prompt (PROMPT, or text piped in): the code before the cursor"
        )
    if given["suffix"] is not None and (
        given["system"] is not None or image or given["audio"] or _tools(given, chat=False) is not None
    ):  # before anything loads
        raise UsageError(
            "--suffix goes without --system, --image, --audio and the tool flags (the code alone)"
        )
    chatting = given["continue_"] or (prompt is None and tty and not given["json"] and not given["raw"])
    compacting = [f"--{name.replace('_', '-')}" for name in COMPACT_FLAGS if given[name] is not None]
    if compacting and (batch or not chatting):
        raise UsageError(
            f"{compacting[0]} goes with a chat (runner chat, runner run -c): one answer keeps no "
            "conversation to compact"
        )
    if batch:
        if _tools(given, chat=False) is not None:
            raise UsageError(
                "--mcp and the tool flags go with one prompt or a chat, not --each-line or --input"
            )
        raise typer.Exit(_batch(given, tty))
    if chatting:
        _chat_or_continue(given, tty)
        return
    _one(given, tty)


def settings_of(given: dict[str, Any], *, spec: bool = True) -> LoadSettings:
    """runner.settings.LoadSettings from a command's flags (--flash-attn and --spec checked here)."""
    from runner.settings import LoadSettings

    fields = {name: given[name] for name in LOAD_FLAGS if name in given}
    if not spec:  # a batch decodes without speculation
        return LoadSettings.from_flags(given.get("flash_attn"), "none", **fields)
    return LoadSettings.from_flags(given.get("flash_attn"), given.get("spec"), **fields)


def _batch(given: dict[str, Any], tty: bool) -> int:
    """run --each-line / --input: many prompts, batched (runner.commands.batch)."""
    from runner.commands.batch import BatchRequest, run_batch_command

    grammar, input_path = given["grammar"], given["input"]
    request = BatchRequest(
        model=given["model"],
        template=given["prompt"],
        each_line=given["each_line"],
        input_path=str(input_path) if input_path is not None else None,
        parallel=given["parallel"],
        jsonl=given["jsonl"] or given["json"],  # a batch's --json: each row's object, one a line
        system=given["system"],
        sampling=_sampling(given),
        max_tokens=given["max_tokens"],
        stop=tuple(given["stop"] or ()),
        schema=given["schema"],
        format=given["format"],
        grammar=str(grammar) if grammar is not None else None,
        settings=settings_of({**given, "draft": None}, spec=False),
        verbose=given["verbose"],
        logprobs=given["logprobs"],
        max_audio_seconds=given["max_audio_seconds"],
    )
    return run_batch_command(request, stdin=None if tty else sys.stdin.buffer, out=sys.stdout)


def _chat_or_continue(given: dict[str, Any], tty: bool) -> None:
    """run with no prompt on a terminal: the chat; run -c PROMPT: one more turn of the last one."""
    from runner.commands.chat import ChatRequest, chat, continue_last

    # runner run -c PROMPT: the one argument is the prompt, and the model the chat's
    model, prompt = given["model"], given["prompt"]
    text, name = (model, None) if given["continue_"] and prompt is None else (prompt, model)
    request = ChatRequest(
        model=name,
        **_answer_fields(given),
        save=not given["no_save"],
        tools=_tools(given, chat=not given["continue_"]),
        compact=_compact(given),
    )
    if given["continue_"]:
        from runner.engine.prompt import read_prompt

        shape = _turn_shape(given)
        images = tuple(given["image"] or ())
        if "-" in images:
            raise UsageError(
                "-c keeps each image by its path, to read again as the chat goes on: give a file"
            )
        prompt_text = read_prompt(text, None if tty else sys.stdin.buffer)
        continue_last(request, prompt_text, out=sys.stdout, as_json=given["json"], shape=shape, images=images)
    else:
        asked = [flag for flag, name in ONE_PROMPT_FLAGS if given[name] is not None]
        if asked:
            raise UsageError(
                f"{' and '.join(asked)} go{'es' if len(asked) == 1 else ''} with a prompt, and no prompt was "
                "given: a chat opens, where /set format json and /set schema S shape the answers"
            )
        chat(request, stdin=sys.stdin, out=sys.stdout, interactive=True)


COMPACT_FLAGS = ("compact", "compact_keep", "compact_prompt")  # a chat's (runner.commands.compact)
# run's flags for one prompt's answer that a chat has no flag for (/set has format and schema)
ONE_PROMPT_FLAGS = (
    ("--format", "format"),
    ("--schema", "schema"),
    ("--grammar", "grammar"),
    ("--logprobs", "logprobs"),
)


def _turn_shape(given: dict[str, Any]) -> tuple[str, str] | None:
    """What run -c takes of the flags that shape one answer: --format json or --schema S, this turn's
    shape and the conversation's from then on (as /set would keep it, and as every flag -c is given
    is kept); the others it refuses rather than ignore."""
    refused = [
        flag
        for flag, name in (("--grammar", "grammar"), ("--raw", "raw"), ("--logprobs", "logprobs"))
        if given[name] not in (None, False)
    ]
    if refused:
        raise UsageError(
            f"-c continues a chat through its template, which takes no {' or '.join(refused)}: "
            "ask one prompt instead (runner run MODEL PROMPT)"
        )
    if given["format"] is not None and given["schema"] is not None:
        raise UsageError("--format and --schema do not go together: choose one")
    for kind in ("format", "schema"):
        if given[kind] is not None:
            return kind, given[kind]
    return None


def _tools(given: dict[str, Any], *, chat: bool) -> ToolSettings | None:
    """The tool flags (runner.commands.agent): None for a run that gives none (no MCP server starts
    and the SDK is never imported); a chat reads the config folder's mcp.json even without --mcp."""
    named = given["mcp"] or given["allow_tools"] or given["tool_choice"] != "auto"
    if not chat and not named:
        return None
    from runner.commands.agent import ToolSettings

    allow = tuple(
        name.strip() for item in given["allow_tools"] or () for name in item.split(",") if name.strip()
    )
    return ToolSettings(
        configs=tuple(given["mcp"] or ()),
        allow=allow,
        max_steps=given["max_tool_steps"],
        timeout_s=given["tool_timeout"],
        choice=given["tool_choice"],
    )


def _compact(given: dict[str, Any]) -> Any:
    from runner.commands.compact import CompactSettings  # a chat's: imported with it

    return CompactSettings(given["compact"], given["compact_keep"], given["compact_prompt"])


def _think(given: dict[str, Any]) -> bool | str | None:
    """--think [LEVEL] and --no-think as the engine takes them: True/False (the template's switch, as
    ever), or a level (runner.engine.text.reasoning.think_settings)."""
    from runner.engine.text.reasoning import THINK_LEVELS

    think, off = given["think"], given["no_think"]
    if off and think is not None:
        raise UsageError("--think and --no-think: give one")
    if off or think is None:
        return False if off else None
    if think == "on":
        return True
    if think not in THINK_LEVELS:
        raise UsageError(
            f"--think takes off, low, medium or high, or nothing (got {think!r}); a prompt goes before it"
        )
    return str(think)


def _answer_fields(given: dict[str, Any]) -> dict[str, Any]:
    """What run's and chat's flags say alike of the answers (a chat's, or one prompt's)."""
    return dict(
        system=given["system"],
        sampling=_sampling(given),
        max_tokens=given["max_tokens"],
        stop=tuple(given["stop"] or ()),
        settings=settings_of(given),
        prompt_cache=not given["no_prompt_cache"],
        prompt_cache_size=given["prompt_cache_size"],
        think=_think(given),
        reasoning_budget=given["reasoning_budget"],
        hide_reasoning=given["hide_reasoning"],
        verbose=given["verbose"],
        max_audio_seconds=given["max_audio_seconds"],
    )


def _one(given: dict[str, Any], tty: bool) -> None:
    """run MODEL PROMPT: one answer (runner.commands.run)."""
    if given["model"] and not (given["debug"] or given["rpc"]):  # the last such run's weights load
        from runner.engine import preload  # while the rest of runner imports

        preload.start(given["model"])
    from runner.commands.run import RunRequest, run_once

    grammar = given["grammar"]
    request = RunRequest(
        model=given["model"],
        prompt=given["prompt"],
        raw=given["raw"],
        suffix=given["suffix"],
        **_answer_fields(given),
        as_json=given["json"],
        schema=given["schema"],
        format=given["format"],
        grammar=str(grammar) if grammar is not None else None,
        logprobs=given["logprobs"],
        images=tuple(given["image"] or ()),
        audio=tuple(given["audio"] or ()),
        tools=_tools(given, chat=False),
    )
    run_once(request, stdin=None if tty else sys.stdin.buffer, out=sys.stdout)


@app.command()
@edge
def chat(
    model: o.OptionalModelArg = None,
    system: o.System = None,
    temperature: o.Temperature = None,
    top_k: o.TopK = None,
    top_p: o.TopP = None,
    min_p: o.MinP = None,
    repeat_penalty: o.RepeatPenalty = None,
    presence_penalty: o.PresencePenalty = None,
    frequency_penalty: o.FrequencyPenalty = None,
    seed: o.Seed = None,
    max_tokens: o.MaxTokens = None,
    stop: o.Stop = None,
    ctx: o.Ctx = None,
    threads: o.Threads = None,
    gpu_layers: o.GpuLayers = None,
    kv_type: o.KvType = None,
    flash_attn: o.FlashAttn = None,
    spec: o.Spec = None,
    draft: o.Draft = None,
    no_prompt_cache: o.NoPromptCache = False,
    prompt_cache_size: o.PromptCacheSize = None,
    force: o.Force = False,
    offline: o.Offline = False,
    resume: o.Resume = None,
    load: o.Load = None,
    no_save: o.NoSave = False,
    markdown: o.Markdown = False,
    think: to.Think = None,
    no_think: to.NoThink = False,
    reasoning_budget: to.ReasoningBudget = None,
    compact: to.Compact = None,
    compact_keep: to.CompactKeep = None,
    compact_prompt: to.CompactPrompt = None,
    hide_reasoning: o.HideReasoning = False,
    verbose: o.Verbose = False,
    mcp: to.Mcp = None,
    allow_tools: to.AllowTools = None,
    max_tool_steps: to.MaxToolSteps = 10,
    tool_timeout: to.ToolTimeout = 60.0,
    tool_choice: to.ToolChoice = "auto",
    rpc: o.Rpc = None,
    mmproj: m.ChatMmproj = None,
    max_audio_seconds: m.MaxAudioSeconds = 600.0,
    debug: o.Debug = False,
) -> None:
    """Chat in the terminal; every turn is kept (runner history).

    Piped, each line of stdin is one turn and each answer goes to stdout. In the chat, /help lists
    the commands; Ctrl-C stops an answer, Ctrl-D or /bye quits.

    \b
    Examples:
      runner chat                                  # the default model
      runner chat qwen2.5:7b -s "Answer briefly."
      runner chat --resume                         # the last conversation (or --resume ID)
      printf 'Hi\\nAnd you?\\n' | runner chat smollm2
      runner chat MODEL --mmproj mmproj.gguf       # images: /image photo.png, then ask
    """
    from runner.commands.chat import ChatRequest
    from runner.commands.chat import chat as run_chat

    given = locals()
    request = ChatRequest(
        model=model,
        **_answer_fields(given),
        save=not no_save,
        resume=resume,
        load=load,
        markdown=markdown,
        tools=_tools(given, chat=True),
        compact=_compact(given),
    )
    interactive = sys.stdin is not None and sys.stdin.isatty()
    run_chat(request, stdin=sys.stdin, out=sys.stdout, interactive=interactive)
