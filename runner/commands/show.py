"""`runner show`: what a model is, from its GGUF header alone.

A model in a cache (or a local file) is read where it lies; any other is read on the Hub with a few
HTTP range requests for its header, so nothing is downloaded.
"""

from __future__ import annotations

import json
from collections import Counter
from math import prod
from pathlib import Path
from typing import Any, TextIO

from runner import projector as vision
from runner import ui
from runner.errors import RunnerError, UsageError
from runner.gguf import GGUFHeader
from runner.hub.catalog import load_catalog
from runner.hub.headers import read_model
from runner.hub.quants import quant_of
from runner.hub.refs import resolve
from runner.memory.projector import ProjectorMemory

TEMPLATE_KEY = "tokenizer.chat_template"


def show_model(
    model: str,
    *,
    out: TextIO,
    template: bool = False,
    as_json: bool = False,
    offline: bool = False,
    mmproj: str | None = None,
):
    """MODEL's summary (or, with template, its chat template alone) on out; with its vision projector
    (`mmproj`, a file or a Hub reference, else the one pulled with it or its repo offers), what that
    does (checked against the model) and holds. Nothing is downloaded."""
    if template and as_json:
        raise UsageError("--template prints the template alone and --json includes it: choose one")
    ref = resolve(model, load_catalog())
    read = read_model(ref, offline=offline)
    summary = summarize(read.merged, display=ref.display, file=read.source, size=read.size)
    summary["expected_bytes"] = sum(h.expected_file_size for h in read.headers)
    summary["complete"] = summary["size_bytes"] >= summary["expected_bytes"]
    if not summary["complete"]:  # `run` refuses it (runner.loader): said here too, not only described
        ui.warn(_cut_short(summary))
    projector = vision.find(mmproj, ref, paired=True, offline=offline, download=False)  # or pulled with it
    try:
        summary["vision"] = (
            _vision(vision.memory(projector, read.merged), projector, read.merged) if projector else None
        )
    except RunnerError as exc:  # the projector pulled with it, not for this model: said, shown without
        if mmproj is not None:
            raise
        ui.warn(f"{ref.display} takes no images or audio in runner: {exc}")
    if template:
        text = summary["chat_template"]
        if text is None:
            raise UsageError(f"{ref.display} has no chat template in its GGUF metadata")
        out.write(text if text.endswith("\n") else text + "\n")
    elif as_json:
        out.write(json.dumps(summary, indent=2) + "\n")
    else:
        lines = _lines(summary, model)
        width = max(len(label) for label, _ in lines) + 2
        out.writelines(f"{label:<{width}}{value}\n" for label, value in lines)


def summarize(header: GGUFHeader, *, display: str, file: str, size: int) -> dict[str, Any]:
    """What `show --json` prints, from one header for the whole model (every shard's tensors)."""
    heads = header.arch_get("attention.head_count")
    template = header.get(TEMPLATE_KEY)
    return {
        "model": display,
        "file": file,
        "name": header.get("general.name"),
        "architecture": header.architecture,
        "parameters": sum(prod(t.shape) for t in header.tensors),
        "quant": quant_of(Path(file).name) or _dominant_type(header),
        "context_length": header.arch_get("context_length"),
        "layers": header.arch_get("block_count"),
        "heads": heads,
        "kv_heads": header.arch_get("attention.head_count_kv", heads),
        "embedding_length": header.arch_get("embedding_length"),
        "vocab_size": header.vocab_size,
        "license": header.get("general.license"),
        "size_bytes": size,
        "chat_template": template if isinstance(template, str) else None,
        "vision": None,  # with a projector: its type, image tokens, memory (_vision)
    }


def _vision(projector: ProjectorMemory, path: str, header: GGUFHeader) -> dict[str, Any]:
    minute_kv = 0
    if projector.minute_tokens:  # the KV cache a minute's tokens add, f16: what 4,096 more cells take
        from runner.memory.kv import kv_cache_bytes  # (a sliding window's or a recurrent state's: nothing)

        more = kv_cache_bytes(header, n_ctx=8192) - kv_cache_bytes(header, n_ctx=4096)
        minute_kv = more * projector.minute_tokens // 4096
    return {
        "projector": path,
        "type": projector.projector_type,
        "image_tokens": projector.image_tokens,  # an image of image_size (idefics3: a tile of it)
        "image_size": projector.image_size,  # the Qwen ones: the largest image, sized as it comes
        "tiles": projector.tiles,  # idefics3: the most tiles an image is cut into, besides the whole
        "sized": projector.sized,
        "most_image_tokens": projector.most_tokens,  # the most one image takes
        "audio_tokens": projector.audio_tokens,  # an audio encoder's: what 30 s of audio cost (0: none)
        "audio_minute_tokens": projector.minute_tokens,  # and a minute
        "audio_minute_kv_bytes": minute_kv,  # the KV cache (f16) those tokens take
        "weights_bytes": projector.weights_bytes,
        "compute_bytes": projector.compute_bytes,
    }


def _dominant_type(header: GGUFHeader) -> str | None:
    """The ggml type holding most of the weights (matrices only: norms and biases stay F32)."""
    weights: Counter[str] = Counter()
    for t in header.tensors:
        if len(t.shape) >= 2:
            weights[t.type_name] += prod(t.shape)
    return weights.most_common(1)[0][0] if weights else None


def _lines(s: dict[str, Any], model: str) -> list[tuple[str, str]]:
    template = f"yes (runner show {model} --template prints it)" if s["chat_template"] else "none"
    context = s["context_length"]
    return [
        ("model", s["model"]),
        *([("name", s["name"])] if s["name"] else []),
        ("architecture", s["architecture"] or "?"),
        ("parameters", _human_count(s["parameters"])),
        ("quant", s["quant"] or "?"),
        ("context", f"{context} tokens (trained)" if context else "?"),
        ("layers", _per_layer(s["layers"])),
        ("heads", _per_layer(s["heads"])),
        ("KV heads", _per_layer(s["kv_heads"])),
        ("embedding", _per_layer(s["embedding_length"])),
        ("vocabulary", f"{s['vocab_size']} tokens" if s["vocab_size"] else "?"),
        ("license", s["license"] or "not stated"),
        ("size", _size(s)),
        ("chat template", template),
        *(
            [("audio" if s["vision"]["image_size"] == 0 else "vision", _vision_line(s["vision"]))]
            if s["vision"]
            else []
        ),
        *(
            [("audio", "yes (the same projector's audio encoder)")]
            if s["vision"] and s["vision"]["image_size"] and s["vision"]["audio_minute_tokens"]
            else []
        ),
        ("file", s["file"]),
    ]


def _cut_short(s: dict[str, Any]) -> str:
    have, expected = ui.human_bytes(s["size_bytes"]), ui.human_bytes(s["expected_bytes"])
    return (
        f"{s['file']} is truncated: {have} of the {expected} its header describes "
        "(runner run refuses it until it is whole: fetch or copy it again)"
    )


def _size(s: dict[str, Any]) -> str:
    size = ui.human_bytes(s["size_bytes"])
    return (
        size
        if s["complete"]
        else f"{size} (truncated: its header describes {ui.human_bytes(s['expected_bytes'])})"
    )


def _vision_line(v: dict[str, Any]) -> str:
    from runner.memory.projector import costs

    cost = costs(v["image_tokens"], v["image_size"], v["tiles"], v["sized"], v["audio_minute_tokens"])
    if v["audio_minute_kv_bytes"]:
        cost += f" ({ui.human_bytes(v['audio_minute_kv_bytes'])} of f16 KV cache)"
    return (
        f"yes (projector {v['type']}, {cost}; {ui.human_bytes(v['weights_bytes'])} of weights, "
        f"a {ui.human_bytes(v['compute_bytes'])} encoder compute buffer)"
    )


def _per_layer(value: Any) -> str:
    """A count, or the range of a per-layer array ('0-8 per layer')."""
    if isinstance(value, list) and value:
        low, high = min(value), max(value)
        return str(low) if low == high else f"{low}-{high} per layer"
    return "?" if value is None else str(value)


def _human_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)
