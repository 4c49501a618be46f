"""`python -m runner` and the `runner` console script.

A Ctrl-C anywhere in runner's own start-up (the CLI's imports, building the Typer command) exits 130
as a Ctrl-C anywhere else does, without a traceback. Only Python's own start-up, the first ~30 ms
before this module runs, and its finalization after main() returns (when Python has put SIGINT
back to its default, so the process ends by the signal: a shell reports 130 all the same) are not
runner's to handle.
"""

from __future__ import annotations


def main() -> None:
    try:
        from runner.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
