"""`python -m runner` and the `runner` console script.

A Ctrl-C anywhere in runner's own start-up (the CLI's imports, building the Typer command) exits 130
as a Ctrl-C anywhere else does, without a traceback; SIGTERM 143 and SIGHUP 129 the same way
(runner.interrupt). Only Python's own start-up, the first ~30 ms before this module runs, and its
finalization after main() returns (when SIGINT, SIGTERM and SIGHUP are back at their defaults, so the
process ends by the signal: a shell reports 130, 143 or 129 all the same) are not runner's to handle.
"""

from __future__ import annotations

from runner import interrupt


def main() -> None:
    try:
        interrupt.install()
        try:
            from runner.cli import main as cli_main

            cli_main()
        finally:
            interrupt.uninstall()
    except (KeyboardInterrupt, interrupt.Stopped, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and not interrupt.wrapped(exc):  # (a Ctrl-C wrapped in an import)
            raise
        raise SystemExit(interrupt.exit_code()) from None


if __name__ == "__main__":
    main()
