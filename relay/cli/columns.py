"""Tables fitted to the terminal or ``$COLUMNS``: the first of a table's layouts, widest first,
whose lines fit (docs/watching.md). A pipe without ``$COLUMNS`` gets every column, so a script
always reads the same layout; a line still too wide is cut, since a line that wraps breaks the
table.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TextIO


def terminal_width(stream: TextIO) -> int | None:
    """The columns to fit on ``stream``: $COLUMNS, else its terminal's; None: no limit."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        if stream.isatty():
            # (0: a terminal that never said)
            return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, ValueError, OSError):  # not a real file (captured output), or closed
        pass
    return None


@dataclass(frozen=True)
class Column:
    """A column: its key in a row's cells, its heading, its width (a longer cell widens its line,
    never cut), and which side it keeps to (numbers right, text left)."""

    key: str
    head: str
    width: int
    left: bool = False

    def show(self, text: str) -> str:
        return text.ljust(self.width) if self.left else text.rjust(self.width)


@dataclass(frozen=True)
class Layout:
    """Columns, the space between them, and the room kept after them for a last free text (a
    flag)."""

    columns: tuple[Column, ...]
    sep: str = "  "
    room: int = 0

    @property
    def width(self) -> int:
        return sum(c.width for c in self.columns) + len(self.sep) * (len(self.columns) - 1)

    def header(self, tail: str = "") -> str:
        return self.sep.join([*(c.show(c.head) for c in self.columns), *([tail] if tail else [])])

    def line(self, cells: dict[str, str]) -> str:
        return self.sep.join(c.show(cells.get(c.key, "-")) for c in self.columns)


def fit(layouts: Iterable[Layout], width: int | None) -> Layout:
    """The first layout whose columns and room fit ``width`` (the widest for no limit), else the
    last."""
    chosen = None
    for chosen in layouts:
        room = len(chosen.sep) + chosen.room if chosen.room else 0
        if width is None or chosen.width + room <= width:
            return chosen
    assert chosen is not None, "no layout given"
    return chosen
