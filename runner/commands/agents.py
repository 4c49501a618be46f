"""The coding agents `runner launch` starts, and what each reads to reach a server: pure functions,
no process started, no file written.

Each agent is told the server's address, a key, the served model's name, its context window and its
output limit through its own settings, found in its own source (the versions in docs/agents.md):

- Claude Code (Anthropic Messages): environment variables only. ANTHROPIC_BASE_URL and
  ANTHROPIC_AUTH_TOKEN (sent as `Authorization: Bearer`); ANTHROPIC_MODEL and the default models
  of each tier (ANTHROPIC_DEFAULT_{OPUS,SONNET,HAIKU}_MODEL, CLAUDE_CODE_SUBAGENT_MODEL: its side
  requests use the same model); CLAUDE_CODE_MAX_CONTEXT_TOKENS, which it reads as the context window
  of a model whose name does not start with "claude-" (else it assumes 200,000 tokens or more);
  CLAUDE_CODE_MAX_OUTPUT_TOKENS; CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC (no telemetry, no update
  check). ANTHROPIC_API_KEY is removed from its environment: with it set too, it asks which to use.
- Codex CLI (OpenAI Responses): `-c key=value` overrides of its config.toml on its command line, so
  ~/.codex is neither read for these keys nor written: a model provider with `wire_api = "responses"`
  whose key is read from the environment variable `env_key` names, and `model_context_window`. It
  sends no output limit (the server's context bounds an answer).
- opencode (OpenAI chat completions): OPENCODE_CONFIG_CONTENT, a config in an environment variable
  that opencode merges over the user's own files: a provider on `@ai-sdk/openai-compatible` with the
  model's `limit.context` and `limit.output`, used as `model` and as `small_model` (its titles).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

AGENT_KEY_ENV = "RUNNER_LAUNCH_API_KEY"  # where Codex reads the key from (its provider's env_key)
PROVIDER = "runner"  # the provider's name in Codex's and opencode's settings


@dataclass(frozen=True)
class Agent:
    name: str  # as `runner launch NAME` takes it
    binary: str  # the program on PATH
    package: str  # its npm package
    api: str  # the API it speaks to the server
    first_prompt: int  # tokens of its first request before the question (SmolLM2's tokenizer, docs/agents.md)
    headless: str  # its one-shot mode, for the docs and the tests

    @property
    def install(self) -> str:
        return f"npm install -g {self.package}"


AGENTS = {
    "claude": Agent("claude", "claude", "@anthropic-ai/claude-code", "Anthropic Messages", 19_987, "-p"),
    "codex": Agent("codex", "codex", "@openai/codex", "OpenAI Responses", 6_357, "exec"),
    "opencode": Agent("opencode", "opencode", "opencode-ai", "OpenAI chat completions", 7_543, "run"),
}


@dataclass(frozen=True)
class Endpoint:
    """The server an agent is pointed at: where, its key, the model's name there and its limits."""

    url: str  # http://127.0.0.1:PORT, no path
    key: str
    model: str
    context: int  # a sequence's context window, tokens
    output: int  # an answer's tokens at most, as the agent is told


@dataclass(frozen=True)
class Setup:
    """What the agent's process is given: environment variables set and removed, and arguments put
    before the user's own."""

    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    args: tuple[str, ...] = ()


def setup_for(agent: Agent, at: Endpoint) -> Setup:
    """The environment and arguments that point `agent` at the server `at`, and nothing else."""
    if agent.name == "claude":
        return _claude(at)
    if agent.name == "codex":
        return _codex(at)
    return _opencode(at)


def _claude(at: Endpoint) -> Setup:
    models = ["ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL"]
    models += ["ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL"]
    env = {
        "ANTHROPIC_BASE_URL": at.url,
        "ANTHROPIC_AUTH_TOKEN": at.key,
        **dict.fromkeys(models, at.model),
        "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(at.context),
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(at.output),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return Setup(env=env, unset=("ANTHROPIC_API_KEY",))


def _codex(at: Endpoint) -> Setup:
    provider = {
        "name": PROVIDER,
        "base_url": f"{at.url}/v1",
        "env_key": AGENT_KEY_ENV,
        "wire_api": "responses",
    }
    table = ", ".join(f"{k} = {json.dumps(v)}" for k, v in provider.items())  # a TOML inline table
    overrides = [
        f"model_provider={json.dumps(PROVIDER)}",
        f"model_providers.{PROVIDER}={{{table}}}",
        f"model={json.dumps(at.model)}",
        f"model_context_window={at.context}",
    ]
    return Setup(env={AGENT_KEY_ENV: at.key}, args=tuple(arg for o in overrides for arg in ("-c", o)))


def _opencode(at: Endpoint) -> Setup:
    model = {"name": at.model, "limit": {"context": at.context, "output": at.output}, "tool_call": True}
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": PROVIDER,
        "options": {"baseURL": f"{at.url}/v1", "apiKey": at.key},
        "models": {at.model: model},
    }
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {PROVIDER: provider},
        "model": f"{PROVIDER}/{at.model}",
        "small_model": f"{PROVIDER}/{at.model}",
    }
    return Setup(env={"OPENCODE_CONFIG_CONTENT": json.dumps(config)})


# -- the context an agent needs ----------------------------------------------------------------------

ANSWER_ROOM = 4096  # tokens past the first prompt: the question, an answer, a tool call and its result
OUTPUT_MAX = 8192  # the output limit agents are told at most (each asks for 32,000 or more otherwise)


def needed_context(agent: Agent) -> int:
    """A sequence's context that holds the agent's first request and a turn of work after it, rounded
    up to a multiple of 1,024 (other tokenizers than SmolLM2's count differently: docs/agents.md)."""
    need = agent.first_prompt + ANSWER_ROOM
    return -(-need // 1024) * 1024


def output_limit(context: int, agent: Agent) -> int:
    """The output limit the agent is told: the room its first prompt leaves, at most OUTPUT_MAX."""
    return max(256, min(OUTPUT_MAX, context - agent.first_prompt))
