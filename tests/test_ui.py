"""ui's formatting: sizes as people read them, and a Markdown answer streamed to a terminal."""

from __future__ import annotations

import io

import pytest

from runner.ui import WordWrap, human_bytes, markdown_stream
from tests.term import Terminal, rendered_markdown

pytestmark = pytest.mark.fast


def test_sizes_use_decimal_units_up_to_terabytes() -> None:
    assert human_bytes(5) == "5 B"
    assert human_bytes(98_362_432) == "98.4 MB"
    assert human_bytes(713 * 10**9) == "713.0 GB"
    assert human_bytes(2_304_000 * 10**9) == "2304.0 TB"  # a fit at an absurd context: not 2304000.0 GB


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("redraw_every", [2, 7])
def test_a_markdown_answer_taller_than_the_screen_leaves_each_line_once(
    monkeypatch: pytest.MonkeyPatch, redraw_every: int
) -> None:
    """A live region taller than the screen cannot be redrawn: what left the screen is printed once."""
    monkeypatch.setenv("COLUMNS", "40")
    monkeypatch.setenv("LINES", "10")
    monkeypatch.setattr("runner.ui.REDRAWS_PER_S", 1e9)  # draw at every update: the worst case
    answer = "# Fruits\n\nA list, then a word on each.\n\n" + "".join(f"- fruit {i}\n" for i in range(30))
    answer += "\nEach of them is " + "sweet and " * 20 + "good.\n"
    out = FakeTerminal()
    with markdown_stream(out) as update:
        for end in range(redraw_every, len(answer) + redraw_every, redraw_every):
            update(answer[:end])
    terminal = Terminal(10, 40)
    terminal.feed(out.getvalue())
    assert terminal.lines() == rendered_markdown(answer, 40)


def test_words_streamed_to_a_terminal_wrap_whole() -> None:
    out = io.StringIO()
    wrap = WordWrap(out, 10)
    for chunk in ["The to", "pics", " are", " here,\n", "see http://example.com/a/b/c", " ok"]:
        wrap.write(chunk)
    wrap.write("\n")
    assert out.getvalue() == "The topics\nare here,\nsee\nhttp://example.com/a/b/c ok\n"  # "to|pics" once
    terminal = Terminal(6, 10)
    terminal.feed(out.getvalue())
    assert terminal.lines() == ["The topics", "are here,", "see", "http://exa", "mple.com/a", "/b/c ok"]
