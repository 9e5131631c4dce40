"""The SQL side of the common score scale (``service.completion.scale``): the map as a SQL
expression (the record and the late scores write through it, so a stored score is always its
raw score under the namespace's current scale, read under the namespace's lock), the
histograms a refit fits the scales from, and the refit's rewrite of the scores of a source
whose scale moved."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from numpy.typing import NDArray
from sqlalchemy.ext.asyncio import AsyncSession

from service.completion.scale import (
    COMMON_IRRELEVANT,
    COMMON_RELEVANT,
    HISTOGRAM_BINS,
    ScoreScale,
)
from service.db.statements import fetch_all

#: ``scores.scored_by`` of client feedback, which is on the common scale by definition.
FEEDBACK_SOURCE = "feedback"


def common_score_sql(raw: str, scale: str) -> str:
    """:meth:`ScoreScale.common` in SQL: ``raw`` (a float8 expression) under ``scale`` (a
    jsonb expression, ``[irrelevant, relevant, scores]``; NULL: the identity)."""
    scale = f"({scale})"
    low, high = f"({scale}->>0)::float8", f"({scale}->>1)::float8"
    return (
        f"(CASE WHEN {scale} IS NULL THEN {raw}"
        # (a score under 1e-30 maps to 0, not to a float8 that underflows the real column)
        f" WHEN {raw} <= {low} THEN (CASE WHEN {low} > 0 AND {raw} < 1e-30 THEN 0"
        f" WHEN {low} > 0 THEN {COMMON_IRRELEVANT} * {raw} / {low}"
        f" ELSE {COMMON_IRRELEVANT} END)"
        f" WHEN {raw} <= {high} THEN {COMMON_IRRELEVANT}"
        f" + ({COMMON_RELEVANT} - {COMMON_IRRELEVANT}) * ({raw} - {low}) / ({high} - {low})"
        f" WHEN {high} < 1 THEN {COMMON_RELEVANT}"
        f" + (1 - {COMMON_RELEVANT}) * ({raw} - {high}) / (1 - {high})"
        f" ELSE {COMMON_RELEVANT} END)"
    )


def scales_from_json(value: dict[str, Any] | None) -> dict[str, ScoreScale]:
    """``namespaces.score_scales`` as scales."""
    return {source: ScoreScale.from_json(scale) for source, scale in (value or {}).items()}


def scales_json(scales: dict[str, ScoreScale]) -> str:
    return json.dumps({source: scale.as_json() for source, scale in sorted(scales.items())})


# Live scorer observations of a recorded source; 0-based bins as score_bins numbers them.
_HISTOGRAMS_SQL = f"""
    SELECT scored_by, least(width_bucket(raw_score::float8, 0, 1, {HISTOGRAM_BINS}),
                            {HISTOGRAM_BINS}) - 1,
           count(*), sum(raw_score::float8)
    FROM scores
    WHERE namespace = %(namespace)s AND source = 'scorer' AND scored_by IS NOT NULL
      AND retired_at IS NULL
    GROUP BY 1, 2
"""
_SCALES_SQL = "SELECT score_scales FROM namespaces WHERE name = %(namespace)s"

Histograms = dict[str, tuple[NDArray[np.int64], NDArray[np.float64]]]


async def scale_inputs(
    session: AsyncSession, namespace: str
) -> tuple[dict[str, ScoreScale], Histograms]:
    """The namespace's current scales, and each scorer source's histogram of raw scores."""
    rows = await fetch_all(session, _SCALES_SQL, {"namespace": namespace})
    current = scales_from_json(rows[0][0] if rows else None)
    histograms: Histograms = {}
    for source, bin_index, count, total in await fetch_all(
        session, _HISTOGRAMS_SQL, {"namespace": namespace}
    ):
        counts, sums = histograms.setdefault(
            source, (np.zeros(HISTOGRAM_BINS, np.int64), np.zeros(HISTOGRAM_BINS))
        )
        counts[bin_index] += count
        sums[bin_index] += total
    return current, histograms


_REMAP_SQL = f"""
    UPDATE scores SET score = ({common_score_sql(
        "raw_score::float8", "%(scales)s::jsonb -> scored_by")})::real
    WHERE namespace = %(namespace)s AND source = 'scorer'
      AND scored_by = ANY(%(sources)s::text[])
"""
_STORE_SCALES_SQL = (
    "UPDATE namespaces SET score_scales = %(scales)s::jsonb WHERE name = %(namespace)s"
)


@dataclass(frozen=True)
class ScaleUpdate:
    """A refit's scales (``service.completion.scale.refit_scales``) and the sources whose
    scale moved, whose stored scores it rewrites."""

    scales: dict[str, ScoreScale]
    moved: tuple[str, ...]

    @classmethod
    def of(cls, current: dict[str, ScoreScale], scales: dict[str, ScoreScale]) -> ScaleUpdate:
        moved = tuple(sorted(s for s, scale in scales.items() if current.get(s) is not scale))
        return cls(scales, moved)


async def store_scales(
    conn: psycopg.AsyncConnection[Any], namespace: str, update: ScaleUpdate
) -> None:
    """Store the namespace's scales, and rewrite the scores of the sources whose scale moved.
    Under the namespace's lock (the refit's write): no record writes meanwhile, and the ones
    after it map their scores under the new scales."""
    if not update.moved:
        return
    parameters = {
        "namespace": namespace, "scales": scales_json(update.scales),
        "sources": list(update.moved),
    }
    await conn.execute(_REMAP_SQL, parameters)
    await conn.execute(_STORE_SCALES_SQL, parameters)
