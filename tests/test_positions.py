"""Positions apart from cells (runner.engine.positions), in-process: an M-RoPE image of 16 cells that
takes 4 positions moves every position after it back by 12, and the position llama.cpp reports as a
sequence's last is the image's first when the image ends it. The same through a real engine on an
M-RoPE model: tests/test_vision_mrope.py."""

from __future__ import annotations

import hashlib

import pytest

from runner.engine.positions import KEPT, Positions, image_index, image_tokens, outside_image

pytestmark = pytest.mark.fast

A = "ab" * 32
B = "cd" * 32


def test_a_model_without_m_rope_positions_are_cells() -> None:
    positions = Positions()
    image = image_tokens(A, 4)
    positions.learn(image[0], 4, 4, mrope=False)  # a normal image: a position a cell, nothing recorded
    tokens = [1, 2, *image, 3]
    assert not positions.fewer
    assert [positions.at(tokens, n) for n in (0, 2, 6, 7)] == [0, 2, 6, 7]
    assert positions.last(tokens) == 6
    assert positions.last(tokens[:6]) == 5  # an image's cells at consecutive positions
    assert positions.last([]) == -1


def test_an_m_rope_image_takes_fewer_positions_than_cells() -> None:
    positions = Positions()
    a, b = image_tokens(A, 16), image_tokens(B, 6)
    positions.learn(a[0], 16, 4, mrope=True)  # 4 x 4 tokens: max(nx, ny) = 4 positions
    positions.learn(b[0], 6, 3, mrope=True)  # 3 x 2
    tokens = [1, 2, *a, 3, 4, *b, 5]
    assert positions.at(tokens, 2) == 2  # before the image
    assert positions.at(tokens, 18) == 2 + 4  # after it: its 4 positions, not its 16 cells
    assert positions.at(tokens, 20) == 8
    assert positions.at(tokens, len(tokens)) == 8 + 3 + 1
    assert positions.last(tokens) == 11
    assert positions.last(tokens[:18]) == 2  # the cells of an M-RoPE image all sit at its first position
    assert positions.last(tokens[:26]) == 8
    # the same image again counts again
    twice = [*a, *a]
    assert positions.at(twice, 32) == 8 and positions.last(twice) == 4


def test_a_one_row_m_rope_image_still_sits_at_its_first_position() -> None:
    """36 x 1 tokens take 36 positions, as many as cells, but libmtmd puts every cell at the image's
    first temporal position: a sequence ending on it ends there."""
    positions = Positions()
    row = image_tokens(A, 36)
    positions.learn(row[0], 36, 36, mrope=True)
    tokens = [1, 2, *row]
    assert positions.at(tokens, len(tokens)) == 38 and positions.last(tokens) == 2
    assert positions.last([*tokens, 3]) == 38


def test_past_kept_images_those_no_sequence_holds_are_forgotten() -> None:
    positions = Positions()
    held = image_tokens(A, 16)
    for i in range(KEPT + 1):
        first = held[0] if i == 0 else image_tokens(hashlib.sha256(b"%d" % i).hexdigest(), 16)[0]
        positions.learn(first, 16, 4, mrope=True)
    positions.prune([[5, *held, 6], [7]])
    assert positions.fewer == {held[0]: 12}


def test_a_kept_head_never_ends_inside_an_image() -> None:
    image = image_tokens(A, 16)
    tokens = [7, 8, *image, 9]
    assert [image_index(t) for t in image] == list(range(16))
    assert [outside_image(tokens, n) for n in (10, 2, 18)] == [2, 2, 18]
