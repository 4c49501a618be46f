"""`runner launch AGENT [MODEL] [-- ARGS]`: a coding agent (Claude Code, Codex, opencode) on a local model.

The steps: the agent found on PATH (else one line saying how to install it); the context it needs
checked against the model's trained context and against this machine's memory with the memory
planner (runner fit's), before anything starts, refused with the numbers or with a --ctx that fits;
then `runner serve MODEL` started as a child on a free loopback port with a fresh random key and
two sequences at least (an agent's side requests, titles and summaries, never wait for its main one),
its log in a temporary folder; the agent pointed at it through its own settings (runner.commands.agents:
environment variables and command-line overrides, never a file of the user's) and run in the
foreground; the server stopped when the agent exits, whose exit code becomes launch's.

A server that `runner serve` already runs is not reused: runner keeps no record of the servers it
runs (their port, key and context), and the agent needs the key and the context to be told.
`--print` prints the two commands instead, for people who start each themselves.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from runner import ui
from runner.commands.agents import AGENTS, Agent, Endpoint, Setup, needed_context, output_limit, setup_for
from runner.errors import RunnerError, UsageError
from runner.limits import check_range

if TYPE_CHECKING:
    from runner.gguf import GGUFHeader
    from runner.memory.plan import Plan

LAUNCH_CTX_CAP = (
    65_536  # without --ctx: the trained context, at most this (and at least what the agent needs)
)
PRINT_PORT = 8080  # --print's port: runner serve's default
READY_S = 600.0  # a load (a download first, perhaps) may take minutes


@dataclass(frozen=True)
class LaunchRequest:
    agent: str
    model: str | None = None
    agent_args: list[str] = field(default_factory=list)
    ctx: int | None = None  # a sequence's; None: the trained context within LAUNCH_CTX_CAP
    parallel: int = 2
    print_only: bool = False
    offline: bool = False


@dataclass(frozen=True)
class Planned:
    """What the checks decided: the model as runner serve takes it, the name requests use, a
    sequence's context."""

    model: str
    served_as: str
    ctx: int


def launch(request: LaunchRequest, out: TextIO) -> int:
    """The agent's exit code; with --print, 0 once the commands are printed on `out`."""
    agent = agent_named(request.agent)
    check_range(request.parallel, "--parallel", 2, 64)
    binary = shutil.which(agent.binary)
    if binary is None and not request.print_only:
        raise UsageError(f"{agent.binary} is not installed: {agent.install}")
    planned = plan_launch(agent, request)
    if request.print_only:
        out.write(printed(agent, planned, request))
        return 0
    assert binary is not None
    with serving(planned, request.parallel, request.offline) as at:
        setup = setup_for(agent, replace(at, output=output_limit(at.context, agent)))
        ui.info(f"{agent.binary} on {at.model} · context {at.context:,} a sequence · {at.url}")
        return run_agent([binary, *setup.args, *request.agent_args], setup)


def agent_named(name: str) -> Agent:
    agent = AGENTS.get(name)
    if agent is None:
        raise UsageError(f"{name!r} is not an agent runner launches: {', '.join(AGENTS)}")
    return agent


def plan_launch(agent: Agent, request: LaunchRequest) -> Planned:
    """The context checked, before anything starts: enough for what the agent sends (its first
    request's tokens, docs/agents.md), within the model's trained context unless --ctx says otherwise,
    and held by this machine's memory for --parallel sequences (the plan runner fit makes)."""
    from runner import loader
    from runner.hub.catalog import load_catalog
    from runner.hub.refs import LocalRef, resolve
    from runner.memory.plan import trained_context
    from runner.settings import DEFAULTS

    model = request.model or load_catalog().default
    ref = resolve(model, load_catalog())
    served_as = ref.path.stem if isinstance(ref, LocalRef) else model
    _, path, header = loader.locate_model(model, offline=request.offline)
    need, trained = needed_context(agent), trained_context(header)
    said = f"{agent.name} sends about {agent.first_prompt:,} tokens before its first question"
    ctx = request.ctx
    if ctx is None:
        if trained is not None and trained < need:
            raise UsageError(
                f"{model} was trained on a context of {trained:,} tokens; {said} (its system prompt and "
                f"tools) and needs {need:,}: choose a model with a longer context, or give --ctx {need} "
                "to go past its training (answers degrade)"
            )
        ctx = max(need, min(trained or need, LAUNCH_CTX_CAP))
    elif ctx < need:
        raise UsageError(f"--ctx {ctx:,} is too small: {said} and needs {need:,}: give --ctx {need}")
    planning = loader.serve_planning(request.parallel)  # the plan runner serve will make
    settings = replace(DEFAULTS, ctx=ctx, offline=request.offline, **planning)
    plan, _ = loader.choose_plan(header, loader.machine(), settings, path=path)
    if plan.fits:
        return Planned(model, served_as, ctx)
    most = largest(header, plan)
    if request.ctx is None and most is not None and most >= need:  # the most that fits, said
        ui.info(
            f"{model}: a context of {most:,} tokens a sequence fits here with {request.parallel} sequences"
        )
        return Planned(model, served_as, most)
    raise UsageError(_too_big(model, agent, ctx, request.parallel, most, need))


def largest(header: GGUFHeader, plan: Plan) -> int | None:
    """The largest context a sequence may have here with the plan's offload, cache and sequences."""
    from runner import loader
    from runner.memory.estimate import Load
    from runner.memory.plan import largest_context

    kv = (plan.type_k, plan.type_v)
    load = Load(
        n_ctx=plan.n_ctx, n_gpu_layers=plan.n_gpu_layers, n_seq=plan.n_seq, type_k=kv[0], type_v=kv[1]
    )
    return largest_context(header, loader.machine(), load)


def _too_big(model: str, agent: Agent, ctx: int, parallel: int, most: int | None, need: int) -> str:
    head = f"{model} with {parallel} sequences of {ctx:,} tokens does not fit this machine's memory"
    if most is not None and most >= need:
        return f"{head}; --ctx {most} fits and holds what {agent.name} sends ({need:,} tokens)"
    fits = f"at most {most:,} tokens a sequence fit" if most else "no context fits"
    return f"{head} ({fits}); {agent.name} needs {need:,}: choose a smaller model (runner fit MODEL)"


def printed(agent: Agent, planned: Planned, request: LaunchRequest) -> str:
    """--print: the server's command, then the agent's with its environment, as a shell takes them."""
    key = secrets.token_urlsafe(24)
    url = f"http://127.0.0.1:{PRINT_PORT}"
    at = Endpoint(url, key, planned.served_as, planned.ctx, output_limit(planned.ctx, agent))
    setup = setup_for(agent, at)
    serve = ["runner", "serve", planned.model, "--port", str(PRINT_PORT), "--api-key", key]
    serve += ["--parallel", str(request.parallel), "--ctx", str(planned.ctx)]
    env = [f"{name}={shlex.quote(value)}" for name, value in setup.env.items()]
    unset = [f"-u {name}" for name in setup.unset]
    agent_line = ["env", *unset, *env, agent.binary, *map(shlex.quote, [*setup.args, *request.agent_args])]
    return f"{shlex.join(serve)}\n{' '.join(agent_line)}\n"


@contextlib.contextmanager
def serving(planned: Planned, parallel: int, offline: bool) -> Iterator[Endpoint]:
    """`runner serve` as a child in a session of its own (the terminal's Ctrl-C goes to the agent,
    not to it), ready when /health says so; stopped by SIGTERM when the block ends."""
    port, key = free_port(), secrets.token_urlsafe(24)
    args = [planned.model, "--host", "127.0.0.1", "--port", str(port), "--api-key", key]
    args += ["--parallel", str(parallel), "--ctx", str(planned.ctx)] + (["--offline"] if offline else [])
    folder = Path(tempfile.mkdtemp(prefix="runner-launch-"))
    log = folder / "serve.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runner", "serve", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        ui.info(f"starting runner serve {planned.model} on {url} (its log: {log})")
        context = _ready(proc, url, key, planned.served_as, log)
        yield Endpoint(url, key, planned.served_as, context, 0)
    finally:
        _stop(proc)
        if proc.returncode == 0:
            shutil.rmtree(folder, ignore_errors=True)


def _ready(proc: subprocess.Popen[bytes], url: str, key: str, name: str, log: Path) -> int:
    """Wait for the server; the context a sequence has there (its /v1/models), or the reason it ended."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no log)"]
            raise RunnerError(f"runner serve ended before it was ready: {tail[0]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                models = httpx.get(f"{url}/v1/models", headers=headers, timeout=10).json()["data"]
                return int(next(m for m in models if m["id"] == name)["meta"]["context"])
        time.sleep(0.2)
    raise RunnerError(f"runner serve was not ready within {READY_S:.0f} s (its log: {log})")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_agent(command: list[str], setup: Setup) -> int:
    """The agent in the foreground with the terminal: its exit code. Ctrl-C is the agent's to handle
    (launch ignores it while the agent runs, then stops the server)."""
    env = {k: v for k, v in os.environ.items() if k not in setup.unset}
    env.update(setup.env)
    # a handler that does nothing, not SIG_IGN: an ignored signal stays ignored in the child, a
    # handler is reset to the default at its exec, so the agent gets Ctrl-C as from any shell
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        code = subprocess.call(command, env=env)
        return 128 - code if code < 0 else code  # ended by a signal: as a shell says it (Ctrl-C: 130)
    finally:
        signal.signal(signal.SIGINT, previous)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
