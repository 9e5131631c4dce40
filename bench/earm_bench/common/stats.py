"""Percentiles, one definition for every report: linear interpolation (numpy's default)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

PERCENTILES = (50, 95, 99)


def _interpolate(ordered: Sequence[float], q: float) -> float:
    if not 0 <= q <= 100:
        raise ValueError("q must be in [0, 100]")
    position = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(position), math.ceil(position)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (position - low))


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0–100) with linear interpolation, or None for no values."""
    ordered = sorted(values)
    return _interpolate(ordered, q) if ordered else None


def percentiles(values: Sequence[float], digits: int = 2) -> dict[str, Any]:
    """p50/p95/p99 and the mean, rounded to ``digits``, and ``n``; None values when empty."""
    if not len(values):
        return {f"p{p}": None for p in PERCENTILES} | {"mean": None, "n": 0}
    ordered = sorted(values)
    out: dict[str, Any] = {f"p{p}": round(_interpolate(ordered, p), digits) for p in PERCENTILES}
    out["mean"] = round(statistics.fmean(ordered), digits)
    out["n"] = len(ordered)
    return out
