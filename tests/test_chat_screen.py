"""runner chat's answers as a terminal shows them (pexpect, and a small terminal for the scrollback):
a Markdown answer taller than the screen, and words wrapped whole while an answer streams."""

from __future__ import annotations

from collections import Counter

import pexpect

from tests.helpers import GREEDY, conversations, ready, spawn
from tests.term import Terminal, rendered_markdown


def answer_on_screen(child: pexpect.spawn, message: str, size: tuple[int, int]) -> list[str]:
    """Send a message; the lines its answer leaves on a terminal of this size, scrollback included.
    prompt_toolkit turns bracketed paste off when a line is entered and on when the next prompt comes:
    between the two is the answer, and nothing else."""
    ready(child)
    child.sendline(message)
    child.expect_exact("\x1b[?2004l")
    child.expect_exact("\x1b[?2004h", timeout=120)
    terminal = Terminal(*size)
    terminal.feed(child.before)
    return terminal.lines()


def test_a_markdown_answer_taller_than_the_screen_is_on_it_once() -> None:
    size = (8, 40)  # a paragraph of 160 tokens is taller than this screen too
    child = spawn("chat", "smollm2", "--markdown", "--max-tokens", "160", *GREEDY, size=size)
    shown = answer_on_screen(child, "Write a markdown document: a title, then a list of 20 fruits.", size)
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    [conversation] = conversations()
    expected = rendered_markdown(conversation.messages[-1].content, size[1])
    assert len(expected) > 2 * size[0]  # the answer was taller than the screen

    def words(lines: list[str]) -> Counter[str]:  # a list's numbers widen as it passes 9 items
        return Counter(" ".join(line.split()) for line in lines if line.strip())

    # no line more often than the answer has it (the old live region left ~30 copies of the title),
    # and the end of the answer last
    assert not words(shown) - words(expected), words(shown) - words(expected)
    assert shown[-3:] == expected[-3:] and sum(words(shown).values()) >= sum(words(expected).values()) - 2


def test_streamed_words_wrap_at_spaces_on_a_terminal() -> None:
    size = (40, 33)
    child = spawn("chat", "smollm2", "--max-tokens", "80", *GREEDY, size=size)
    shown = answer_on_screen(child, "Tell me about the sea in three sentences.", size)
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    [conversation] = conversations()
    words = conversation.messages[-1].content.split()
    assert len(" ".join(words)) > 3 * size[1]  # several lines
    assert [w for line in shown for w in line.split()] == words  # no word cut in two at the edge
    assert max(map(len, shown)) <= size[1]
