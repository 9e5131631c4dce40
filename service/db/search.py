"""The semantic search: a namespace's top candidates with their completion-model parameters,
and the embeddings of some memories.

The hot path the package's SQL style is chosen for: the statements are pipelined into one round
trip with the namespace read and the COMMIT, and vectors travel in pgvector's binary format
(docs/performance.md has the numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from psycopg.types.json import Jsonb
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.candidate_sql import (
    CANDIDATES_SQL,
    EXACT_CANDIDATES_SQL,
    GIVEN_CANDIDATES_SQL,
    search_settings,
)
from service.db.codecs import cosine_similarities, factor_matrix
from service.db.engine import driver_connection
from service.db.namespaces import STATE_SQL, NamespaceState, state_from_row
from service.db.statements import pipeline


@dataclass(frozen=True)
class Candidates:
    """The candidates of one query as parallel arrays, most similar first.

    Embeddings are not fetched here: only a scorer that reads them needs them, and only for the
    anchors (:func:`memory_embeddings`).
    """

    namespace: str  # whose memories they are
    ids: np.ndarray  # int64 (n,)
    similarities: np.ndarray  # float64 (n,) cosine similarity
    memory_bias: np.ndarray  # float64 (n,), 0 where the memory has no history
    memory_factors: np.ndarray  # float64 (n, rank), 0 where the memory has no history
    observation_count: np.ndarray  # int64 (n,)
    content_scores: np.ndarray  # float64 (n,) e_m·w of the namespace's content prior, or 0
    # id, external_id, text, occurred_at, metadata_json (the metadata as JSON text: only the
    # returned top-k parse it)
    rows: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class PastObservations:
    """What earlier queries observed that a new one may use: its family's cells (each memory
    once, with its latest score) and the cells of its nearest other queries (paraphrase
    transfer; one entry per observation, with the observing query's cosine to this one)."""

    family_ids: np.ndarray  # int64
    family_scores: np.ndarray  # float64
    neighbour_ids: np.ndarray  # int64
    neighbour_similarities: np.ndarray  # float64
    neighbour_scores: np.ndarray  # float64
    recent_anchors: RecentAnchors


@dataclass(frozen=True)
class RecentAnchors:
    """Anchors of the namespace's latest queries (``AnchorWindow``), one entry per observed
    pair: the query's index, the anchor's kind (``scores.anchor_kind``), memory and score."""

    query_index: np.ndarray  # int64
    kind: np.ndarray  # int8
    memory_ids: np.ndarray  # int64
    scores: np.ndarray  # float64


@dataclass(frozen=True)
class AnchorWindow:
    """Which recent anchors to read: those of the namespace's latest ``queries`` queries whose
    kind is one of ``kinds`` or whose score is at least ``min_score``."""

    queries: int
    kinds: tuple[int, ...]
    min_score: float


@dataclass(frozen=True)
class NeighbourSearch:
    """Which earlier queries count as neighbours: the ``limit`` nearest by cosine, of those at
    least ``min_similarity`` to the new one, among the namespace's latest ``window`` queries."""

    min_similarity: float
    limit: int
    window: int


_NONE = np.zeros(0)
_NO_IDS = np.zeros(0, dtype=np.int64)
NO_RECENT_ANCHORS = RecentAnchors(_NO_IDS, np.zeros(0, dtype=np.int8), _NO_IDS, _NONE)
NOTHING_PAST = PastObservations(_NO_IDS, _NONE, _NO_IDS, _NONE, _NONE, NO_RECENT_ANCHORS)

# Through ix_queries_namespace_family_key, then the scores primary key per query. Of two
# observations of one memory (concurrent askings, reuse switched off) the client's feedback
# wins, being authoritative, then the latest. Cells retired by an edit of their memory judged
# its old content: never reused.
_FAMILY_SQL = """
    SELECT DISTINCT ON (s.memory_id) s.memory_id, s.score
    FROM queries q JOIN scores s ON s.namespace = q.namespace AND s.query_id = q.id
    WHERE q.namespace = %(namespace)s AND q.family_key = %(family)s
      AND s.retired_at IS NULL AND (s.source = 'feedback' OR NOT %(feedback_only)s)
    ORDER BY s.memory_id, s.source = 'feedback' DESC, s.created_at DESC, s.query_id DESC
"""

# An exact scan of the namespace's latest queries (backwards along
# uq_queries_namespace_query_index): one cosine per query of the window, so its cost is bounded
# however long the namespace's history grows.
_NEIGHBOUR_SQL = """
    WITH recent AS (
        SELECT id, embedding, family_key FROM queries WHERE namespace = %(namespace)s
        ORDER BY query_index DESC LIMIT %(window)s
    ), nb AS MATERIALIZED (
        SELECT id, 1 - (embedding <=> %(query)b) AS similarity FROM recent
        WHERE family_key IS DISTINCT FROM %(family)s::bytea
        ORDER BY embedding <=> %(query)b LIMIT %(neighbours)s
    )
    SELECT s.memory_id, nb.similarity, s.score FROM nb JOIN scores s ON s.query_id = nb.id
    WHERE s.namespace = %(namespace)s AND nb.similarity >= %(min_similarity)s
      AND s.retired_at IS NULL
"""


# Backwards along uq_queries_namespace_query_index from the next index, then the scores primary
# key per query: bounded by the window, however long the namespace's history grows. The window's
# query ids go to the scores as an array, not as a join: as a join, the planner estimated the
# anchors rare (bulk observations carry no anchor kind) and scanned every score of the table
# (9.6 ms at 52,000 scores against 4.9 ms so, and growing with them). Retired cells judged
# content that has changed since.
_RECENT_ANCHORS_SQL = """
    SELECT q.query_index, s.anchor_kind, s.memory_id, s.score
    FROM scores s JOIN queries q ON q.namespace = s.namespace AND q.id = s.query_id
    WHERE s.namespace = %(namespace)s AND s.query_id = ANY(ARRAY(
            SELECT id FROM queries
            WHERE namespace = %(namespace)s
              AND query_index >= (SELECT next_query_index FROM namespaces
                                  WHERE name = %(namespace)s) - %(anchor_queries)s))
      AND s.anchor_kind IS NOT NULL AND s.retired_at IS NULL
      AND (s.anchor_kind = ANY(%(anchor_kinds)s::smallint[]) OR s.score >= %(anchor_min_score)s)
"""


@dataclass(frozen=True)
class CandidateSearch:
    """What the search of one query asks for: the namespace's top-``limit`` memories by cosine
    to ``embedding`` (their model rows of ``rank``) among those whose metadata contain
    ``filters``; the observations of the query's family (given a ``family_key``; only its
    feedback with ``family_feedback_only``) and of its nearest other queries (given
    ``neighbours``); and the anchors of its latest queries (given ``anchors``). With
    ``memory_ids``, those memories are the candidates, in that order."""

    namespace: str
    embedding: np.ndarray
    limit: int
    rank: int
    filters: dict[str, Any] | None = None
    family_key: bytes | None = None
    neighbours: NeighbourSearch | None = None
    family_feedback_only: bool = False
    anchors: AnchorWindow | None = None
    # The candidates themselves, in their semantic order, instead of a search (``limit`` and
    # ``filters`` then unused).
    memory_ids: Sequence[int] | None = None
    # A namespace with fewer memories is scanned exactly instead of through the shared HNSW
    # index (EARM_EXACT_SCAN_BELOW, or _FILTERED for a filtered search); 0: the index first.
    exact_below: int = 20_000


async def search(
    session: AsyncSession, query: CandidateSearch
) -> tuple[NamespaceState, Candidates, PastObservations]:
    """The namespace's counters, the query's candidates with their completion-model
    parameters, and what earlier queries observed of them, in one round trip: the settings,
    the reads and the COMMIT that ends this read-only transaction are pipelined. (The
    session's own commit is then a no-op: psycopg skips COMMIT on an idle connection.)

    A namespace of fewer than ``exact_below`` memories is scanned exactly, in the same
    statement (``service.db.candidate_sql``). A larger one goes through the HNSW index, which
    yields at most ``hnsw.ef_search`` rows, and a namespace filter can leave fewer, so
    ef_search is raised to ``limit`` and iterative scanning is enabled for this transaction;
    if the index still yields too few (or the namespace has fewer indexed memories than
    ``limit``), an exact scan of the namespace answers. Given ``memory_ids``, no search: those
    are the candidates, indexed or not.
    """
    conn = await driver_connection(session)
    params = _search_parameters(query)
    filtered = query.filters is not None
    # Up to eight statements, each sent with (at most) every parameter.
    async with pipeline(conn, [("", params)] * 8):
        state_cursor = await conn.execute(STATE_SQL, params)
        family_cursor = (
            await conn.execute(_FAMILY_SQL, params) if query.family_key is not None else None
        )
        neighbour_cursor = (
            await conn.execute(_NEIGHBOUR_SQL, params) if query.neighbours is not None else None
        )
        anchor_cursor = (
            await conn.execute(_RECENT_ANCHORS_SQL, params) if query.anchors is not None else None
        )
        if query.memory_ids is not None:
            candidates_cursor = await conn.execute(GIVEN_CANDIDATES_SQL, params)
        else:
            for setting in search_settings(params["ef"]):
                await conn.execute(setting)
            candidates_cursor = await conn.execute(CANDIDATES_SQL[filtered], params)
        await conn.commit()
    state = state_from_row(await state_cursor.fetchone(), query.namespace)
    past = _past(
        await family_cursor.fetchall() if family_cursor is not None else [],
        await neighbour_cursor.fetchall() if neighbour_cursor is not None else [],
        await anchor_cursor.fetchall() if anchor_cursor is not None else [],
    )
    rows = await candidates_cursor.fetchall()
    # row[7]: complete, false when the index may have missed some
    if query.memory_ids is None and (not rows or not rows[0][7]):
        async with pipeline(conn, [("", params)]):
            exact_cursor = await conn.execute(EXACT_CANDIDATES_SQL[filtered], params)
            await conn.commit()
        rows = await exact_cursor.fetchall()
    return state, _candidates(query.namespace, rows, query.rank), past


def _search_parameters(query: CandidateSearch) -> dict[str, Any]:
    neighbours = query.neighbours
    params: dict[str, Any] = {
        "namespace": query.namespace,
        "query": np.asarray(query.embedding, dtype=np.float32),
        "limit": query.limit,
        "exact_below": query.exact_below,
        "ef": min(1000, max(40, query.limit)),
        "family": query.family_key,
        "feedback_only": query.family_feedback_only,
        "neighbours": neighbours.limit if neighbours else 0,
        "min_similarity": neighbours.min_similarity if neighbours else 1.0,
        "window": neighbours.window if neighbours else 0,
    }
    if query.anchors is not None:
        params["anchor_queries"] = query.anchors.queries
        params["anchor_kinds"] = list(query.anchors.kinds)
        params["anchor_min_score"] = query.anchors.min_score
    if query.filters is not None:
        params["filters"] = Jsonb(query.filters)
    if query.memory_ids is not None:
        params["ids"] = [int(m) for m in query.memory_ids]
    return params


def _past(
    family: Sequence[Sequence[Any]],
    neighbours: Sequence[Sequence[Any]],
    anchors: Sequence[Sequence[Any]],
) -> PastObservations:
    if not family and not neighbours and not anchors:
        return NOTHING_PAST
    return PastObservations(
        np.array([r[0] for r in family], dtype=np.int64),
        np.array([r[1] for r in family], dtype=np.float64),
        np.array([r[0] for r in neighbours], dtype=np.int64),
        np.array([r[1] for r in neighbours], dtype=np.float64),
        np.array([r[2] for r in neighbours], dtype=np.float64),
        RecentAnchors(
            np.array([r[0] for r in anchors], dtype=np.int64),
            np.array([r[1] for r in anchors], dtype=np.int8),
            np.array([r[2] for r in anchors], dtype=np.int64),
            np.array([r[3] for r in anchors], dtype=np.float64),
        ),
    )


def _candidates(namespace: str, rows: Sequence[Sequence[Any]], rank: int) -> Candidates:
    # Row layout: id, external_id, text, occurred_at, metadata_json, distance, content_score,
    # complete, bias, factors, observation_count.
    return Candidates(
        namespace=namespace,
        ids=np.array([r[0] for r in rows], dtype=np.int64),
        similarities=cosine_similarities([r[5] for r in rows]),
        memory_bias=np.array([r[8] or 0.0 for r in rows], dtype=np.float64),
        memory_factors=factor_matrix([r[9] for r in rows], rank),
        observation_count=np.array([r[10] or 0 for r in rows], dtype=np.int64),
        content_scores=np.array([r[6] for r in rows], dtype=np.float64),
        rows=[
            {
                "id": r[0],
                "external_id": r[1],
                "text": r[2],
                "occurred_at": r[3],
                "metadata_json": r[4],
            }
            for r in rows
        ],
    )


_EMBEDDINGS_SQL = (
    "SELECT m.embedding FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS t(id, ord) "
    "LEFT JOIN memories m ON m.namespace = %(namespace)s AND m.id = t.id ORDER BY t.ord"
)


async def memory_embeddings(
    session: AsyncSession,
    namespace: str,
    memory_ids: np.ndarray,
    dim: int,
    commit: bool = True,
) -> np.ndarray:
    """Embeddings of the namespace's memories (float32, in the order of ``memory_ids``),
    fetched in binary format, in a read-only transaction of their own (committed in the same
    round trip); with ``commit=False``, in the session's transaction, which stays open."""
    if len(memory_ids) == 0:
        return np.zeros((0, dim), dtype=np.float32)
    conn = await driver_connection(session)
    parameters = {"namespace": namespace, "ids": [int(m) for m in memory_ids]}
    async with pipeline(conn, [(_EMBEDDINGS_SQL, parameters)]):
        cursor = await conn.execute(_EMBEDDINGS_SQL, parameters, binary=True)
        if commit:
            await conn.commit()
    embeddings = np.zeros((len(memory_ids), dim), dtype=np.float32)
    for i, (vector,) in enumerate(await cursor.fetchall()):
        if vector is not None:  # None: deleted since the search, by a concurrent request
            embeddings[i] = vector.to_numpy()
    return embeddings
