"""The chat's slash commands as a piped chat meets them: a value /set refuses is said in /set's words
(`/set temperature must be …`), never with the flag's (`--temperature`), and the chat goes on."""

from __future__ import annotations

from tests.conftest import run_cli


def test_a_refused_set_names_the_slash_command_not_the_flag() -> None:
    lines = "/set temperature 5\n/set max-tokens 0\n/set format xml\n/set top-p 0\nHi\n"
    done = run_cli("chat", "smollm2", "--max-tokens", "4", "--temperature", "0", input=lines.encode())
    err = done.stderr.decode()
    assert done.returncode == 2 and done.stdout.strip(), err  # refused lines said, Hi still answered
    for said in (
        "runner: error: /set temperature must be between 0 and 2 (got 5)",
        "runner: error: /set max-tokens must be at least 1 (got 0)",
        "runner: error: /set format must be json (got 'xml')",
        "runner: error: /set top-p must be in (0, 1] (got 0)",
    ):
        assert said in err, err
    assert "--temperature" not in err and "--max-tokens" not in err and "Traceback" not in err
