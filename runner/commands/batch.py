"""`runner run --each-line` and `--input FILE.jsonl`: a file of prompts, decoded together, answers in order.

PROMPT beside either is a template: {} stands for each line, or each object's "prompt".

Output keeps the input's order. Plain: one line per input line, the answer with its own line breaks
written as spaces (so `paste prompts.txt answers.txt` lines them up; --jsonl keeps the exact text),
an empty line where a prompt failed. --jsonl (or --json: each row's object): one object per input
line, {"id", "text", "finish_reason", "usage", "timings"} as --json names them (with --logprobs N,
"logprobs" as `run --json --logprobs` gives it), or {"id", "error"}. Exit 0 when every
prompt was answered, 2 when some input was rejected (an empty or non-UTF-8 line, malformed JSON, an
unknown field, a bad schema, a prompt longer than a sequence's context), 1 when an answer failed
otherwise (JSON cut short or not matching its schema); the other prompts are answered either way.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO, TextIO

from runner import ui
from runner.commands.output import (
    LOOP_WARNING,
    describe_load,
    logprobs_json,
    open_prompt_cache,
    sampling_for,
    shape_problem,
)
from runner.engine.answer import FINISH_REPEAT, Result, result_json
from runner.engine.batch import run_batch
from runner.engine.logprobs import MAX_TOP
from runner.engine.prefix import PrefixStore
from runner.engine.prompt import render_prompt
from runner.engine.request import Request
from runner.engine.text.constrain import Constraint, constraint
from runner.engine.text.template import build_messages
from runner.errors import RunnerError, UsageError
from runner.limits import check_answer_limits, check_range
from runner.loader import LoadedModel, open_model
from runner.settings import DEFAULTS, LoadSettings

MAX_AUTO_PARALLEL = 8
SAMPLING_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "seed",
)
FIELDS = frozenset({"prompt", "system", "id", "max_tokens", "schema", "images", "audio", *SAMPLING_FIELDS})

ROW_TIMINGS = ("ttft_s", "total_s", "prefill_tokens")  # what a --jsonl row shows of answer.TIMINGS


@dataclass(frozen=True)
class BatchRequest:
    model: str
    template: str | None = None  # the positional PROMPT: "{}" stands for each line
    each_line: bool = False
    input_path: str | None = None
    parallel: int | None = None  # None: what the plan fits, at most MAX_AUTO_PARALLEL
    jsonl: bool = False
    system: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    schema: str | None = None
    format: str | None = None
    grammar: str | None = None
    settings: LoadSettings = DEFAULTS  # how the model loads (--ctx, --threads, --mmproj for rows' images ...)
    verbose: bool = False
    logprobs: int | None = None  # --logprobs N: each row's answer tokens scored, in its --jsonl object
    max_audio_seconds: float = 600.0  # --max-audio-seconds: a row's clip's length at most


@dataclass
class Item:
    """One input line: what it asks, or why it cannot be asked."""

    index: int
    id: Any
    prompt: str = ""
    system: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    rule: Constraint | None = None
    error: str | None = None
    images: list[Any] = field(default_factory=list)  # "images": runner.images.Image, decoded


def run_batch_command(request: BatchRequest, *, stdin: BinaryIO | None, out: TextIO) -> int:
    """Answer every line; returns the exit code (0, 1 or 2, as the module says)."""
    check_answer_limits(request.max_tokens, request.stop)
    if request.parallel is not None:
        check_range(request.parallel, "--parallel", 1, 256)
    if request.each_line == (request.input_path is not None):
        raise UsageError("choose one: --each-line (prompts on stdin) or --input FILE.jsonl")
    if request.logprobs is not None:
        check_range(request.logprobs, "--logprobs", 0, MAX_TOP)
        if not request.jsonl:
            raise UsageError("--logprobs goes with --jsonl or --json (a field of each row's object)")
    lines = _read_lines(request, stdin)
    shared = constraint(schema=request.schema, format=request.format, grammar=request.grammar)
    items = _read_items(request, lines, shared)
    if not items:
        raise UsageError("no prompts: the input is empty")
    wanted = request.parallel or min(MAX_AUTO_PARALLEL, max(1, sum(1 for i in items if i.error is None)))
    settings = replace(request.settings, parallel=wanted, most_parallel=request.parallel is None)
    loaded = open_model(request.model, settings)
    try:
        if request.verbose:
            ui.info(f"{describe_load(loaded)} · {ui.count(loaded.engine.context.n_seq, 'sequence')} at once")
        return _answer(loaded, request, items, out)
    finally:
        loaded.close()


def _read_lines(request: BatchRequest, stdin: BinaryIO | None) -> list[bytes]:
    """The input's lines: --input's file, named first if it cannot be read; else stdin, read only
    once PROMPT, if given, is a template."""
    if request.input_path is None:
        _check_template(request)
        if stdin is None:
            raise UsageError(
                "--each-line reads prompts from stdin: pipe them in (runner run MODEL --each-line < f)"
            )
        return stdin.read().splitlines()
    try:
        with open(request.input_path, "rb") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise UsageError(f"--input: cannot read {request.input_path}: {exc.strerror or exc}") from None
    _check_template(request)
    return lines


def _check_template(request: BatchRequest) -> None:
    """PROMPT beside --each-line or --input is a template: {} stands for each prompt."""
    if request.template is None or "{}" in request.template:
        return
    if request.input_path is not None:
        raise UsageError(
            '--input takes a JSONL file, one {"prompt": …} object per line; PROMPT beside it is a '
            "template: put {} where each prompt goes, or leave PROMPT out"
        )
    raise UsageError("with --each-line, PROMPT is a template: put {} where each line goes")


def _read_items(request: BatchRequest, raw: list[bytes], shared: Constraint | None) -> list[Item]:
    items = []
    for n, line in enumerate(raw):
        item = Item(index=n, id=n + 1, rule=shared)
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            item.error = f"line {n + 1} is not UTF-8 text (byte {exc.start})"
            items.append(item)
            continue
        if request.input_path is not None:
            _from_json(item, text, n + 1, request.max_audio_seconds)
        elif not text.strip():
            item.error = f"line {n + 1} is empty"
        else:
            item.prompt = text
        if request.template and item.error is None:
            item.prompt = request.template.replace("{}", item.prompt)
        items.append(item)
    return items


def _from_json(item: Item, text: str, line: int, max_audio_seconds: float) -> None:
    if not text.strip():
        item.error = f"line {line} is empty"
        return
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        item.error = f"line {line} is not JSON ({exc.msg} at column {exc.colno})"
        return
    if not isinstance(obj, dict):
        item.error = f"line {line} is not a JSON object"
        return
    item.id = obj.get("id", item.id)
    unknown = sorted(set(obj) - FIELDS)
    if unknown:
        item.error = f"line {line}: unknown field {', '.join(unknown)} (known: {', '.join(sorted(FIELDS))})"
        return
    prompt, system = obj.get("prompt"), obj.get("system")
    if not isinstance(prompt, str) or not prompt.strip():
        item.error = f'line {line}: "prompt" must be a non-empty string'
        return
    if system is not None and not isinstance(system, str):
        item.error = f'line {line}: "system" must be a string'
        return
    item.prompt, item.system = prompt, system
    item.sampling = {k: obj[k] for k in SAMPLING_FIELDS if k in obj}
    try:
        if "max_tokens" in obj:
            if not isinstance(obj["max_tokens"], int):
                raise UsageError('"max_tokens" must be an integer')
            check_answer_limits(obj["max_tokens"], ())
            item.max_tokens = obj["max_tokens"]
        if "schema" in obj:
            schema = obj["schema"]
            item.rule = constraint(schema=json.dumps(schema) if isinstance(schema, dict) else str(schema))
        if "images" in obj:
            item.images = _images(obj["images"])
        if "audio" in obj:  # clips after the images, as run --audio puts them
            from runner.commands.attach import row_clips

            item.images = [*item.images, *row_clips(obj["audio"], max_audio_seconds)]
    except RunnerError as exc:
        item.error = f"line {line}: {exc}"


def _images(names: Any) -> list[Any]:
    """A row's "images": local files (as --image takes them, no stdin), decoded and bounded."""
    from runner.images import MAX_IMAGES, read_image_arg

    if not isinstance(names, list) or not all(isinstance(n, str) and n not in ("", "-") for n in names):
        raise UsageError('"images" must be a list of image file paths')
    if len(names) > MAX_IMAGES:
        raise UsageError(f'"images": {len(names)} images, at most {MAX_IMAGES} a prompt')
    return [read_image_arg(name, sys.stdin.buffer) for name in names]


def _answer(loaded: LoadedModel, request: BatchRequest, items: list[Item], out: TextIO) -> int:
    engine = loaded.engine
    asked: list[Request] = []
    rows: list[int] = []  # each request's item index
    errors: dict[int, str] = {i.index: i.error for i in items if i.error}
    for item in items:
        if item.error:
            continue
        try:
            sampling, _ = sampling_for(loaded, {**request.sampling, **item.sampling})
            system = item.system if item.system is not None else request.system
            if system is None and loaded.entry is not None:
                system = loaded.entry.system
            messages = build_messages(engine.markers(len(item.images)) + item.prompt, system)
            prompt = render_prompt(engine, loaded.header, messages, quiet=True, images=item.images)
        except (RunnerError, TypeError) as exc:
            errors[item.index] = f"line {item.index + 1}: {exc}"
            continue
        max_tokens = item.max_tokens or request.max_tokens
        asked.append(
            Request(
                prompt,
                sampling,
                max_tokens=max_tokens,
                stop=request.stop,
                shape=item.rule,
                logprobs=request.logprobs,
            )
        )
        rows.append(item.index)
    scored = (lambda r: logprobs_json(engine, r.logprobs)) if request.logprobs is not None else None
    writer = _OrderedWriter(out, items, request.jsonl, errors, scored)
    writer.flush_ready()
    with ui.batch_progress(len(items), enabled=ui.stderr_is_tty()) as progress:

        def done(result: Result) -> None:
            writer.add(replace(result, index=rows[result.index]))
            if progress is not None:
                progress(writer.finished, writer.tokens)

        if asked:
            # the prefix store's disk tier: a head `runner run` or `chat` stored is loaded, not evaluated
            store = PrefixStore(disk=open_prompt_cache(True, None))
            stats = run_batch(engine, asked, done, parallel=engine.context.n_seq, store=store)
            if request.verbose:
                rate = stats.completion_tokens / stats.wall_s if stats.wall_s else 0.0
                threads = f"{stats.threads} thread{'s' if stats.threads != 1 else ''}"
                changed = f", changed {stats.thread_changes}x" if stats.thread_changes else ""
                ui.info(
                    f"{stats.completion_tokens} tokens in {stats.wall_s:.2f} s ({rate:.1f} tok/s in all) · "
                    f"{stats.steps} steps on {threads}{changed}"
                )
    writer.flush_ready()
    if writer.rejected:
        return 2
    return 1 if writer.failed else 0


class _OrderedWriter:
    """Answers as they finish, written in input order: one waits for those before it."""

    def __init__(
        self,
        out: TextIO,
        items: list[Item],
        jsonl: bool,
        errors: dict[int, str],
        scored: Callable[[Result], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.out, self.items, self.jsonl = out, {i.index: i for i in items}, jsonl
        self.scored = scored  # --logprobs: a row's answer tokens, as run --json gives them
        self.ready: dict[int, dict[str, Any]] = {}
        self.next = 0
        self.finished = 0
        self.tokens = 0
        self.rejected = 0  # bad input
        self.failed = 0  # an answer that is not what was asked
        for index, error in errors.items():
            self.ready[index] = {"id": self.items[index].id, "error": error}
            self.rejected += 1
            self.finished += 1

    def add(self, result: Result) -> None:
        item = self.items[result.index]
        self.finished += 1
        t = result.timings
        self.tokens += t.completion_tokens
        if result.error is not None:
            self.rejected += 1
            self.ready[result.index] = {"id": item.id, "error": f"line {result.index + 1}: {result.error}"}
        else:
            problem = shape_problem(result)
            if problem is not None:
                self.failed += 1
                self.ready[result.index] = {"id": item.id, "error": f"line {result.index + 1}: {problem}"}
                self.flush_ready()
                return
            text = result.text.strip() if item.rule is not None else result.text
            if result.finish_reason == FINISH_REPEAT:
                ui.warn(f"line {result.index + 1}: {LOOP_WARNING}")
            data = result_json(replace(result, text=text), ROW_TIMINGS)
            row: dict[str, Any] = {
                name: data[name]
                for name in ("text", "reasoning", "finish_reason", "usage", "timings")
                if name in data
            }
            if self.scored is not None:
                row["logprobs"] = self.scored(result)
            self.ready[result.index] = {"id": item.id, **row}
        self.flush_ready()

    def flush_ready(self) -> None:
        while self.next in self.ready:
            record = self.ready.pop(self.next)
            if self.jsonl:
                self.out.write(json.dumps(record, ensure_ascii=False) + "\n")
            elif "error" in record:
                ui.error(record["error"])
                self.out.write("\n")
            else:
                self.out.write(" ".join(record["text"].split("\n")).strip() + "\n")
            self.out.flush()
            self.next += 1
