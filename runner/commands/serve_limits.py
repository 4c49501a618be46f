"""`runner serve`'s bounds, checked before anything loads: images a request may carry and the body
that holds them, the prompt states a model keeps in RAM, the memory the served models share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner import loader
from runner.errors import ModelNotFound, UsageError
from runner.hub.catalog import load_catalog
from runner.hub.refs import resolve
from runner.limits import check_range, parse_size
from runner.memory.plan import budgets

if TYPE_CHECKING:
    from runner.commands.serve import ServeRequest
    from runner.serve.pool import Pool

DEFAULT_CACHE_RAM = 1 << 30
MAX_IMAGES_LIMIT = 64  # --max-images at most: each image is its positions in a sequence's context
DATA_URL_HEAD = 64  # "data:image/png;base64," and the JSON around an image, with room to spare


def image_limits(request: ServeRequest) -> tuple[int, int]:
    """(images a request may carry, an image's bytes at most) for the models that take images: the one
    MODEL --mmproj goes with, and those pulled with a projector (runner.hub.projectors)."""
    from runner.images import MAX_IMAGE_BYTES, MAX_IMAGES

    if request.settings.mmproj is not None and len(request.models) != 1:
        raise UsageError(
            "--mmproj is one model's projector: name that model alone (runner serve MODEL --mmproj FILE)"
        )
    if request.settings.mmproj is not None:
        try:  # a path that is not there, now; a Hub reference is fetched with the model
            resolve(request.settings.mmproj, load_catalog())
        except ModelNotFound:
            raise UsageError(
                f"--mmproj {request.settings.mmproj}: no such file, and not a Hub reference"
            ) from None
    images = MAX_IMAGES if request.max_images is None else request.max_images
    check_range(images, "--max-images", 1, MAX_IMAGES_LIMIT)
    size = request.max_image_bytes
    max_bytes = MAX_IMAGE_BYTES if size is None else parse_size(size, "--max-image-bytes")
    if max_bytes < 1:
        raise UsageError("--max-image-bytes must be more than 0")
    return images, max_bytes


def max_body(images: int, image_bytes: int) -> int:
    """A request's body at most: runner.serve.app's, and room for its images as base64 data URLs."""
    from runner.serve.app import MAX_BODY

    return MAX_BODY + images * (4 * -(-image_bytes // 3) + DATA_URL_HEAD)


def cache_ram_limit(given: str | None) -> int:
    """The bytes of prompt states a model keeps (runner.engine.prefix.StateCache: the RAM tier of the
    prefix store of runner.engine.loop's Loop, which runner.serve.engine_backend's ModelThread drives):
    --cache-ram, else DEFAULT_CACHE_RAM or an eighth of the host memory free now (after the model's
    load), the less. llama-server keeps up to 8 GiB by default; runner's plan promised the rest of the
    memory to the models, so its default is smaller. The states are allocated as prompts are set aside."""
    if given is not None:
        return parse_size(given, "--cache-ram")
    import psutil

    return min(DEFAULT_CACHE_RAM, psutil.virtual_memory().available // 8)


def within_memory(
    request: ServeRequest, memory: int | None, name: str, needs: dict[str, int], pool: Pool
) -> None:
    """A named model whose plan, with those loaded before it, is more than --memory: refused in one line
    (the models on demand are held to it as they load)."""
    if memory is None:
        return
    before = sum(m.needs.get("cpu", 0) for m in pool.loaded.values())
    if before + needs.get("cpu", 0) > memory:
        beside = f" beside the {_mb(before)} loaded before it" if before else ""
        raise UsageError(
            f"{name} needs {_mb(needs.get('cpu', 0))} of host memory (weights, KV cache, compute buffers, as "
            f"runner fit plans them){beside}; --memory {request.memory} allows {_mb(memory)}: give more, "
            "or fewer --parallel sequences or a smaller --ctx"
        )


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def memory_budget(memory: int | None) -> dict[str, int]:
    """What the served models may use together: this machine's as the plan sees it at the start
    (or --memory of host memory)."""
    have = budgets(loader.machine())
    if memory is not None:
        have["cpu"] = memory
    return have
