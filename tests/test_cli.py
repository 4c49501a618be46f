"""`runner run` as a user meets it: real processes, stdout and stderr apart, exit codes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from tests.conftest import run_cli

FIXED = ["--seed", "42", "--max-tokens", "30", "--threads", "2"]  # a fixed count: see docs/run.md, --seed


@pytest.fixture(scope="module", autouse=True)
def _model(smollm2_path: Path) -> Path:
    return smollm2_path  # fetched once before any CLI test runs


COMMANDS = ["run", "chat", "pull", "list", "show", "rm", "search", "fit", "history"]


def test_help_for_every_command() -> None:
    top = run_cli("--help")
    assert top.returncode == 0
    for command in COMMANDS:
        assert f"  {command} ".encode() in top.stdout
        done = run_cli(command, "--help")
        assert done.returncode == 0, done.stderr
        assert f"Usage: runner {command}".encode() in done.stdout
        assert b"Examples:" in done.stdout
        if b"MODEL" in done.stdout:
            assert b"An alias from models.toml" in done.stdout  # arguments keep their help text


def test_a_command_built_alone_is_the_command_built_with_the_app() -> None:
    """main() builds only the subcommand the command line names (start-up); its options and help are
    those of the whole app's, and a typo still gets the whole app's suggestion, once."""
    from runner.cli.app import command

    whole = command()
    assert isinstance(whole, click.Group)
    for name in COMMANDS + ["bench", "cache", "ls"]:
        alone = command(name)
        assert isinstance(alone, click.Group) and name in alone.commands
        ctx = click.Context(whole)
        ours, theirs = alone.commands[name], whole.commands[name]
        assert [p.to_info_dict() for p in ours.params] == [p.to_info_dict() for p in theirs.params]
        assert ours.get_help(click.Context(ours, parent=ctx, info_name=name)) == theirs.get_help(
            click.Context(theirs, parent=ctx, info_name=name)
        )
    typo = run_cli("rnu", "hi")
    assert typo.returncode == 2 and typo.stderr.count(b"Did you mean 'run'?") == 1


def test_help_does_not_import_heavy_modules() -> None:
    heavy = ("llama_cpp", "huggingface_hub", "rich", "prompt_toolkit", "sqlite3")
    code = f"import sys, runner.cli; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_fixed_seed_prints_the_same_answer_every_time() -> None:
    first = run_cli("run", "smollm2", "Write a haiku about rain.", *FIXED)
    second = run_cli("run", "smollm2", "Write a haiku about rain.", *FIXED)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert len(first.stdout.strip()) > 20


def test_stdout_holds_only_the_answer_and_llama_logs_are_silent() -> None:
    done = run_cli("run", "smollm2", "Say hello.", *FIXED)
    assert done.returncode == 0
    assert done.stderr == b""  # no llama.cpp log, no progress, nothing
    assert b"llama" not in done.stdout and b"runner:" not in done.stdout
    debug = run_cli("run", "smollm2", "Say hello.", *FIXED, "--debug")
    assert b"llama_model_loader" in debug.stderr or b"load_tensors" in debug.stderr
    assert debug.stdout == done.stdout  # --debug adds to stderr only


def test_json_has_the_documented_fields() -> None:
    done = run_cli("run", "smollm2", "What is 2+2?", "--json", *FIXED)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # speculation: on by default (n-gram); prompt_cache only where a head was loaded or stored
    assert set(report) == {"model", "text", "finish_reason", "usage", "timings", "speculation"}
    assert report["model"] == "smollm2"
    assert report["finish_reason"] in {"stop", "length"}
    assert set(report["usage"]) == {"prompt_tokens", "completion_tokens"}
    assert report["usage"]["prompt_tokens"] > 10 and 0 < report["usage"]["completion_tokens"] <= 30
    assert set(report["timings"]) == {
        "startup_s",
        "load_s",
        "ttft_s",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "total_s",
        "threads",
        "thread_changes",
    }
    assert report["timings"]["threads"] >= 1 and report["timings"]["thread_changes"] >= 0
    assert all(v > 0 for k, v in report["timings"].items() if k != "thread_changes")
    t = report["timings"]
    assert t["load_s"] < t["startup_s"]  # the process's start to its first prefill, the load within
    assert report["text"].strip()
    # the streamed text is the JSON text
    plain = run_cli("run", "smollm2", "What is 2+2?", *FIXED)
    assert plain.stdout.decode().rstrip("\n") == report["text"].rstrip("\n")


def test_the_start_up_figure_is_within_the_process_s_own_lifetime() -> None:
    """since_process_start, in a fresh process, reads no more than the time the parent saw it take
    (plus one clock tick): psutil's create_time ran long by the boot time's lost fraction of a second."""
    code = "from runner.engine.answer import since_process_start as s; print(s())"
    for _ in range(3):
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        wall = time.monotonic() - start
        assert 0 < float(done.stdout) <= wall + 0.011


def test_stdin_comes_first_then_the_argument() -> None:
    piped = b"The secret word is PINEAPPLE.\n"
    both = run_cli(
        "run",
        "smollm2",
        "What is the secret word? Answer with one word.",
        "--temperature",
        "0",
        "--max-tokens",
        "10",
        "--json",
        input=piped,
    )
    assert both.returncode == 0, both.stderr
    assert "pineapple" in json.loads(both.stdout)["text"].lower()
    only_stdin = run_cli(
        "run",
        "smollm2",
        "--temperature",
        "0",
        "--max-tokens",
        "5",
        "--json",
        input=b"Reply with the word OK.",
    )
    assert only_stdin.returncode == 0
    # raw mode shows exactly what was sent: stdin, a blank line, then the argument
    raw = run_cli(
        "run",
        "smollm2",
        "B",
        "--raw",
        "--temperature",
        "0",
        "--max-tokens",
        "1",
        "--json",
        "--verbose",
        input=b"A\n",
    )
    assert json.loads(raw.stdout)["usage"]["prompt_tokens"] == 4  # 'A', '\n', '\n', 'B'


def test_stop_and_max_tokens_flags() -> None:
    full = json.loads(
        run_cli(
            "run", "smollm2", "List five fruits.", "--temperature", "0", "--max-tokens", "40", "--json"
        ).stdout
    )
    cut_at = full["text"].index("\n3.")
    stopped = json.loads(
        run_cli(
            "run",
            "smollm2",
            "List five fruits.",
            "--temperature",
            "0",
            "--max-tokens",
            "40",
            "--json",
            "--stop",
            "\n3.",
            "--stop",
            "zzz",
        ).stdout
    )
    assert stopped["text"] == full["text"][:cut_at]
    assert stopped["finish_reason"] == "stop"
    short = json.loads(
        run_cli("run", "smollm2", "Tell me a story.", "--max-tokens", "3", "--json", "--seed", "1").stdout
    )
    assert short["usage"]["completion_tokens"] == 3
    assert short["finish_reason"] == "length"


def test_verbose_reports_timings_on_stderr() -> None:
    done = run_cli("run", "smollm2", "Hi", *FIXED, "--verbose")
    assert done.returncode == 0
    err = done.stderr.decode()
    for word in ("load", "prompt", "ttft", "prefill", "tok/s", "generated", "decode", "finish"):
        assert word in err
    assert "tok/s" not in done.stdout.decode()
    # the start-up's phases, which add up to the start-up figure (each rounded to 10 ms)
    [phases] = [line for line in err.splitlines() if line.startswith("runner: start-up: ")]
    names = [part.rsplit(" ", 2)[0] for part in phases.removeprefix("runner: start-up: ").split(" · ")]
    assert names == [
        "interpreter and imports",
        "model resolved and planned",
        "load" if names[2] == "load" else "load, begun beside the imports",  # runner.engine.preload
        "prompt rendered and tokenized",
        "first token",
    ]
    seconds = [float(part.rsplit(" ", 2)[1]) for part in phases.split(" · ")]
    startup = float(err.split("start-up ", 1)[1].split(" s", 1)[0])
    assert abs(sum(seconds[:-1]) - startup) <= 0.03 + 0.01 * len(seconds), (phases, startup)


def test_system_message_reaches_the_model() -> None:
    done = run_cli(
        "run",
        "smollm2",
        "What is your name?",
        "-s",
        "Your name is Zorblax. Always say it.",
        "--temperature",
        "0",
        "--max-tokens",
        "20",
        "--json",
    )
    assert "zorblax" in json.loads(done.stdout)["text"].lower()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "5"], "--temperature must be between 0 and 2 (got 5)"),
        (["--top-p", "0"], "--top-p must be in (0, 1] (got 0)"),
        (["--top-k", "-1"], "--top-k must be at least 0 (got -1)"),
        (["--min-p", "1.5"], "--min-p must be between 0 and 1 (got 1.5)"),
        (["--repeat-penalty", "0"], "--repeat-penalty must be in (0, 10] (got 0)"),
        (["--presence-penalty", "3"], "--presence-penalty must be between -2 and 2 (got 3)"),
        (["--frequency-penalty", "-9"], "--frequency-penalty must be between -2 and 2 (got -9)"),
        (["--seed", "-4"], "--seed must be between 0 and 4294967294 (got -4)"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1 (got 0)"),
        (["--ctx", "8"], "--ctx must be between 32 and 2147483392 (got 8)"),
        (
            ["--ctx", "2147483647"],
            "--ctx must be at most 2,147,483,392, the largest context llama.cpp counts",
        ),
        (["--gpu-layers", "-2"], "--gpu-layers must be between -1 and 2147483647 (got -2)"),
        (["--threads", "0"], "--threads must be between 1 and 1024 (got 0)"),
        (["--stop", ""], "--stop needs a non-empty string"),
        (["--raw", "-s", "x"], "--system needs the chat template"),
    ],
)
def test_out_of_range_flags_get_one_line_and_exit_2(args: list[str], message: str) -> None:
    done = run_cli("run", "smollm2", "Hi", *args)
    assert done.returncode == 2
    err = done.stderr.decode()
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert done.stdout == b""


@pytest.mark.parametrize(
    "args",
    [
        ["fit", "smollm2", "--ctx", "0"],
        ["fit", "smollm2", "--gpu-layers", "-5"],
        ["pull", "someone/Some-GGUF", "--ctx", "0"],  # said before the Hub is asked
        ["run", "someone/Some-GGUF", "Hi", "--gpu-layers", "-5"],
    ],
)
def test_fit_pull_and_run_check_ctx_and_gpu_layers_first(args: list[str]) -> None:
    done = run_cli(*args)
    assert done.returncode == 2, done.stderr
    err = done.stderr.decode()
    assert err.startswith("runner: error: --") and err.count("\n") == 1
    assert done.stdout == b""


def test_missing_file(tmp_path: Path) -> None:
    done = run_cli("run", str(tmp_path / "nope.gguf"), "Hi")
    assert done.returncode == 2
    assert f"no such file: {tmp_path / 'nope.gguf'}" in done.stderr.decode()


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    fake = tmp_path / "notes.gguf"
    fake.write_text("just some text, not a model\n")
    done = run_cli("run", str(fake), "Hi")
    assert done.returncode == 2
    assert "not a GGUF file" in done.stderr.decode()
    assert "Traceback" not in done.stderr.decode()


def test_truncated_gguf(tmp_path: Path, smollm2_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with smollm2_path.open("rb") as src:
        cut.write_bytes(src.read(20_000_000))
    done = run_cli("run", str(cut), "Hi")
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "truncated" in err and "98,362,432" in err.replace(" ", "") or "truncated" in err
    assert err.count("\n") == 1


def test_corrupt_gguf_header(tmp_path: Path, smollm2_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    data = bytearray(smollm2_path.read_bytes()[:4_000_000])
    data[8:16] = (2**62).to_bytes(8, "little")  # the tensor count: absurd
    bad.write_bytes(bytes(data))
    done = run_cli("run", str(bad), "Hi")
    assert done.returncode == 2
    assert "corrupt" in done.stderr.decode() or "limit" in done.stderr.decode()
    assert "Traceback" not in done.stderr.decode()


def test_unknown_alias_suggests_the_closest() -> None:
    done = run_cli("run", "smolm2", "Hi")
    assert done.returncode == 2
    assert "unknown model 'smolm2'; did you mean smollm2, smollm3 or smolvlm:256m?" in done.stderr.decode()


def test_prompt_longer_than_the_context() -> None:
    done = run_cli("run", "smollm2", "--ctx", "256", input=b"word " * 400)
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "the prompt is" in err and "tokens but the context is 256" in err and "--ctx 768" in err
    assert done.stdout == b""


def test_no_prompt_on_a_terminal_with_json_is_a_usage_error_not_a_wait() -> None:
    """Without --json the chat opens (tests/test_chat.py); a JSON answer needs a prompt."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "runner", "run", "smollm2", "--json"],
            stdin=follower,
            capture_output=True,
            timeout=60,
        )
    finally:
        os.close(leader)
        os.close(follower)
    assert done.returncode == 2
    assert "no prompt" in done.stderr.decode()


def test_closed_pipe_ends_quietly() -> None:
    story = "'Tell me a long story.' --seed 3 --max-tokens 400"
    shell = f"{sys.executable} -m runner run smollm2 {story} | head -c 20"
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {shell}"], capture_output=True, timeout=120, env=os.environ
    )
    assert len(done.stdout) == 20
    assert done.stderr == b""
    assert done.returncode == 141


def test_ctrl_c_stops_generation_keeps_output_and_exits_130() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runner",
            "run",
            "smollm2",
            "1, 2, 3, 4,",
            "--raw",
            "--temperature",
            "0",
            "--ctx",
            "2048",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    got = b""
    deadline = time.monotonic() + 60
    while len(got) < 20 and time.monotonic() < deadline:
        got += os.read(proc.stdout.fileno(), 64)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert b"Traceback" not in err
    assert (got + rest).startswith(b" 5, 6, 7")
    assert len(got + rest) < 5000  # stopped well before the context filled


def test_python_dash_m_runner_works() -> None:
    done = subprocess.run([sys.executable, "-m", "runner", "--help"], capture_output=True)
    assert done.returncode == 0 and b"run" in done.stdout


def test_a_gguf_llama_cpp_cannot_load_says_why(tmp_path: Path) -> None:
    import synth

    odd = synth.write_unknown_arch(tmp_path / "odd.gguf")
    done = run_cli("run", str(odd), "Hi")
    assert done.returncode == 2
    assert (
        done.stderr.decode().strip()
        == f"runner: error: llama.cpp cannot load {odd}: unknown model architecture: 'foobar'"
    )


def test_a_model_without_a_tokenizer_gets_exit_2_not_an_abort(tmp_path: Path) -> None:
    import synth

    path = synth.write_model(tmp_path / "qwen2.gguf", synth.SPECS["qwen2"])  # tokenizer.ggml.model "none"
    done = run_cli("run", str(path), "hi", "--raw", "--max-tokens", "3")
    assert done.returncode == 2, done.stderr
    assert b"has no tokenizer" in done.stderr and b"Traceback" not in done.stderr and done.stdout == b""


@pytest.mark.model
def test_bench_says_when_its_repetitions_disagree_beyond_the_noise() -> None:
    from runner.commands.bench import NOISE, disagreement, spreads, summarize

    samples = {
        "pp512": [100.0, 104.0, 98.0],
        "tg128": [50.0, 20.0, 50.0],  # one run while something else used the machine
        "ttft": [0.05, 0.05, 0.05],
        "end_to_end": [2.0, 2.2, 1.9],
    }
    assert spreads(samples) == {"pp512": 0.06, "tg128": 0.6, "ttft": 0.0, "end_to_end": 0.15}
    figures = summarize(samples, rates=[10.0, 12.0, 11.0])
    assert (figures["tg_tokens_per_s"], figures["end_to_end"]) == (
        50.0,
        {"wall_s": 2.0, "tokens_per_s": 11.0},
    )
    assert figures["spread"] == spreads(samples) and figures["unsteady"] == ["tg128"]
    warning = disagreement(figures["spread"])
    assert warning is not None and "tg128 by 60%" in warning and "pp512" not in warning
    assert f"over {NOISE:.0%} is not noise" in warning
    assert disagreement(spreads({"pp512": [100.0, 104.0, 98.0]})) is None
    single = summarize({name: v[:1] for name, v in samples.items()}, rates=[10.0])
    assert (single["spread"], single["unsteady"]) == ({}, [])  # one run: nothing to compare


def _bench_until(
    args: list[str], reached: Callable[[bytes, int], bool], *, terminal: bool
) -> tuple[bytes, bytes, int]:
    """`runner bench ARGS`, its stderr on a pty or a pipe, until reached(stderr so far, its pid) says
    it got where the test wants it; then Ctrl-C: (stderr, stdout, exit code). The pty is a terminal
    that draws (TERM=xterm, 160 columns whatever COLUMNS says): under TERM=dumb, as CI may run, rich
    draws no live progress at all, and rightly. SIGINT starts at its default, as a terminal's shell
    leaves it (a script's `&` ignores it, and the bench would run on)."""
    import select

    leader, follower = pty.openpty() if terminal else os.pipe()
    if terminal:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=follower,
        env={**env, "TERM": "xterm"} if terminal else env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.close(follower)
    seen, deadline = b"", time.monotonic() + 180
    try:
        while not reached(seen, proc.pid):
            assert proc.poll() is None, f"the bench ended first ({proc.returncode}): {seen!r}"
            assert time.monotonic() < deadline, f"the bench did not get there within 180 s: {seen!r}"
            if select.select([leader], [], [], 0.1)[0]:
                with contextlib.suppress(OSError):  # the pty closed: the process ended (said next turn)
                    seen += os.read(leader, 4096)
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        os.close(leader)
    return seen, out, proc.returncode


def _running_a_child(pid: int) -> bool:
    """Whether the process has started one of its own (the bench's end to end: a `runner run`)."""
    import psutil

    try:
        return bool(psutil.Process(pid).children())
    except psutil.Error:
        return False


@pytest.mark.model
def test_a_ctrl_c_during_bench_s_ttft_stops_the_bench(smollm2_path: Path) -> None:
    """The warm-up and TTFT answers go through Engine.generate, which reports a Ctrl-C as the answer's
    finish reason and clears it (a chat goes on after one): bench must stop there, not run on."""
    from runner import interrupt
    from runner.commands.bench import _single
    from runner.loader import open_model
    from runner.settings import LoadSettings

    loaded = open_model(str(smollm2_path), LoadSettings(ctx=PP_TG_CTX))
    steps: list[str] = []

    def step(name: str) -> None:
        steps.append(name)
        if name.startswith("TTFT"):
            interrupt.request()  # as SIGINT does inside a deferred block

    try:
        with pytest.raises(KeyboardInterrupt):
            _single(loaded, 2, step)
    finally:
        interrupt.clear()
        loaded.close()
    assert steps == ["pp512 (1 of 2)", "tg128 (1 of 2)", "TTFT (1 of 2)"]


PP_TG_CTX = 512 + 128 + 64


def test_bench_shows_its_progress_on_a_terminal_and_nothing_in_a_pipe() -> None:
    """Each step is named on a terminal's stderr as it starts, and nothing is drawn in a pipe. On the
    terminal the Ctrl-C comes at tg128 (1 of 100): 99 more of each test and 100 `runner run`
    processes are still to come, minutes on any machine, so the bench cannot end first."""
    shown, out, code = _bench_until(
        ["bench", "smollm2", "--repetitions", "100"],
        lambda seen, _: b"tg128 (1 of 100)" in seen,
        terminal=True,
    )
    assert (code, out) == (130, b""), shown  # stopped mid-bench; stdout waits for the figures
    assert b"loading the model" in shown and b"pp512 (1 of 100)" in shown  # each step as it starts
    assert b"2/404" in shown  # the load and pp512 done, of 1 + 4 x 100 + 3
    # in a pipe, the Ctrl-C once the end to end's `runner run` has started: the load, pp512, tg128 and
    # TTFT went by with no bar (should the rest end before the Ctrl-C, the figures are on stdout)
    piped, out, code = _bench_until(
        ["bench", "smollm2", "--repetitions", "1"], lambda _, pid: _running_a_child(pid), terminal=False
    )
    assert piped.decode().startswith("runner: benchmarking smollm2") and len(piped.splitlines()) == 1, piped
    assert (code, out) == (130, b"") or (code == 0 and b"tg128" in out), (code, out)
