"""Console output: prefixed lines from each process, and a live status block on a terminal."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from typing import TextIO

_COLORS = {"eagle": "36", "baseline": "35", "router": "33", "dynspec": "1"}


class Printer:
    """Writes whole lines; on a TTY it keeps a status block (one line per server) at the bottom.

    When stdout is not a TTY there is no block: ``status`` prints nothing and callers print plain
    progress lines at a slower pace instead.

    A console that goes away (``| tee`` ended by the same Ctrl-C, a closed terminal) only ends
    the printing: the first failed write turns the printer off and points the dead stream, and
    stderr when it is the same pipe, at /dev/null, so that the shutdown in progress, its logging
    and the exit go on as if nothing was read. Every line is in the log files anyway.
    """

    def __init__(self, stream: TextIO, tty: bool | None = None, width: int | None = None) -> None:
        self._stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self._fixed_width = width
        self._block: list[str] = []
        self.broken = False

    def _gone(self) -> None:
        """The console's reader left: stop printing, and let nothing else fail on it."""
        self.broken = True
        self._block = []
        try:
            fd = self._stream.fileno()
        except (OSError, ValueError):
            return
        same_as_stderr = False
        with contextlib.suppress(OSError, ValueError):
            a, b = os.fstat(fd), os.fstat(sys.stderr.fileno())
            same_as_stderr = (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
            if same_as_stderr:
                os.dup2(devnull, sys.stderr.fileno())
        finally:
            os.close(devnull)
        # What the stream still buffers would fail again at the next flush: drop it there.
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()

    def _write(self, *parts: str) -> None:
        if self.broken:
            return
        try:
            for part in parts:
                self._stream.write(part)
            self._stream.flush()
        except OSError:  # BrokenPipeError, or EIO from a terminal that closed
            self._gone()

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

    def _erase_block(self) -> str:
        if self.tty and self._block:
            # Up to the block's first line, then clear to the end of the screen.
            return f"\x1b[{len(self._block)}F\x1b[J"
        return ""

    def _draw_block(self) -> str:
        return "".join(line[: self._width] + "\n" for line in self._block)

    def line(self, prefix: str, text: str, name: str = "") -> None:
        painted = self._paint(prefix, name or prefix.strip("[]").split()[0])
        self._write(self._erase_block(), f"{painted} {text}\n", self._draw_block())

    def status(self, lines: list[str]) -> None:
        if not self.tty:
            return
        erase = self._erase_block()
        self._block = list(lines)
        self._write(erase, self._draw_block())

    def clear_status(self) -> None:
        erase = self._erase_block()
        self._block = []
        self._write(erase)
