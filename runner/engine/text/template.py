"""Chat templates from GGUF metadata, rendered in a sandbox.

A chat template is untrusted input (CVE-2024-34359 was a template that ran code through an unsandboxed
Jinja environment), so it only ever renders in jinja2's ImmutableSandboxedEnvironment, with the few
helpers Hugging Face templates expect (raise_exception, strftime_now, a tojson that keeps Unicode).

Importing jinja2 and compiling a template takes ~40 ms, so a caller about to load the model can start
it beside the load (compile_ahead): llama.cpp builds the vocabulary without holding the GIL.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from runner.errors import InvalidModelFile

TEMPLATE_KEY = "tokenizer.chat_template"


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    extra: Mapping[str, Any] | None = None  # what a server's client sends beside: tool_calls, tool_call_id

    def as_dict(self) -> dict[str, Any]:
        return {"role": self.role, "content": self.content, **(self.extra or {})}


def build_messages(prompt: str, system: str | None = None) -> list[Message]:
    messages = [Message("system", system)] if system is not None else []
    messages.append(Message("user", prompt))
    return messages


class _TemplateError(Exception):
    pass


def _raise_exception(message: str) -> None:
    raise _TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **kwargs: Any) -> str:
    sort = kwargs.get("sort_keys", False)
    return json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort, default=_listed)


def _listed(value: Any) -> list[Any]:
    """What `| map(...)` and `| select(...)` give a template (generators) as JSON lists, as minja's
    tojson writes them (llama.cpp's DeepSeek-R1 template does `tools | map(...) | tojson`)."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{type(value).__name__} is not JSON")
    return list(value)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


_AHEAD: dict[str, threading.Thread] = {}  # compiles started by compile_ahead, until they are waited for
_AHEAD_LOCK = threading.Lock()


def compile_ahead(source: object) -> None:
    """Import jinja2 and compile `source` (a GGUF's chat template) on a thread, for a render to come.
    What it finds wrong, it leaves for that render to raise again: it only ever fills the cache."""
    if not isinstance(source, str) or not source.strip():
        return

    def work() -> None:
        with contextlib.suppress(Exception):  # the render compiles again, and reports it
            _compiled(source)

    with _AHEAD_LOCK:
        if source in _AHEAD:
            return
        _AHEAD[source] = thread = threading.Thread(target=work, name="runner-template", daemon=True)
    thread.start()


def _compile(source: str) -> Any:
    with _AHEAD_LOCK:
        ahead = _AHEAD.pop(source, None)
    if ahead is not None:
        ahead.join()  # its result (or nothing, if it failed) is in _compiled's cache
    return _compiled(source)


@lru_cache(maxsize=8)
def _compiled(source: str) -> Any:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render(
    source: str,
    messages: list[Message],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
    tools: list[dict[str, Any]] | None = None,
    reasoning_effort: str | None = None,
) -> str:
    """Render messages with the model's template; any failure is the model file's fault.

    enable_thinking (--think/--no-think) and reasoning_effort (gpt-oss's levels) are passed only when
    set: templates that read them (Qwen3, SmolLM3; gpt-oss) keep their own default otherwise, and the
    others never see them.
    """
    import jinja2

    extra: dict[str, Any] = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    if reasoning_effort is not None:
        extra["reasoning_effort"] = reasoning_effort
    if tools:
        extra["tools"] = tools
    try:
        template = _compile(source)
        return str(
            template.render(
                messages=[m.as_dict() for m in messages],
                bos_token=bos_token,
                eos_token=eos_token,
                add_generation_prompt=add_generation_prompt,
                **extra,
            )
        )
    except jinja2.exceptions.SecurityError as exc:
        raise InvalidModelFile(f"the model's chat template tried an unsafe operation: {exc}") from exc
    except (jinja2.TemplateError, _TemplateError, TypeError, ValueError) as exc:
        raise InvalidModelFile(f"the model's chat template failed to render: {exc}") from exc
