"""The audits of ``earm bench load-mix``: what the service's answers and its database say
about each other once the load is over.

Without faults every count must match exactly. With faults, a write that failed with a 5xx
or on the wire may have committed all the same ("in doubt"), a degraded retrieve stores fewer
observations than it made scorer calls, and a delete takes its memory's observations with it:
the counts are then checked within those bounds, and by id that nothing acknowledged is lost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from earm_bench.load_mix.config import LoadMixConfig
from earm_bench.load_mix.ledger import NamespaceLedger

Audits = dict[str, bool]

_COUNTS_SQL = (
    "SELECT n.next_query_index, n.scorer_calls, n.score_count, "
    "(SELECT count(*) FROM queries q WHERE q.namespace = n.name), "
    "(SELECT count(*) FROM memories m WHERE m.namespace = n.name), "
    "(SELECT count(*) FROM scores s WHERE s.namespace = n.name) "
    "FROM namespaces n WHERE n.name = :name"
)
_COUNT_CHECKS = (  # without faults, and with faults
    ("next_query_index == queries == answered retrieves",
     "next_query_index == queries rows; answered retrieves ≤ rows ≤ answered + in doubt"),
    ("memories == seeded + created",
     "memories == seeded + created − deleted, but for writes in doubt"),
    ("scores rows == observed + feedback recorded",
     "scores rows ≤ observed + feedback recorded (+ in doubt; fewer: degraded, deleted)"),
    ("namespaces.scorer_calls == sum(scorer_calls)",
     "namespaces.scorer_calls == sum(scorer_calls), but for retrieves in doubt"),
    ("namespaces.score_count == scores rows",
     "namespaces.score_count == scores rows (more after deletes, until the next refit)"),
)


@dataclass(frozen=True)
class _Counts:
    """One namespace's counters and rows, as the database has them."""

    next_query_index: int
    scorer_calls: int
    score_count: int
    queries: int
    memories: int
    scores: int


def audit_http(ledgers: Mapping[str, NamespaceLedger], config: LoadMixConfig
               ) -> tuple[Audits, list[str]]:
    """Per namespace, the answered query indexes are 0..n-1 (with faults: distinct, and gaps
    only where a retrieve is in doubt); with deletes, no retrieve returned a memory whose
    delete was acknowledged before it started."""
    audits: Audits = {}
    problems = []
    for name, ledger in ledgers.items():
        indexes = sorted(answer.query_index for answer in ledger.retrieves)
        if not config.faults.any:
            holds = indexes == list(range(len(indexes)))
            key = "http: gap-free query indexes"
        else:
            limit = len(indexes) + ledger.in_doubt["retrieve"]
            holds = len(set(indexes)) == len(indexes) and all(i < limit for i in indexes)
            key = "http: distinct query indexes, gaps only for retrieves in doubt"
        audits[key] = audits.get(key, True) and holds
        if not holds:
            problems.append(f"{name}: answered query indexes are not 0..{len(indexes) - 1}")
        if config.faults.deletes:
            stale = [a.query_id for a in ledger.retrieves
                     if any(ledger.deleted.get(m, a.started) < a.started for m in a.memory_ids)]
            key = "http: no retrieve returned a memory deleted before it started"
            audits[key] = audits.get(key, True) and not stale
            if stale:
                problems.append(f"{name}: queries {stale[:10]} returned deleted memories")
    return audits, problems


def _count_checks(ledger: NamespaceLedger, found: _Counts, config: LoadMixConfig) -> Audits:
    tolerant = config.faults.any
    doubt = ledger.in_doubt if tolerant else Counter[str]()
    answered, calls = len(ledger.retrieves), ledger.scorer_calls
    live = ledger.seeded + ledger.created - len(ledger.deleted)
    observed = calls + ledger.feedback_recorded
    spare_calls = doubt["retrieve"] * config.candidates
    spare_scores = spare_calls + doubt["feedback"] * 3  # feedback sends up to 3 scores
    fewer_scores = ledger.degraded or bool(ledger.deleted)
    holds = (
        found.next_query_index == found.queries
        and answered <= found.queries <= answered + doubt["retrieve"],
        live - doubt["delete"] <= found.memories <= live + doubt["ingest"] * config.batch,
        (0 if fewer_scores else observed) <= found.scores <= observed + spare_scores,
        calls <= found.scorer_calls <= calls + spare_calls,
        found.score_count == found.scores
        or (bool(ledger.deleted) and found.score_count > found.scores),
    )
    return {names[tolerant]: check for names, check in zip(_COUNT_CHECKS, holds, strict=True)}


def _id_checks(ledger: NamespaceLedger, stored: dict[str, set[Any]]) -> Audits:
    """Nothing acknowledged is lost: every answered query, every memory created and not
    deleted, every observation of such a memory is in the database (a delete in doubt may
    account for as many missing memories)."""
    missing = ledger.live_memory_ids() - stored["memories"]
    gone = set(ledger.deleted) | (missing if len(missing) <= ledger.in_doubt["delete"] else set())
    answered = {(a.query_id, a.query_index) for a in ledger.retrieves}
    observations = {(a.query_id, m) for a in ledger.retrieves for m in a.observed_ids}
    observations |= ledger.feedback_pairs
    return {
        "every answered retrieve is stored with its query index": answered <= stored["queries"],
        "every memory created and not deleted is stored, no deleted one": (
            not missing - gone and not stored["memories"] & set(ledger.deleted)
        ),
        "every acknowledged observation of a live memory is stored": {
            (q, m) for q, m in observations if m not in gone
        } <= stored["scores"],
    }


def _stored_ids(conn: Any, name: str) -> dict[str, set[Any]]:
    from sqlalchemy import text

    def rows(sql: str) -> set[Any]:
        return {tuple(r) if len(r) > 1 else r[0] for r in conn.execute(text(sql), {"name": name})}

    return {
        "memories": rows("SELECT id FROM memories WHERE namespace = :name"),
        "queries": rows("SELECT id, query_index FROM queries WHERE namespace = :name"),
        "scores": rows("SELECT query_id, memory_id FROM scores WHERE namespace = :name"),
    }


def _audit_namespace(conn: Any, name: str, ledger: NamespaceLedger, config: LoadMixConfig
                     ) -> tuple[Audits, list[str]]:
    from sqlalchemy import text

    found = _Counts(*conn.execute(text(_COUNTS_SQL), {"name": name}).one())
    checks = _count_checks(ledger, found, config)
    if config.faults.any:
        checks |= _id_checks(ledger, _stored_ids(conn, name))
    expected = (
        f"answered={len(ledger.retrieves)}, calls={ledger.scorer_calls}, "
        f"feedback={ledger.feedback_recorded}, seeded={ledger.seeded}, created={ledger.created}"
    )
    if config.faults.any:
        expected += f", deleted={len(ledger.deleted)}, in doubt={dict(ledger.in_doubt)}"
    problems = [f"{name}: {check} fails ({found.__dict__}; {expected})"
                for check, holds in checks.items() if not holds]
    return checks, problems


def audit_database(
    ledgers: Mapping[str, NamespaceLedger], database_url: str, config: LoadMixConfig
) -> tuple[Audits, list[str]]:
    """Each database check of the module docstring, over all namespaces of the run."""
    from sqlalchemy import create_engine

    from service.db.engine import sqlalchemy_url

    audits: Audits = {}
    problems: list[str] = []
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.connect() as conn:
            for name, ledger in ledgers.items():
                checks, found = _audit_namespace(conn, name, ledger, config)
                for check, holds in checks.items():
                    key = f"database: {check}"
                    audits[key] = audits.get(key, True) and holds
                problems += found
    finally:
        engine.dispose()
    return audits, problems
