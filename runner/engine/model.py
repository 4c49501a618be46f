"""A loaded model: its weights (where the plan put them), its vocabulary, and the sampler chains and
llguidance matchers made over that vocabulary. Contexts (runner.engine.context) are made over a Model;
an Engine (runner.engine.engine) holds one of each.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runner import interrupt
from runner.engine import preload
from runner.engine.llamacpp import ANYWHERE, LLAMA_LOG, Placement, llama, model_params
from runner.engine.text.fim import FIM_KEYS, FimTokens
from runner.engine.text.sampling import SamplingConfig
from runner.errors import EngineError, InvalidModelFile, InvalidSetting

if TYPE_CHECKING:
    from runner.engine.guide import Guide, Guides


class Model:
    """A GGUF's weights loaded into llama.cpp, and what its vocabulary says of tokens."""

    def __init__(
        self, path: str | os.PathLike[str], placement: Placement = ANYWHERE, *, vocab_only: bool = False
    ) -> None:
        """Load the weights (EngineError, or InvalidModelFile where the file is at fault). A Ctrl-C
        stops the load (llama.cpp's progress callback) and returns with no model: the caller's
        interrupt.deferred() raises as its block ends. vocab_only: the vocabulary alone, no weights
        (tokens counted, no context made over it)."""
        self.path = Path(path)
        self.placement = placement
        self.n_gpu_layers = placement.gpu_layers()
        self.handle: Any = None  # the llama_model
        self._guides: Guides | None = None  # llguidance's, on the first schema
        self._piece = ctypes.create_string_buffer(256)
        lib = llama()
        mparams, self._no_devices = model_params(lib, self.n_gpu_layers, placement.use_gpu)
        mparams.vocab_only = vocab_only
        name = os.fsencode(self.path)
        self.handle = None if vocab_only else preload.take(self.path, mparams)  # loaded ahead
        if not self.handle:
            with LLAMA_LOG.muted() as muted:  # the load's ~1,200 log lines, without taking the GIL
                self.handle = lib.llama_model_load_from_file(name, mparams)
            if not self.handle and muted and not interrupt.requested():
                self.handle = lib.llama_model_load_from_file(name, mparams)  # again, for llama.cpp's reason
            if self.handle:
                preload.loaded(self.path, mparams)
        if not self.handle:
            if interrupt.requested():  # the progress callback stopped it
                return
            reason = LLAMA_LOG.model_error()
            if reason is not None:  # the file's fault: bad input, not a failure of runner
                raise InvalidModelFile(f"llama.cpp cannot load {self.path}: {reason}")
            raise EngineError(f"llama.cpp could not load {self.path}: {LLAMA_LOG.last_error()}")
        self.vocab = lib.llama_model_get_vocab(self.handle)
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(self.handle))
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))

    @property
    def loaded(self) -> bool:
        return bool(self.handle)

    @property
    def drops_suffix(self) -> bool:
        """Whether its memory can drop the tail of a sequence (not a recurrent or hybrid model's)."""
        lib = llama()
        return not (lib.llama_model_is_recurrent(self.handle) or lib.llama_model_is_hybrid(self.handle))

    @property
    def plain_kv(self) -> bool:
        """Whether its memory is one plain KV cache (no sliding window, not recurrent or hybrid)."""
        return self.drops_suffix and llama().llama_model_n_swa(self.handle) <= 0

    # -- tokens ---------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        lib = llama()
        if lib.llama_vocab_type(self.vocab) == lib.LLAMA_VOCAB_TYPE_NONE:  # llama.cpp would abort
            raise InvalidModelFile(
                f"{self.path} has no tokenizer (tokenizer.ggml.model 'none'): it cannot read text"
            )
        data = text.encode("utf-8")
        capacity = len(data) + 8
        tokens = (lib.llama_token * capacity)()
        n = lib.llama_tokenize(self.vocab, data, len(data), tokens, capacity, add_special, parse_special)
        if n < 0:  # never happens with one token per byte plus specials, but the API allows it
            capacity = -n
            tokens = (lib.llama_token * capacity)()
            n = lib.llama_tokenize(self.vocab, data, len(data), tokens, capacity, add_special, parse_special)
        return list(tokens[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        lib = llama()
        n = lib.llama_token_to_piece(self.vocab, token, self._piece, len(self._piece), 0, special)
        if n < 0:
            self._piece = ctypes.create_string_buffer(-n)
            n = lib.llama_token_to_piece(self.vocab, token, self._piece, len(self._piece), 0, special)
        return self._piece.raw[:n]

    def token_text(self, token: int) -> str:
        """The vocabulary's own text for a token, special ones included (e.g. '<|im_start|>')."""
        return bytes(llama().llama_vocab_get_text(self.vocab, token) or b"").decode("utf-8", "replace")

    def is_end(self, token: int) -> bool:
        """Whether the token ends generation (the model's end-of-generation tokens)."""
        return bool(llama().llama_vocab_is_eog(self.vocab, token))

    @property
    def bos(self) -> int:
        """The beginning-of-sequence token (-1: none)."""
        return int(llama().llama_vocab_bos(self.vocab))

    def fim_tokens(self) -> FimTokens:
        """Its fill-in-the-middle tokens, from the GGUF's tokenizer.ggml.fim_*_token_id (-1: none)."""
        lib, v = llama(), self.vocab
        return FimTokens(
            *(int(getattr(lib, f"llama_vocab_{key}")(v)) for key in FIM_KEYS)  # pre, suf, mid, pad, rep, sep
        )

    @property
    def bos_text(self) -> str:
        return self.token_text(self.bos) if self.bos >= 0 else ""

    @property
    def eos_text(self) -> str:
        eos = llama().llama_vocab_eos(self.vocab)
        return self.token_text(eos) if eos >= 0 else ""

    @property
    def adds_bos(self) -> bool:
        return bool(llama().llama_vocab_get_add_bos(self.vocab))

    # -- sampling --------------------------------------------------------------------------------

    def sampler(
        self, cfg: SamplingConfig, history: Sequence[int] = (), grammar: str | None = None, *, window: int
    ) -> Any:
        """The native sampler chain: a grammar first (when given), penalties (which have seen
        `history`, as llama-cli's do: its last repeat_last_n tokens, else the last `window`, the
        context's size), then greedy or top-k, top-p, min-p, temperature and a draw. The caller owns
        it: a Job takes it (the loop frees it), else llama_sampler_free. InvalidSetting (field
        "grammar") where llama.cpp cannot parse the grammar."""
        lib = llama()
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        add = lib.llama_sampler_chain_add
        if grammar is not None:
            constrain = lib.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
            if not constrain:
                lib.llama_sampler_free(chain)
                problem = f"llama.cpp cannot parse the grammar: {LLAMA_LOG.last_error() or 'no log'}"
                raise InvalidSetting(problem, field="grammar", problem=problem)
            add(chain, constrain)
        if cfg.penalties:
            last_n = cfg.repeat_last_n if cfg.repeat_last_n > 0 else window
            penalties = lib.llama_sampler_init_penalties(
                self.n_vocab, last_n, cfg.repeat_penalty, cfg.frequency_penalty, cfg.presence_penalty
            )
            # the penalties alone: a grammar must not see the prompt; an image's positions are no tokens
            for token in [t for t in history if t >= 0][-last_n:]:
                lib.llama_sampler_accept(penalties, token)
            add(chain, penalties)
        if cfg.greedy:
            add(chain, lib.llama_sampler_init_greedy())
            return chain
        if cfg.top_k > 0:
            add(chain, lib.llama_sampler_init_top_k(cfg.top_k))
        add(chain, lib.llama_sampler_init_top_p(cfg.top_p, 1))
        add(chain, lib.llama_sampler_init_min_p(cfg.min_p, 1))
        add(chain, lib.llama_sampler_init_temp(cfg.temperature))
        seed = lib.LLAMA_DEFAULT_SEED if cfg.seed is None else cfg.seed
        add(chain, lib.llama_sampler_init_dist(seed))
        return chain

    @staticmethod
    def argmax_only(cfg: SamplingConfig, grammar: str | None) -> bool:
        """Whether the chain sampler() builds for these is greedy alone (no grammar, no penalties):
        its pick is then the first of the logits' largest, which a caller may take itself."""
        return cfg.greedy and not cfg.penalties and grammar is None

    def check_grammar(self, grammar: str) -> None:
        """InvalidSetting where llama.cpp cannot parse the grammar; what the check built is freed."""
        llama().llama_sampler_free(self.sampler(SamplingConfig(temperature=0), (), grammar, window=0))

    def guide(self, grammar: str) -> Guide:
        """A fresh llguidance matcher for `grammar` (runner.engine.guide): the tokenizer it needs
        built from this model's vocabulary on first use, each grammar compiled once and kept."""
        if self._guides is None:
            from runner.engine.guide import Guides

            ends = [t for t in range(self.n_vocab) if self.is_end(t)]
            self._guides = Guides(self.vocab, self.n_vocab, ends)
        return self._guides.guide(grammar)

    def close(self) -> None:
        with interrupt.deferred():  # llama.cpp logs through a ctypes callback: no KeyboardInterrupt there
            if self.handle:
                llama().llama_model_free(self.handle)
                self.handle = None
