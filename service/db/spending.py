"""What a namespace's recent queries spent and how well the model predicted their anchors: the
input of the adaptive budget (``service.retrieve.budget``). One indexed read backwards over
``uq_queries_namespace_query_index``, only when ``EARM_BUDGET_POLICY=adaptive`` asks for it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession


@dataclass(frozen=True)
class SpentQuery:
    """One recent query: its budget, its candidates and its prequential error."""

    budget: int
    candidates: int
    prequential_error: float | None
    prequential_count: int


_RECENT_SQL = text(
    """
    SELECT budget, candidates, prequential_abs_error, prequential_count FROM queries
    WHERE namespace = :namespace AND query_index >= :since
      -- the policies that spend a budget; a client's 'full' or 'semantic' is its own choice
      AND policy IN ('earm', 'observed')
    ORDER BY query_index DESC LIMIT :limit
    """
)


async def recent_spending(
    session: AsyncSession, namespace: str, since_index: int, limit: int
) -> list[SpentQuery]:
    """The latest ``limit`` budget-spending queries from ``since_index`` on, latest first."""
    rows = await session.execute(
        _RECENT_SQL, {"namespace": namespace, "since": since_index, "limit": limit}
    )
    return [
        SpentQuery(int(r.budget), int(r.candidates), r.prequential_abs_error,
                   int(r.prequential_count))
        for r in rows
    ]
