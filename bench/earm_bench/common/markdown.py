"""Markdown tables for the reports the benchmarks print."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def row(cells: Iterable[object]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def table(head: Sequence[str], rows: Iterable[Iterable[object]], align: str = "") -> list[str]:
    """The lines of a table; ``align`` has one letter per column, ``r`` for right-aligned
    (numbers), anything else (or nothing) for the default."""
    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in align.ljust(len(head)))
    return [row(head), rule, *(row(cells) for cells in rows)]
