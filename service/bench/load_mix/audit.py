"""The audits of ``earm bench load-mix``: what the service's answers and its database say
about each other once the load is over."""

from __future__ import annotations

from collections.abc import Mapping

from service.bench.load_mix.ledger import NamespaceLedger

_AUDITED_COLUMNS = ("next_query_index", "scorer_calls", "score_count", "queries", "memories",
                    "scores")
_NAMESPACE_SQL = (
    "SELECT n.next_query_index, n.scorer_calls, n.score_count, "
    "(SELECT count(*) FROM queries q WHERE q.namespace = n.name), "
    "(SELECT count(*) FROM memories m WHERE m.namespace = n.name), "
    "(SELECT count(*) FROM scores s WHERE s.namespace = n.name) "
    "FROM namespaces n WHERE n.name = :name"
)

Audits = dict[str, bool]


def audit_http(ledgers: Mapping[str, NamespaceLedger]) -> tuple[bool, list[str]]:
    """Per namespace, the answered query indexes are exactly 0..n-1."""
    problems = []
    for name, ledger in ledgers.items():
        indexes = sorted(answer.query_index for answer in ledger.retrieves)
        if indexes != list(range(len(indexes))):
            problems.append(f"{name}: answered query indexes are not 0..{len(indexes) - 1}")
    return not problems, problems


def _checks(ledger: NamespaceLedger, row: tuple) -> dict[str, bool]:
    next_index, scorer_calls, score_count, queries, memories, scores = row
    answered = len(ledger.retrieves)
    expected_scores = ledger.scorer_calls + ledger.feedback_recorded
    return {
        "next_query_index == queries == answered retrieves": next_index == queries == answered,
        "memories == seeded + created": memories == ledger.seeded + ledger.created,
        # A degraded retrieve recorded fewer observations than it made scorer calls.
        "scores rows == observed + feedback recorded": (
            scores <= expected_scores if ledger.degraded else scores == expected_scores
        ),
        "namespaces.scorer_calls == sum(scorer_calls)": scorer_calls == ledger.scorer_calls,
        "namespaces.score_count == scores rows": score_count == scores,
    }


def audit_database(
    ledgers: Mapping[str, NamespaceLedger], database_url: str
) -> tuple[Audits, list[str]]:
    """Each database check of the package docstring, over all namespaces of the run."""
    from sqlalchemy import create_engine, text

    from service.db.database import sqlalchemy_url

    audits: Audits = {}
    problems = []
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.connect() as conn:
            for name, ledger in ledgers.items():
                row = tuple(conn.execute(text(_NAMESPACE_SQL), {"name": name}).one())
                found = dict(zip(_AUDITED_COLUMNS, row))
                expected = (
                    f"answered={len(ledger.retrieves)}, calls={ledger.scorer_calls}, "
                    f"feedback={ledger.feedback_recorded}, seeded={ledger.seeded}, "
                    f"created={ledger.created}"
                )
                for check, holds in _checks(ledger, row).items():
                    key = f"database: {check}"
                    audits[key] = audits.get(key, True) and holds
                    if not holds:
                        problems.append(f"{name}: {check} fails ({found}; {expected})")
    finally:
        engine.dispose()
    return audits, problems
