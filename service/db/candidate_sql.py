"""The statements that find a query's candidates (:mod:`service.db.search` pipelines them).

Each statement names the namespace, so it reads one partition of ``memories`` (migration
0017), and the namespaces of that partition share its partial HNSW index on
``memories.embedding``. A namespace that is a small share of its partition makes the index a
poor way to its rows: an iterative scan walks the
other namespaces' vectors to collect ``limit`` of its own, and gives up (then an exact scan
answers, in a second round trip) when it has fewer rows than that. Below
``%(exact_below)s`` memories the candidate statement therefore scans the namespace exactly,
along a B-tree that leads with the namespace, reading only its rows. The choice is made inside
the statement (a capped count of the namespace's index entries, then a one-time filter on each
branch) rather than from a per-process cache of namespace sizes: it costs no round trip, is
never stale, and keeps no state that API processes would have to agree on. Under a metadata
filter the caller sets a higher threshold: the index then walks past every row the filter
rejects too, and its top-N misses some of the exact scan's (docs/performance.md has both
measured).
"""

from __future__ import annotations

from service.db.model_state import content_sql

_CANDIDATE_COLUMNS = f"""
    id, external_id, text, occurred_at, metadata::text AS metadata_json,
    embedding <=> %(query)b AS distance,
    -- the weights are read once per statement (an InitPlan)
    coalesce({content_sql(
        "embedding", "(SELECT content_weights FROM namespaces WHERE name = %(namespace)s)"
    )}, 0) AS content_score
"""

# Whether the namespace has fewer than exact_below memories: counting stops there, so a large
# namespace costs at most exact_below entries of the (namespace, id) B-tree. 0: never.
_SMALL_CTE = """
    small AS (
        SELECT count(*) < %(exact_below)s AS exact FROM (
            SELECT FROM memories WHERE namespace = %(namespace)s LIMIT %(exact_below)s
        ) n
    )"""


def _scan(exact: bool, where: str, target: str, limit: str) -> str:
    """The ``limit`` memories matching ``where`` nearest (cosine) to the vector ``target``, with
    the candidate columns, ``key`` (the distance to ``target``) and ``complete``: on every row,
    whether the list is known to be complete (the HNSW index may stop early, or yield too few
    rows under a filter; an exact scan never does).

    The HNSW index is partial (``WHERE indexed``, see ``service.ingest.indexer``): the index scan
    covers the indexed rows and an exact scan the rows not indexed yet (none, once the
    background indexer has caught up). ``exact``: one exact scan of the whole namespace."""
    if exact:
        # `+ 0` hides the operator from the planner, forcing an exact scan.
        return f"""
            SELECT {_CANDIDATE_COLUMNS}, embedding <=> {target} AS key, true AS complete
            FROM memories WHERE {where} ORDER BY (embedding <=> {target}) + 0, id LIMIT {limit}"""
    return f"""
        SELECT id, external_id, text, occurred_at, metadata_json, distance, content_score, key,
               count(*) FILTER (WHERE indexed) OVER () >= {limit} AS complete FROM (
            (SELECT {_CANDIDATE_COLUMNS}, embedding <=> {target} AS key, true AS indexed
             FROM memories WHERE {where} AND indexed ORDER BY embedding <=> {target}
             LIMIT {limit})
            UNION ALL
            (SELECT {_CANDIDATE_COLUMNS}, embedding <=> {target} AS key, false AS indexed
             FROM memories WHERE {where} AND NOT indexed ORDER BY embedding <=> {target}
             LIMIT {limit})
        ) u
        ORDER BY key, id LIMIT {limit}"""


def _where(filtered: bool) -> str:
    return "namespace = %(namespace)s" + (" AND metadata @> %(filters)s" if filtered else "")


def _by_size(filtered: bool) -> str:
    """The namespace's candidates by an exact scan when it is small, else through the index.
    Each branch is gated by a one-time filter on the ``small`` InitPlan: the branch not taken
    is planned but never executed."""
    where = _where(filtered)
    exact = _scan(True, where + " AND (SELECT exact FROM small)", "%(query)b", "%(limit)s")
    indexed = _scan(False, where + " AND NOT (SELECT exact FROM small)", "%(query)b", "%(limit)s")
    return f"({exact}) UNION ALL ({indexed})"


def _with_model_rows(candidates: str, order: str, ctes: str = "") -> str:
    """The ``candidates`` statement's rows (``_CANDIDATE_COLUMNS``, ``key``, ``complete``)
    with their memory's model row, ordered by ``order``; ``ctes``: more CTEs it reads."""
    return f"""
        WITH {ctes + "," if ctes else ""} c AS MATERIALIZED ({candidates})
        -- One primary-key probe per candidate. A plain join (or a LATERAL subquery the
        -- planner can pull up into one) let it hash the whole memory_factors table, a cost
        -- that grew with the namespace's history; LIMIT 1 keeps the subquery a subquery.
        SELECT c.id, c.external_id, c.text, c.occurred_at, c.metadata_json, c.distance,
               c.content_score, c.complete, f.bias, f.factors, f.observation_count
        FROM c LEFT JOIN LATERAL (
            SELECT bias, factors, observation_count FROM memory_factors
            WHERE namespace = %(namespace)s AND memory_id = c.id LIMIT 1
        ) f ON true
        ORDER BY {order}
    """


#: The top-``limit`` candidates by cosine to the query with their model parameters, filtered or
#: not: an exact scan below ``exact_below`` memories, else through the HNSW index.
CANDIDATES_SQL = {
    filtered: _with_model_rows(_by_size(filtered), "c.key, c.id", _SMALL_CTE)
    for filtered in (False, True)
}
#: The exact scan of the namespace, which answers when the index yielded too few.
EXACT_CANDIDATES_SQL = {
    filtered: _with_model_rows(
        _scan(True, _where(filtered), "%(query)b", "%(limit)s"), "c.key, c.id"
    )
    for filtered in (False, True)
}

#: Candidates the caller gave (the rerank protocol's documents): the namespace's memories of
#: ``%(ids)s`` in the given order, which stands for the semantic ranking, with the same columns
#: (``key`` is the position, ``complete`` unused). An id of another namespace, or deleted
#: since, is no candidate.
GIVEN_CANDIDATES_SQL = _with_model_rows(
    f"""
    SELECT {_CANDIDATE_COLUMNS}, g.ord AS key, true AS complete
    FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS g(memory_id, ord)
    JOIN memories ON memories.id = g.memory_id AND memories.namespace = %(namespace)s
    """,
    "c.key",
)


def search_settings(ef_search: int) -> tuple[str, ...]:
    """The settings of the candidate statement, each a ``SET LOCAL`` of its own, sent right
    before it: transaction-local and meant for it alone.

    ``SET LOCAL`` rather than ``set_config(…, true)``: on Citus only the former reaches the
    workers that run the statement (with ``citus.propagate_set_commands = 'local'``, which
    ``earm migrate`` sets there), and the HNSW scan is theirs. ``ef_search`` is an integer
    written into the text (``SET`` takes no parameters).

    plan_cache_mode: the candidate query is prepared (psycopg prepares a statement from its
    5th execution on a connection), and Postgres may then switch to a generic plan, which does
    not know the query vector or the limit and is slower (measured 18 vs 10 ms at 100k
    memories). A custom plan costs ~0.2 ms of planning. Under these settings the planner,
    knowing the namespace, read the paraphrase window of a namespace that is most of the table
    by a sequential scan of `queries`, dead row versions included (2x the buffers of the index
    scan it otherwise takes; docs/performance.md): hence right before the candidate query."""
    return (
        f"SET LOCAL hnsw.ef_search = {int(ef_search)}",
        "SET LOCAL hnsw.iterative_scan = relaxed_order",
        "SET LOCAL plan_cache_mode = force_custom_plan",
    )
