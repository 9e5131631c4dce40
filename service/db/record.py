"""The record of one retrieve: the query's row (with its trace), its observations, the
namespace's counters and the online update of the memory rows it observed, written in one
pipelined round trip with the COMMIT (one per statement when too large), before the response
(docs/design.md "The retrieve pipeline").

What is recorded travels as one :class:`RecordedRetrieve`, built once by the pipeline;
:func:`_record_parameters` is the one place that maps it to the statement's parameters.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession

from service.completion import QueryParameters
from service.db.codecs import Float8Rows, array_literal, as_real, real_values
from service.db.engine import driver_connection
from service.db.model_state import OnlineUpdate, online_update_statement
from service.db.namespaces import STATE_SQL
from service.db.scales import common_score_sql
from service.db.statements import pipeline

#: The origin of an observation the scorer made for the query (``scores.source``, as
#: _RECORD_SQL writes it).
SCORER_ORIGIN = "scorer"
#: The origin of a cell taken from an earlier asking of the query's family (no scores row of
#: its own: ``queries.reused_memory_ids``).
REUSED_ORIGIN = "reused"


@dataclass(frozen=True)
class QueryTrace:
    """What the trace of a retrieve keeps (``GET /queries/{id}``): its stage, the phase timings
    known when it is recorded, and its candidates in rank order (best first)."""

    stage: int
    timings: dict[str, float]
    memory_ids: np.ndarray
    similarities: np.ndarray
    estimates: np.ndarray  # the policy's estimate, what an unobserved candidate ranked by
    scores: np.ndarray  # the final score
    sources: Sequence[str]  # a service.api.retrieve.Source ("observed", "estimated", ...)
    origins: Sequence[str | None]  # the observation's origin ("scorer", ...), None: unobserved
    anchors: np.ndarray  # bool: sampled as an anchor (scored, or failed: degraded)
    # why each anchor was scored ("head", "estimate", "explore"), None for the others
    anchor_reasons: Sequence[str | None]
    scorer_rounds: int  # the rounds the anchors went out in, one after the other


@dataclass(frozen=True)
class ObservedCells:
    """The cells the scorer observed for the query: memories, their cosine to the query, the
    scores, and the content prior's offset of each (what the online update learns from; not
    stored, the refit recomputes it)."""

    memory_ids: np.ndarray
    similarities: np.ndarray
    scores: np.ndarray  # on the namespace's common scale, as the model learns from them
    raw_scores: np.ndarray  # as the scorer gave them
    prior_offsets: np.ndarray
    anchor_kinds: np.ndarray  # which part of the anchor rule chose each (scores.anchor_kind)


@dataclass(frozen=True)
class ReusedCells:
    """The candidates taken from the observations of earlier askings of the query's family:
    recorded as ids only, never as observations (the judgement already has its row, and
    learning counts it once)."""

    memory_ids: np.ndarray
    saved_calls: int  # what the budget would have scored had the family not covered them


@dataclass(frozen=True)
class Spending:
    """What the retrieve spent, and what full reranking would have."""

    candidates: int  # semantic candidates: what full reranking would have scored
    budget: int
    scorer_calls: int
    scorer_requests: int  # HTTP requests the scorer made for those calls, retries included


@dataclass(frozen=True)
class RecordedRetrieve:
    """Everything one retrieve records."""

    namespace: str
    text: str
    embedding: np.ndarray
    policy: str
    scored_by: str  # the scorer's source (``scores.scored_by``)
    family_key: bytes | None  # None: a semantic retrieve (it joins no family)
    query: QueryParameters | None  # the query's solved parameters (None: nothing observed)
    # |estimate - observed| of the fresh anchors that had history (leave-one-out)
    prequential_errors: np.ndarray
    spending: Spending
    observed: ObservedCells
    reused: ReusedCells
    returned: int  # memories returned
    returned_estimated: int  # of them, those whose score is the completion's estimate
    exploration_share: float | None  # the anchor rule's (None: no choice of anchors)
    trace: QueryTrace


@dataclass(frozen=True)
class RecordedQuery:
    query_id: int
    query_index: int
    queries_since_refit: int


_RECORD_SQL = """
    WITH live AS (
        -- The observations of memories that still exist: one deleted since the search simply
        -- has none (its row is gone, and the foreign key would refuse the observation).
        -- The scores on the namespace's common scale as it is now, under the lock.
        SELECT t.m, COMMON_SCORE AS s, t.r, t.c, t.k
        -- (similarities: float8 rounded to real, as the column stores them)
        FROM unnest(%(memory_ids)s::bigint[], %(raw_scores)s::float8[],
                    %(similarities)s::float8[]::real[], %(anchor_kinds)s::smallint[])
            AS t(m, r, c, k),
             (SELECT score_scales -> %(scored_by)s::text AS scale FROM namespaces
              WHERE name = %(namespace)s) AS current
        WHERE EXISTS (SELECT FROM memories WHERE namespace = %(namespace)s AND id = t.m)
    ), n AS (
        UPDATE namespaces SET
            next_query_index = next_query_index + 1,
            scorer_calls = scorer_calls + %(calls)s,
            scorer_requests = scorer_requests + %(requests)s,
            full_rerank_calls = full_rerank_calls + %(n_candidates)s,
            reused_cells = reused_cells + cardinality(%(reused_ids)s::bigint[]),
            reuse_saved_calls = reuse_saved_calls + %(saved_calls)s,
            score_sum = score_sum + (SELECT coalesce(sum(s), 0) FROM live),
            score_count = score_count + (SELECT count(*) FROM live),
            -- A query that observed nothing (a semantic retrieve, a family's repeat that
            -- reused every cell, a retrieve whose scorer failed) taught the model nothing: a
            -- refit it made due would refit the same observations.
            queries_since_refit = queries_since_refit + (SELECT (count(*) > 0)::int FROM live)
        WHERE name = %(namespace)s
        RETURNING next_query_index - 1 AS query_index, queries_since_refit
    ), q AS (
        INSERT INTO queries (namespace, query_index, text, embedding, policy, candidates,
                             budget, scorer_calls, prequential_abs_error,
                             prequential_count, returned_count, returned_estimated,
                             family_key, reused_memory_ids, stage, timings,
                             trace_memory_ids, trace_similarities, trace_estimates,
                             trace_scores, trace_sources, trace_origins, trace_anchors,
                             trace_anchor_reasons, exploration_share, scorer_rounds)
        SELECT %(namespace)s::text, n.query_index, %(text)s::text, %(embedding)b,
               %(policy)s::text, %(n_candidates)s::int, %(budget)s::int, %(calls)s::int,
               %(prequential_error)s::float8, %(prequential_count)s::int,
               %(returned_count)s::int, %(returned_estimated)s::int,
               %(family_key)s::bytea, %(reused_ids)s::bigint[], %(stage)s::smallint,
               %(timings)s::jsonb, %(trace_memory_ids)s::bigint[],
               %(trace_similarities)b::real[], %(trace_estimates)b::real[],
               %(trace_scores)b::real[], %(trace_sources)s::text[],
               %(trace_origins)s::text[], %(trace_anchors)s::boolean[],
               %(trace_anchor_reasons)s::text[], %(exploration_share)s::real,
               %(scorer_rounds)s::smallint
        FROM n
        RETURNING id, query_index
    ), solved AS (
        -- the query's parameters, when its anchors solved them
        INSERT INTO query_factors (namespace, query_id, bias, slope, factors)
        SELECT %(namespace)s::text, q.id, %(bias)s::float8, %(slope)s::float8,
               %(factors)s::real[]
        FROM q WHERE %(bias)s::float8 IS NOT NULL
    ), located AS (
        -- GET /queries/{id} finds the query's partition here (migration 0017)
        INSERT INTO query_locator (id, namespace) SELECT id, %(namespace)s::text FROM q
    ), s AS (
        -- Stamped with clock_timestamp(), after the namespace lock the statement before took
        -- (not now(), the transaction's start): a refit whose horizon is earlier counts them
        -- as recorded since (model_state.replace_model).
        INSERT INTO scores (query_id, memory_id, namespace, score, similarity, source,
                            anchor_kind, raw_score, scored_by, created_at)
        SELECT q.id, live.m, %(namespace)s::text, live.s, live.c, 'scorer', live.k, live.r,
               %(scored_by)s::text, clock_timestamp()
        FROM q, live
        ON CONFLICT (namespace, query_id, memory_id) DO NOTHING
    )
    SELECT q.id, q.query_index, n.queries_since_refit FROM q, n
""".replace("COMMON_SCORE", common_score_sql("t.r", "current.scale"))

# The lock every writer of a namespace's model state takes on its row (namespace_state).
_LOCK_SQL = STATE_SQL + " FOR NO KEY UPDATE"


async def record_query(
    session: AsyncSession, retrieve: RecordedRetrieve, update: OnlineUpdate | None
) -> RecordedQuery | None:
    """Record a retrieve and its observations, write the online ``update`` of the memory rows
    it observed, and commit: one round trip for all (pipelined), one per statement for a
    record too large to pipeline (:func:`~service.db.statements.pipeline`).

    The namespace row is locked first, so concurrent requests get consecutive indexes and a
    rolled-back request leaves no gap; and in a statement of its own, so the record's snapshot,
    taken once the lock is held, sees every delete of the namespace's memories (a delete takes
    the same lock, :func:`service.ingest.memories.delete_memory`): observations of memories
    deleted since the search are left out, the query is recorded all the same. None, and
    nothing recorded, when ``DELETE /namespaces`` erased the namespace since the search.
    """
    namespace = retrieve.namespace
    statements = [
        (_LOCK_SQL, {"namespace": namespace}),
        (_RECORD_SQL, _record_parameters(retrieve)),
    ]
    if update is not None and len(update.memory_ids):
        statements.append(online_update_statement(namespace, update))
    conn = await driver_connection(session)
    async with pipeline(conn, statements):
        cursors = [await conn.execute(sql, parameters) for sql, parameters in statements]
        await conn.commit()
    row = await cursors[1].fetchone()
    if row is None:
        return None
    query_id, query_index, since_refit = row
    return RecordedQuery(int(query_id), int(query_index), int(since_refit))


def _record_parameters(retrieve: RecordedRetrieve) -> dict[str, Any]:
    """The statement's parameters. Every float bound for a ``real`` column goes through
    :func:`~service.db.codecs.real_values` here: a score such as 1e-50 is a valid relevance, but
    a non-zero float8 that rounds to zero in float32 is an underflow error in Postgres."""
    query, spending, errors = retrieve.query, retrieve.spending, retrieve.prequential_errors
    return {
        "namespace": retrieve.namespace,
        "text": retrieve.text,
        "embedding": np.asarray(retrieve.embedding, dtype=np.float32),
        "policy": retrieve.policy,
        "n_candidates": spending.candidates,
        "budget": spending.budget,
        "calls": spending.scorer_calls,
        "requests": spending.scorer_requests,
        "bias": None if query is None else query.bias,
        "slope": None if query is None else query.slope,
        "factors": None if query is None else as_real(query.factors),
        "prequential_error": float(np.mean(errors)) if len(errors) else None,
        "prequential_count": len(errors),
        "returned_count": retrieve.returned,
        "returned_estimated": retrieve.returned_estimated,
        "memory_ids": array_literal(retrieve.observed.memory_ids),
        "raw_scores": array_literal(real_values(retrieve.observed.raw_scores)),
        "scored_by": retrieve.scored_by,
        "similarities": array_literal(real_values(retrieve.observed.similarities)),
        "anchor_kinds": array_literal(retrieve.observed.anchor_kinds),
        "exploration_share": None
        if retrieve.exploration_share is None
        else float(real_values(np.asarray(retrieve.exploration_share))),
        "family_key": retrieve.family_key,
        "reused_ids": array_literal(retrieve.reused.memory_ids),
        "saved_calls": retrieve.reused.saved_calls,
        **_trace_parameters(retrieve.trace),
    }


def _trace_parameters(trace: QueryTrace) -> dict[str, Any]:
    return {
        "stage": trace.stage,
        "timings": json.dumps(trace.timings),
        # Number arrays as one literal (ids) or in binary (floats, already float32 values, sent
        # as float8 and cast to real by the server): never element by element.
        "trace_memory_ids": array_literal(trace.memory_ids),
        "trace_similarities": Float8Rows.of(real_values(trace.similarities)),
        "trace_estimates": Float8Rows.of(real_values(trace.estimates)),
        "trace_scores": Float8Rows.of(real_values(trace.scores)),
        "trace_sources": list(trace.sources),
        "trace_origins": list(trace.origins),
        "trace_anchors": array_literal(trace.anchors),
        "trace_anchor_reasons": list(trace.anchor_reasons),
        "scorer_rounds": trace.scorer_rounds,
    }
