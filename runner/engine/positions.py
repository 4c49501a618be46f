"""Where each KV cell of a sequence sits: its position, apart from its index among the cells.

A sequence's cells (Context.cells) hold one token each, an image's cells one pseudo-token each
(image_tokens: negative, derived from the image's sha256, so prefix reuse compares images by their
hash). For most models a cell's position is its index. M-RoPE models (Qwen2-VL, Qwen2.5-VL) are not:
libmtmd decodes an image of nx x ny tokens at one temporal position with (x, y) beside it, and the
text after it goes on max(nx, ny) positions later (mtmd_image_tokens_get_n_pos), so each such image
takes fewer positions than cells. llama-server counts the same way (server_tokens::pos_next: the
cells plus each image's n_pos less its n_tokens).

Positions records, per image, how many positions fewer than cells it takes (nothing for the images
of every other model), once the image has been evaluated: the same image, the same projector, the
same count. Everything a position is asked of (the batch, llama_memory_seq_rm, the position a state
must end on) asks here; the context's capacity is counted in cells, as llama.cpp allocates it.
"""

from __future__ import annotations

from collections.abc import Sequence

IMAGE_SLOT = 1 << 16  # the most positions one image may take: its pseudo-tokens' index part


def image_tokens(sha256: str, n: int) -> list[int]:
    """An image's cells in a prompt's tokens (runner.engine.vision): negative, never a vocabulary id,
    the same for the same image (its sha256), so a prefix compares images as it compares tokens."""
    key = int(sha256[:10] or "0", 16) if all(c in "0123456789abcdef" for c in sha256[:10]) else 0
    return [-(1 + key * IMAGE_SLOT + i) for i in range(n)]


def image_index(token: int) -> int:
    """Which of its image's cells a pseudo-token is (0 for the first)."""
    return (-token - 1) % IMAGE_SLOT


def outside_image(tokens: Sequence[int], n: int) -> int:
    """n, or the start of the image whose cells it falls inside: a kept head never splits one."""
    if 0 < n < len(tokens) and tokens[n] < 0:
        n -= image_index(tokens[n])
    return n


KEPT = 4096  # M-RoPE images remembered before those no sequence holds are let go


class Positions:
    """The positions an engine's M-RoPE images save: n_tokens - n_pos, by the image's first cell
    (0 for a one-row image: its cells still all sit at its first position)."""

    def __init__(self) -> None:
        self.fewer: dict[int, int] = {}

    def learn(self, first: int, n_tokens: int, n_pos: int, *, mrope: bool) -> None:
        """An image (its first pseudo-token) of n_tokens cells took n_pos positions; only M-RoPE
        images are recorded (every other model's take a position a cell)."""
        if mrope:
            self.fewer[first] = n_tokens - n_pos

    def prune(self, held: Sequence[Sequence[int]]) -> None:
        """Past KEPT images (a server's), those no sequence holds are forgotten: a state restored
        with one then fails its position check and is evaluated again, never trusted."""
        if len(self.fewer) > KEPT:
            kept = {t for tokens in held for t in tokens if t in self.fewer}
            self.fewer = {t: n for t, n in self.fewer.items() if t in kept}

    def at(self, tokens: Sequence[int], n: int) -> int:
        """The position of cell n of a sequence holding `tokens` (n outside an image; n == len(tokens):
        the next position). Every image before n counted whole."""
        if not self.fewer:
            return n
        fewer = self.fewer
        return n - sum(fewer.get(t, 0) for t in tokens[:n] if t < 0)

    def last(self, tokens: Sequence[int]) -> int:
        """The position llama_memory_seq_pos_max reports for cells holding `tokens` (-1: none): the
        last cell's, where an M-RoPE image's cells all sit at its first position."""
        n = len(tokens)
        if n == 0:
            return -1
        token = tokens[-1]
        if token >= 0 or not self.fewer:
            return self.at(tokens, n - 1)
        start = n - 1 - image_index(token)
        pos = self.at(tokens, start)
        return pos if tokens[start] in self.fewer else pos + n - 1 - start
