"""What a namespace's recent queries spent and how well the model predicted their anchors: the
input of the adaptive budget (``service.retrieve.budget``). One indexed read backwards over
``uq_queries_namespace_query_index``, only when ``EARM_BUDGET_POLICY=adaptive`` asks for it."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from service.db.statements import fetch_all


@dataclass(frozen=True)
class SpentQuery:
    """One recent query: its budget, its candidates and its prequential error."""

    budget: int
    candidates: int
    prequential_error: float | None
    prequential_count: int


_RECENT_SQL = """
    SELECT budget, candidates, prequential_abs_error, prequential_count FROM queries
    WHERE namespace = %(namespace)s AND query_index >= %(since)s
      -- the policies that spend a budget; a client's 'full' or 'semantic' is its own choice
      AND policy IN ('earm', 'observed')
    ORDER BY query_index DESC LIMIT %(limit)s
"""


async def recent_spending(
    session: AsyncSession, namespace: str, since_index: int, limit: int
) -> list[SpentQuery]:
    """The latest ``limit`` budget-spending queries from ``since_index`` on, latest first."""
    rows = await fetch_all(
        session, _RECENT_SQL, {"namespace": namespace, "since": since_index, "limit": limit}
    )
    return [
        SpentQuery(int(budget), int(candidates), error, int(count))
        for budget, candidates, error, count in rows
    ]
