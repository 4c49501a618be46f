"""Helpers that more than one test file uses, and no test file owns: test files import each other
never (tests/test_lint.py checks), so what two of them share lives here. Server and batch helpers
are in tests/serving.py, GGUF writers in tests/synth.py, the terminal in tests/term.py."""

from __future__ import annotations

import importlib.util
import os
import random
import sys
import wave
from io import BytesIO
from pathlib import Path
from types import ModuleType
from typing import Any

import pexpect

from runner.gguf import GGUFHeader, TensorInfo
from runner.store import Store

# -- GGUF headers in memory (test_memory.py, test_plan.py) ---------------------------------------

F32, F16, Q4_0, Q8_0 = 0, 1, 2, 8  # ggml types


def header(arch: str, meta: dict, tensors: list[tuple[str, tuple[int, ...], int]]) -> GGUFHeader:
    """A GGUFHeader as runner.gguf.read_header() returns it, tensors packed in order."""
    infos, offset = [], 0
    for name, shape, ggml_type in tensors:
        info = TensorInfo(name, shape, ggml_type, offset)
        infos.append(info)
        offset += (info.nbytes + 31) // 32 * 32
    metadata = {"general.architecture": arch, **{f"{arch}.{k}": v for k, v in meta.items()}}
    return GGUFHeader("test", 3, metadata, tuple(infos), 32, 4096, 4096 + offset)


def llama_like(
    n_layer: int = 30,
    n_embd: int = 576,
    n_head: int = 9,
    n_head_kv=3,
    n_ff: int = 1536,
    n_vocab: int = 49152,
    arch: str = "llama",
    weight: int = F16,
    **meta,
) -> GGUFHeader:
    """SmolLM2-135M's shape by default."""
    kv = n_head_kv if isinstance(n_head_kv, list) else [n_head_kv] * n_layer
    hd = n_embd // n_head
    tensors = [("token_embd.weight", (n_embd, n_vocab), Q8_0)]
    for il in range(n_layer):
        tensors += [
            (f"blk.{il}.attn_norm.weight", (n_embd,), F32),
            (f"blk.{il}.attn_q.weight", (n_embd, hd * n_head), weight),
            (f"blk.{il}.attn_k.weight", (n_embd, hd * kv[il]), weight),
            (f"blk.{il}.attn_v.weight", (n_embd, hd * kv[il]), weight),
            (f"blk.{il}.attn_output.weight", (hd * n_head, n_embd), weight),
            (f"blk.{il}.ffn_norm.weight", (n_embd,), F32),
            (f"blk.{il}.ffn_gate.weight", (n_embd, n_ff), weight),
            (f"blk.{il}.ffn_up.weight", (n_embd, n_ff), weight),
            (f"blk.{il}.ffn_down.weight", (n_ff, n_embd), weight),
        ]
    tensors.append(("output_norm.weight", (n_embd,), F32))
    base = {
        "block_count": n_layer,
        "embedding_length": n_embd,
        "attention.head_count": n_head,
        "attention.head_count_kv": n_head_kv,
        "feed_forward_length": n_ff,
        "context_length": 8192,
        "vocab_size": n_vocab,
    }
    return header(arch, {**base, **meta}, tensors)


# -- runner chat (test_chat.py, test_chat_screen.py) -------------------------------------------

GREEDY = ["--temperature", "0"]


def conversations() -> list:
    store = Store.open()
    try:
        return [store.load(s.id) for s in reversed(store.summaries())]
    finally:
        store.close()


def spawn(*args: str, size: tuple[int, int] = (40, 160)) -> pexpect.spawn:
    env = {**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm"}
    child = pexpect.spawn(
        sys.executable, ["-m", "runner", *args], env=env, encoding="utf-8", timeout=60, dimensions=size
    )
    child.expect_exact("chatting with smollm2")
    return child


def ready(child: pexpect.spawn) -> None:
    """Wait for the prompt: keys typed before it is drawn reach a terminal in cooked mode, where
    Ctrl-D and Ctrl-C mean something else than to prompt_toolkit."""
    child.expect_exact(">>>")


# -- scripts/ and media the vision tests share (test_vision.py, test_serve_vision.py, test_images.py,
# test_projector.py, test_projector_memory.py) --------------------------------------------------------

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def load_script(name: str) -> ModuleType:
    """scripts/NAME.py as a module (its functions reused: projector_spec, write_projector, …)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def random_png(seed: int, size: tuple[int, int] = (40, 30)) -> bytes:
    """A PNG of seeded random pixels: the same seed, the same image (and the same sha256)."""
    from PIL import Image

    rng = random.Random(seed)
    image = Image.new("RGB", size)
    image.putdata([tuple(rng.randrange(256) for _ in range(3)) for _ in range(size[0] * size[1])])
    out = BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def wav(frames: int = 800) -> bytes:
    """A short mono WAV of silence: audio, which an image reader must refuse."""
    out = BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0\0" * frames)
    return out.getvalue()


def checked(rule: Any, text: str, finish_reason: str) -> str:
    """An answer held to its constraint as every door holds it (Constraint.problem): the text,
    trimmed; ConstraintError saying how it fails."""
    from runner.engine.text.constrain import ConstraintError

    problem = rule.problem(text, finish_reason)
    if problem is not None:
        raise ConstraintError(problem)
    return text.strip()
