"""Console output: prefixed lines from each process, and a live status block on a terminal."""

from __future__ import annotations

import shutil
from typing import TextIO

_COLORS = {"eagle": "36", "baseline": "35", "router": "33", "dynspec": "1"}


class Printer:
    """Writes whole lines; on a TTY it keeps a status block (one line per server) at the bottom.

    When stdout is not a TTY there is no block: ``status`` prints nothing and callers print plain
    progress lines at a slower pace instead.
    """

    def __init__(self, stream: TextIO, tty: bool | None = None, width: int | None = None) -> None:
        self._stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self._fixed_width = width
        self._block: list[str] = []

    @property
    def _width(self) -> int:
        # Cut status lines to the terminal's width: a wrapped line would break the redraw, which
        # moves the cursor up by the number of lines it wrote.
        if self._fixed_width is not None:
            return self._fixed_width
        # A terminal may report 0 columns (a fresh pty); Python 3.10 passes that on.
        columns = shutil.get_terminal_size((120, 24)).columns or 120
        return max(20, columns - 1)

    def _paint(self, prefix: str, name: str) -> str:
        code = _COLORS.get(name)
        return f"\x1b[{code}m{prefix}\x1b[0m" if self.tty and code else prefix

    def _erase_block(self) -> None:
        if self.tty and self._block:
            # Up to the block's first line, then clear to the end of the screen.
            self._stream.write(f"\x1b[{len(self._block)}F\x1b[J")

    def _draw_block(self) -> None:
        for line in self._block:
            self._stream.write(line[: self._width] + "\n")

    def line(self, prefix: str, text: str, name: str = "") -> None:
        self._erase_block()
        self._stream.write(f"{self._paint(prefix, name or prefix.strip('[]').split()[0])} {text}\n")
        self._draw_block()
        self._stream.flush()

    def status(self, lines: list[str]) -> None:
        if not self.tty:
            return
        self._erase_block()
        self._block = list(lines)
        self._draw_block()
        self._stream.flush()

    def clear_status(self) -> None:
        self._erase_block()
        self._block = []
        self._stream.flush()
