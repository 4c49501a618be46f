#!/bin/sh
# The coding agents tests/test_agents_traffic.py runs headless against `runner launch`: Claude Code,
# Codex CLI and opencode, at the versions docs/agents.md measured, installed with npm into the test
# cache (never globally): $RUNNER_TEST_HOME/agents, by default ~/.cache/runner-tests/agents.
# Without npm (or without the registry), one line says so and those tests skip. Never fails the
# test command.
PREFIX="${RUNNER_TEST_HOME:-$HOME/.cache/runner-tests}/agents"
PACKAGES="@anthropic-ai/claude-code@2.1.197 @openai/codex@0.171.0 opencode-ai@1.18.33"
if [ -x "$PREFIX/bin/claude" ] && [ -x "$PREFIX/bin/codex" ] && [ -x "$PREFIX/bin/opencode" ]; then
    exit 0
fi
if command -v npm >/dev/null 2>&1; then
    # shellcheck disable=SC2086  # the packages, one word each
    if npm install -g --silent --no-audit --no-fund --prefix "$PREFIX" $PACKAGES >/dev/null 2>&1; then
        exit 0
    fi
fi
echo "get_agents: no npm here, or the install failed (npm install -g $PACKAGES): the agent tests skip" >&2
exit 0
