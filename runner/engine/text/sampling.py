"""Sampling settings: one validated dataclass, its defaults, and the GGUF keys that override them.

Defaults are llama.cpp's own (common/common.h of the pinned engine) unless the model's GGUF carries
``general.sampling.*`` keys, which its authors set for it; a flag on the command line wins over both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runner.errors import InvalidSetting
from runner.limits import check_range

# llama.cpp's defaults (common_params_sampling), the one place they live in runner.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MIN_P = 0.05
DEFAULT_REPEAT_PENALTY = 1.0
DEFAULT_REPEAT_LAST_N = 64
DEFAULT_PRESENCE_PENALTY = 0.0
DEFAULT_FREQUENCY_PENALTY = 0.0

# GGUF metadata key -> SamplingConfig field (llama-model.cpp, LLAMA_MODEL_META_KEY_SAMPLING_*).
GGUF_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repeat_penalty",
    "general.sampling.penalty_last_n": "repeat_last_n",
}

SEED_MAX = 2**32 - 2  # 0xFFFFFFFF is llama.cpp's "random seed" marker


def _bounded(default: Any, flag: str, lo: float | None, hi: float | None, lo_open: bool = False) -> Any:
    """A field with its allowed range; lo_open excludes lo itself."""
    return field(default=default, metadata={"flag": flag, "lo": lo, "hi": hi, "lo_open": lo_open})


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen. temperature 0 means greedy (top_k/top_p/min_p unused)."""

    temperature: float = _bounded(DEFAULT_TEMPERATURE, "--temperature", 0, 2)
    top_k: int = _bounded(DEFAULT_TOP_K, "--top-k", 0, None)
    top_p: float = _bounded(DEFAULT_TOP_P, "--top-p", 0, 1, lo_open=True)
    min_p: float = _bounded(DEFAULT_MIN_P, "--min-p", 0, 1)
    repeat_penalty: float = _bounded(DEFAULT_REPEAT_PENALTY, "--repeat-penalty", 0, 10, lo_open=True)
    repeat_last_n: int = _bounded(DEFAULT_REPEAT_LAST_N, "--repeat-last-n", 0, None)
    presence_penalty: float = _bounded(DEFAULT_PRESENCE_PENALTY, "--presence-penalty", -2, 2)
    frequency_penalty: float = _bounded(DEFAULT_FREQUENCY_PENALTY, "--frequency-penalty", -2, 2)
    seed: int | None = _bounded(None, "--seed", 0, SEED_MAX)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            check_range(value, **f.metadata, field=f.name)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def penalties(self) -> bool:
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0 or self.frequency_penalty != 0
        )

    def describe(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))


def model_defaults(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling settings a model's GGUF asks for, as SamplingConfig keyword arguments.

    Values out of range are ignored (a model file is untrusted input), so a bad key never stops a run.
    """
    fields = {f.name: f for f in dataclasses.fields(SamplingConfig)}
    found: dict[str, Any] = {}
    for key, name in GGUF_SAMPLING_KEYS.items():
        value = metadata.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        value = int(value) if fields[name].type == "int" else float(value)
        try:
            check_range(value, **fields[name].metadata)
        except InvalidSetting:
            continue
        found[name] = value
    return found


def catalog_defaults(values: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A catalog entry's recommended sampling, checked: an unknown name or a value out of range is the
    catalog's error (a models.toml the user can fix), said with where it came from."""
    fields = {f.name: f for f in dataclasses.fields(SamplingConfig)}
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name not in fields or name == "seed":
            known = ", ".join(n for n in fields if n != "seed")
            raise InvalidSetting(f"{where}: unknown sampling setting {name!r} (known: {known})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidSetting(f"{where}: sampling {name} must be a number (got {value!r})")
        check_range(value, **{**fields[name].metadata, "flag": f"{where}: sampling {name}"})
        out[name] = int(value) if fields[name].type == "int" else float(value)
    return out


SOURCES = ("flag", "gguf", "catalog", "default")  # what set a value, strongest first


def resolve_sources(
    metadata: Mapping[str, Any],
    overrides: Mapping[str, Any],
    *,
    catalog: Mapping[str, Any] | None = None,
) -> tuple[SamplingConfig, dict[str, str]]:
    """The settings and where each came from: flags (and /set) over the GGUF's own keys, over the
    catalog's recommendation, over llama.cpp's defaults."""
    layers = (
        ("flag", {k: v for k, v in overrides.items() if v is not None}),
        ("gguf", model_defaults(metadata)),
        ("catalog", dict(catalog or {})),
    )
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f in dataclasses.fields(SamplingConfig):
        for source, layer in layers:
            if f.name in layer:
                values[f.name], sources[f.name] = layer[f.name], source
                break
        else:
            sources[f.name] = "default"
    return SamplingConfig(**values), sources


def resolve(metadata: Mapping[str, Any], overrides: Mapping[str, Any]) -> SamplingConfig:
    """Defaults < the model's GGUF keys < the user's flags (None means 'not given')."""
    return resolve_sources(metadata, overrides)[0]
