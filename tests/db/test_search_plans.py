"""Plans of the search's reads that must stay bounded however long a namespace's history grows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine, text

from service.db.search import _RECENT_ANCHORS_SQL

#: Queries of the namespace; only the last ANCHORED have anchors (scored by a retrieve), the
#: others' observations came in bulk (no anchor kind), as after an import or feedback.
QUERIES, MEMORIES, ANCHORED, WINDOW = 400, 50, 10, 5


def test_the_anchor_window_reads_its_queries_scores_by_key_not_the_scores_table(
    clean_database: str,
    plan_nodes: Callable[[dict[str, Any]], list[dict[str, Any]]],
    partition_parents: dict[str, str],
) -> None:
    """The statistics say anchors are rare (a 40th of the scores), which made the planner scan
    every score of the table for them; the window's scores are read through the scores' primary
    key, whatever the statistics."""
    engine = create_engine(clean_database)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO namespaces (name, next_query_index) VALUES ('a', :n)"),
                         {"n": QUERIES})
            conn.execute(text(
                "INSERT INTO memories (namespace, text, embedding, embedding_model) "
                "SELECT 'a', 't', array_fill(0, ARRAY[384])::vector, 'client' "
                "FROM generate_series(1, :count)"), {"count": MEMORIES})
            conn.execute(text(
                "INSERT INTO queries (namespace, query_index, text, embedding, policy, "
                "candidates, budget, scorer_calls) SELECT 'a', i, 'q', "
                "array_fill(0, ARRAY[384])::vector, 'earm', 50, 50, 50 "
                "FROM generate_series(0, :count - 1) AS i"), {"count": QUERIES})
            conn.execute(text(
                "INSERT INTO scores (query_id, memory_id, namespace, score, similarity, source, "
                "anchor_kind) SELECT q.id, m.id, 'a', 0.9, 0.5, 'scorer', "
                "CASE WHEN q.query_index >= :first THEN 3 END FROM queries q, memories m"),
                {"first": QUERIES - ANCHORED})
            conn.execute(text("ANALYZE"))
            parameters = {"namespace": "a", "anchor_queries": WINDOW, "anchor_kinds": [2, 3],
                          "anchor_min_score": 0.5}
            plan = conn.exec_driver_sql(
                "EXPLAIN (FORMAT JSON) " + _RECENT_ANCHORS_SQL, parameters).scalar_one()
            anchors = conn.exec_driver_sql(_RECENT_ANCHORS_SQL, parameters).fetchall()
    finally:
        engine.dispose()
    on_scores = [node for node in plan_nodes(plan[0]["Plan"])
                 if partition_parents.get(node.get("Relation Name", "")) == "scores"]
    assert on_scores and all(node["Node Type"] != "Seq Scan" for node in on_scores), plan
    assert len(anchors) == WINDOW * MEMORIES
    assert {row[0] for row in anchors} == set(range(QUERIES - WINDOW, QUERIES))
