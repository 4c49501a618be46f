"""A small terminal for the tests: what a pty's output leaves on the screen and in the scrollback.

Enough of a VT100 for what rich and runner write (text, CR, LF, backspace, tabs, cursor moves,
erasing, SGR ignored, pending wrap at the last column): the cursor cannot move up into the
scrollback, which is how a live display taller than the screen leaves copies of its lines there.
"""

from __future__ import annotations

import io
import re

CSI = re.compile(r"\x1b\[([?>=]?)([0-9;]*)([ -/]*)([@-~])")
OSC = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


class Terminal:
    def __init__(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        self.screen = [[" "] * cols for _ in range(rows)]
        self.scrollback: list[str] = []
        self.row = self.col = 0
        self.pending_wrap = False

    def feed(self, data: str) -> None:
        i = 0
        while i < len(data):
            ch = data[i]
            if ch == "\x1b":
                i = self._escape(data, i)
                continue
            if ch == "\r":
                self.col, self.pending_wrap = 0, False
            elif ch == "\n":
                self.col, self.pending_wrap = 0, False  # as a pty's ONLCR does
                self._linefeed()
            elif ch == "\b":
                self.col, self.pending_wrap = max(0, self.col - 1), False
            elif ch == "\t":
                self.col = min(self.cols - 1, (self.col // 8 + 1) * 8)
            elif ch >= " ":
                self._put(ch)
            i += 1

    def lines(self) -> list[str]:
        """The scrollback and the screen, each line without its trailing blanks, blank lines at the end
        dropped."""
        out = self.scrollback + ["".join(r).rstrip() for r in self.screen]
        while out and not out[-1]:
            out.pop()
        return out

    def _put(self, ch: str) -> None:
        if self.pending_wrap:
            self.col, self.pending_wrap = 0, False
            self._linefeed()
        self.screen[self.row][self.col] = ch
        if self.col == self.cols - 1:
            self.pending_wrap = True
        else:
            self.col += 1

    def _linefeed(self) -> None:
        if self.row == self.rows - 1:
            self.scrollback.append("".join(self.screen.pop(0)).rstrip())
            self.screen.append([" "] * self.cols)
        else:
            self.row += 1

    def _escape(self, data: str, i: int) -> int:
        osc = OSC.match(data, i)
        if osc:
            return osc.end()
        csi = CSI.match(data, i)
        if not csi:
            return i + 2  # ESC and one character: keypad modes, charsets
        private, params, _, final = csi.groups()
        numbers = [int(p) if p else 0 for p in params.split(";")] if params else []
        n = max(1, numbers[0]) if numbers else 1
        if not private:
            self._control(final, numbers, n)
        return csi.end()

    def _control(self, final: str, numbers: list[int], n: int) -> None:
        first = numbers[0] if numbers else 0
        if final != "m":  # colours keep a pending wrap; a cursor move or an erase ends it
            self.pending_wrap = False
        if final == "A":
            self.row = max(0, self.row - n)
        elif final == "B":
            self.row = min(self.rows - 1, self.row + n)
        elif final == "C":
            self.col = min(self.cols - 1, self.col + n)
        elif final == "D":
            self.col = max(0, self.col - n)
        elif final == "G":
            self.col = min(self.cols - 1, n - 1)
        elif final in "Hf":
            self.row = min(self.rows - 1, max(1, first) - 1)
            self.col = min(self.cols - 1, max(1, numbers[1] if len(numbers) > 1 else 1) - 1)
        elif final == "K":
            line = self.screen[self.row]
            start, end = {0: (self.col, self.cols), 1: (0, self.col + 1), 2: (0, self.cols)}.get(
                first, (0, 0)
            )
            line[start:end] = [" "] * (end - start)
        elif final == "J":
            if first == 0:
                self.screen[self.row][self.col :] = [" "] * (self.cols - self.col)
                for r in range(self.row + 1, self.rows):
                    self.screen[r] = [" "] * self.cols
            elif first in (2, 3):
                self.screen = [[" "] * self.cols for _ in range(self.rows)]


def rendered_markdown(text: str, width: int) -> list[str]:
    """The lines rich renders for this Markdown at this width, without their styles."""
    from rich.console import Console
    from rich.markdown import Markdown

    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    console.print(Markdown(text))
    return [line.rstrip() for line in console.file.getvalue().rstrip("\n").split("\n")]
