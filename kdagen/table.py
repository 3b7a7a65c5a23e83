"""Plain-text output for the CLI: tables, the fixed order of chips, and progress reports."""
from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO

from .target import TARGETS

# Chips are always listed in this order (sm_90a, sm_100a, sm_120a), whatever order they were
# given in.
CHIP_ORDER = tuple(TARGETS)


def chip_rank(chip: str) -> tuple[int, str]:
    """Sort key putting chips in :data:`CHIP_ORDER` (unknown chips after, by name)."""
    return (CHIP_ORDER.index(chip), "") if chip in CHIP_ORDER else (len(CHIP_ORDER), chip)


def sort_chips(chips) -> list[str]:
    return sorted(set(chips), key=chip_rank)


def format_table(headers: list[str], rows: list[list[object]], max_width: int | None = None,
                 shrink: int | tuple[int, ...] = 0) -> str:
    """Columns padded to their widest cell. With ``max_width``, the columns ``shrink`` (in
    that order) are cut in the middle ('...') until no line is wider than ``max_width``."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    if max_width is not None:
        for col in (shrink,) if isinstance(shrink, int) else shrink:
            excess = sum(widths) + 2 * (len(widths) - 1) - max_width
            if excess <= 0:
                break
            keep = max(len(headers[col]), widths[col] - excess, 9)
            widths[col] = min(widths[col], keep)
            for row in cells:
                row[col] = _cut_middle(row[col], widths[col])
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cut_middle(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    tail = (width - 3) // 2
    return text[:width - 3 - tail] + "..." + text[len(text) - tail:]


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """'1 kernel', '2 kernels'."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"


class Progress:
    """Progress of a long command on ``stream`` (stderr by default).

    On a terminal: one bar, redrawn in place and erased at the end. Otherwise: one short line
    per finished item (``done``), nothing for ``status``. ``total`` counts steps; a step may be
    split into parts (``begin_step(parts)``) so that the bar moves per kernel.
    """

    def __init__(self, total: int, prefix: str, stream: TextIO | None = None,
                 tty: bool | None = None, enabled: bool = True):
        self.stream = stream or sys.stderr
        self.tty = (bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None
                    else tty)
        self.enabled = enabled
        self.total = max(total, 1)
        self.prefix = prefix
        self.steps_done = 0
        self.parts = 1
        self.parts_done = 0
        self.items_done = 0
        self.start = time.monotonic()
        self._drawn = False

    @property
    def fraction(self) -> float:
        part = self.parts_done / self.parts if self.parts else 0.0
        return min(1.0, (self.steps_done + part) / self.total)

    def begin_step(self, parts: int = 1) -> None:
        self.parts, self.parts_done = max(parts, 1), 0

    def end_step(self) -> None:
        self.steps_done += 1
        self.parts, self.parts_done = 1, 0

    def status(self, text: str) -> None:
        """What is being done now (shown on the bar only)."""
        if self.enabled and self.tty:
            self._draw(text)

    def done(self, text: str) -> None:
        """One item finished (a kernel): a line when not on a terminal, the bar moves else."""
        self.parts_done = min(self.parts_done + 1, self.parts)
        self.items_done += 1
        if not self.enabled:
            return
        if self.tty:
            self._draw(text)
        else:
            step = min(self.steps_done + 1, self.total)
            self.stream.write(f"{self.prefix}: [{step}/{self.total}] {text}\n")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty and self._drawn:
            width = shutil.get_terminal_size((80, 24)).columns
            self.stream.write("\r" + " " * (width - 1) + "\r")
            self.stream.flush()
            self._drawn = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _draw(self, text: str) -> None:
        width = max(40, shutil.get_terminal_size((80, 24)).columns) - 1
        pct = int(100 * self.fraction)
        bar_len = 24
        filled = int(bar_len * self.fraction)
        elapsed = int(time.monotonic() - self.start)
        head = (f"{self.prefix} [{'#' * filled}{'.' * (bar_len - filled)}] {pct:3d}% "
                f"{elapsed:4d}s ")
        line = (head + text)[:width]
        self.stream.write("\r" + line.ljust(width))
        self.stream.flush()
        self._drawn = True
