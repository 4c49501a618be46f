"""How a model is loaded, in one frozen object from the flags to llama.cpp (as vLLM's `EngineArgs`):
each command's request holds a `LoadSettings`, and `runner.loader.open_model`, `plan_for` and
`choose_plan` take it, instead of a dozen keywords through six signatures.

Its values are checked as they are made: `from_flags` takes --flash-attn and --spec as typed and
refuses a bad one (InvalidSetting) before anything loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.limits import flash_attn_setting, spec_setting


@dataclass(frozen=True)
class LoadSettings:
    ctx: int | None = None  # a sequence's context (--ctx); None: the plan's
    threads: int | None = None  # decode threads (--threads); None: the machine's choice
    gpu_layers: int | None = None  # layers offloaded (--gpu-layers); None: the plan's
    kv_type: str | None = None  # the KV cache's type (--kv-type); None: the plan's (f16)
    flash_attn: bool | None = None  # --flash-attn on/off; None: the plan's (llama.cpp's "auto")
    parallel: int = 1  # sequences in one context (a batch, a server)
    most_parallel: bool = False  # `parallel` is the most: fewer where the plan fits no more (serve)
    growing: bool = False  # one sequence whose context grows as it fills (a chat)
    spec: str = "none"  # speculative decoding: "ngram", "draft" (with `draft`), "none"
    draft: str | None = None  # --draft MODEL: speculation with a draft model
    mmproj: str | None = None  # a vision projector, a file or a Hub reference (--mmproj)
    force: bool = False  # load what the plan says will not fit
    offline: bool = False  # cached models only
    debug: bool = False  # llama.cpp's own log on stderr
    # what the model is loaded for
    chat_template: bool = True  # its template will be rendered: compiled beside the load (not --raw)
    output_rows: int = 0  # the most rows of logits one decode asks for (the output buffer is that large)
    vision: bool = False  # take the projector pulled with the model, where there is one
    images: bool = False  # the prompt has images: a projector is needed
    generates: bool = True  # False: a reranker or an encoder is welcome (it is refused otherwise)

    @classmethod
    def from_flags(
        cls, flash_attn: str | None = None, spec: str | None = None, **fields: object
    ) -> LoadSettings:
        """From the flags as typed: --flash-attn auto|on|off and --spec (with --draft) checked here,
        the rest as given (LoadSettings' fields)."""
        draft = fields.get("draft")
        checked_spec = spec_setting(spec, draft if isinstance(draft, str) else None)
        return cls(flash_attn=flash_attn_setting(flash_attn), spec=checked_spec, **fields)  # type: ignore[arg-type]


DEFAULTS = LoadSettings()  # a plain load: the plan's choices, one sequence, no drafting, text only
