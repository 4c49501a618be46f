"""runner's exceptions, and the one table that maps them to exit codes.

The library raises these; only the CLI turns them into one line on stderr and an exit code.
"""

from __future__ import annotations


class RunnerError(Exception):
    """Base of every error runner reports to a user."""


class UsageError(RunnerError):
    """Bad usage or bad input: the user can fix it by changing the command."""


class InvalidSetting(UsageError):
    """A flag or setting out of its allowed range. The message is the command line's (naming the
    flag); `field` names the setting itself (a SamplingConfig field, "schema", "grammar") and `problem`
    says what is wrong without naming it, so another edge (an HTTP API) words it with its own name."""

    def __init__(self, message: str, *, field: str | None = None, problem: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.problem = problem if problem is not None else message


class CatalogError(UsageError):
    """A models.toml that runner cannot read."""


class ModelNotFound(UsageError):
    """MODEL names no file, alias or repository that runner can find."""


class InvalidModelFile(UsageError):
    """A file that is not GGUF, or a GGUF that is truncated or corrupt."""


class PromptTooLong(UsageError):
    """The prompt does not fit the context window (never truncated silently): its tokens and the
    context it had to fit (0 where not said)."""

    def __init__(self, message: str, *, tokens: int = 0, context: int = 0) -> None:
        super().__init__(message)
        self.tokens = tokens
        self.context = context


class CannotGenerate(UsageError):
    """A model asked to generate text that cannot: a reranker, or an encoder that llama.cpp keeps no
    KV cache for (runner.memory.arch.cannot_generate says why). `model` names it."""

    def __init__(self, model: str, why: str) -> None:
        super().__init__(f"{model} {why}")
        self.model = model


class NoInfill(UsageError):
    """A model asked to fill in the middle whose GGUF declares no FIM tokens (prefix, suffix, middle):
    never given a made-up format. `model` names it."""

    def __init__(self, model: str, missing: list[str]) -> None:
        super().__init__(
            f"{model} cannot fill in the middle: its GGUF has no FIM {', '.join(missing)} "
            f"token{'s' if len(missing) > 1 else ''} (tokenizer.ggml.fim_*_token_id); "
            "use a code model with them"
        )
        self.model = model


class AccessDenied(UsageError):
    """The Hub wants a token (a gated or private repo) or refused the one given: the user's to fix."""


class ImageError(UsageError):
    """An image runner will not read: not PNG, JPEG, WebP, GIF or BMP, too large, a decompression
    bomb, truncated or corrupt, or a URL to fetch. The message names where it came from; `name` is
    that (a path, "-" for stdin, an API field) and `problem` says what is wrong without naming it."""

    def __init__(self, message: str, *, name: str, problem: str) -> None:
        super().__init__(message)
        self.name = name
        self.problem = problem


class AudioError(UsageError):
    """Audio runner will not read: not WAV, MP3, FLAC or Ogg Vorbis (Opus, AAC, images and the rest are
    named and refused), too long or too large, truncated, empty, or not finite. The message names where
    it came from (`name`, as ImageError's); `problem` says what is wrong without naming it."""

    def __init__(self, message: str, *, name: str, problem: str) -> None:
        super().__init__(message)
        self.name = name
        self.problem = problem


class WontFit(RunnerError):
    """The model would not fit this machine's memory at the context asked for."""


class DownloadError(RunnerError):
    """A model could not be fetched from any source."""


class IntegrityError(DownloadError):
    """A downloaded file's size or hash does not match what its source declares."""


class EngineError(RunnerError):
    """llama.cpp failed to load a model or to evaluate tokens."""


class WorkerError(RunnerError):
    """A worker (`runner worker`, a ggml-rpc server) could not be reached, spoke another protocol,
    or went away."""


# Ordered: the first matching class wins, so subclasses come before their bases.
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (UsageError, 2),
    (RunnerError, 1),
)


def exit_code_for(exc: BaseException) -> int:
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return 1
