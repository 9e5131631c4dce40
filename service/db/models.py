"""SQLAlchemy 2 models: the shape the code expects. Alembic (``migrations/``) owns the schema."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
from pgvector.sqlalchemy import VECTOR
from sqlalchemy import (
    REAL,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    Text,
    UniqueConstraint,
    false,
    func,
)
from sqlalchemy import (
    text as sql_text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Namespace(Base):
    """One agent's memory space, plus the counters the retrieval pipeline keeps for it."""

    __tablename__ = "namespaces"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Next per-namespace query index; incremented under the row lock so indexes stay gap-free.
    next_query_index: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # Running sums that give the completion model's global mean without a table scan.
    score_sum: Mapped[float] = mapped_column(Double, server_default="0")
    score_count: Mapped[int] = mapped_column(BigInteger, server_default="0")
    scorer_calls: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # HTTP requests the scorer made for them (a reranker scores a batch per request).
    scorer_requests: Mapped[int] = mapped_column(BigInteger, server_default="0")
    full_rerank_calls: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # Cells repeated queries took from their family's observations instead of scoring them,
    # and the scorer calls that saved (budget - anchors scored, summed).
    reused_cells: Mapped[int] = mapped_column(BigInteger, server_default="0")
    reuse_saved_calls: Mapped[int] = mapped_column(BigInteger, server_default="0")
    queries_since_refit: Mapped[int] = mapped_column(Integer, server_default="0")
    last_refit_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The completion model's content prior γ·cos + w·e_m, written by each full refit.
    content_slope: Mapped[float | None] = mapped_column(Double)
    content_weights: Mapped[np.ndarray | None] = mapped_column(VECTOR())
    # The completion factors' weight the last refit chose (NULL: not balanced; 0018).
    factor_reg: Mapped[float | None] = mapped_column(Double)
    # Each scorer source's typical irrelevant and relevant score, and how many scores say so:
    # {source: [irrelevant, relevant, scores]} (service.completion.scale).
    score_scales: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default="{}")


def _by_namespace() -> dict[str, Any]:
    """Every table of a namespace's data is hash-partitioned by its namespace (16 partitions,
    migration 0017), and every key of it leads with the namespace."""
    return {"postgresql_partition_by": "HASH (namespace)"}


class Memory(Base):
    __tablename__ = "memories"
    __table_args__ = (
        UniqueConstraint("namespace", "external_id"),
        # Built on the rows the background indexer has marked; the rest are scanned exactly.
        Index(
            "ix_memories_embedding_hnsw", "embedding", postgresql_using="hnsw",
            postgresql_ops={"embedding": "vector_cosine_ops"},
            postgresql_with={"m": 16, "ef_construction": 128}, postgresql_where=sql_text("indexed"),
        ),
        # Ingest's lookup of a text already stored (on_conflict by text).
        Index("ix_memories_namespace_text_md5", "namespace", sql_text("md5(text)"), "id"),
        Index("ix_memories_unindexed", "namespace", "id", postgresql_where=sql_text("NOT indexed")),
        _by_namespace(),
    )

    namespace: Mapped[str] = mapped_column(
        ForeignKey("namespaces.name", ondelete="CASCADE"), primary_key=True
    )
    # Globally unique (one identity sequence for every partition), so an id alone names a
    # memory: memory_locator says which namespace, hence which partition, holds it.
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    external_id: Mapped[str | None] = mapped_column(Text)
    text: Mapped[str] = mapped_column(Text)
    embedding: Mapped[np.ndarray] = mapped_column(VECTOR())
    embedding_model: Mapped[str] = mapped_column(Text)
    occurred_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", JSONB, server_default="{}")
    # In the HNSW index yet (a partial index, WHERE indexed)? New rows are not; the background
    # indexer (service.ingest.indexer) sets it. Unindexed rows are found by an exact scan.
    indexed: Mapped[bool] = mapped_column(Boolean, server_default=false())
    # When the text or embedding last changed (PATCH, ingest with on_conflict "update"); NULL:
    # never. Set under the namespace's lock, read by the refit (model_state.replace_model).
    content_changed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class RerankDocument(Base):
    """A memory the rerank protocol stored for a text it had not seen, and when a call last
    named it (refreshed at most every ``retention.sighting_refresh_s``): what the documents'
    retention rule reads. Memories ingested through ``/memories`` have no row."""

    __tablename__ = "rerank_documents"
    __table_args__ = (
        ForeignKeyConstraint(
            ["namespace", "memory_id"], ["memories.namespace", "memories.id"], ondelete="CASCADE"
        ),
        Index("ix_rerank_documents_last_seen_at", "last_seen_at"),
        _by_namespace(),
    )

    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    memory_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    last_seen_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class Query(Base):
    __tablename__ = "queries"
    __table_args__ = (
        UniqueConstraint("namespace", "query_index"),
        Index(
            "ix_queries_namespace_family_key", "namespace", "family_key",
            postgresql_where=sql_text("family_key IS NOT NULL"),
        ),
        _by_namespace(),
    )

    namespace: Mapped[str] = mapped_column(
        ForeignKey("namespaces.name", ondelete="CASCADE"), primary_key=True
    )
    # Globally unique, as memories.id (query_locator).
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    query_index: Mapped[int] = mapped_column(BigInteger)
    text: Mapped[str] = mapped_column(Text)
    embedding: Mapped[np.ndarray] = mapped_column(VECTOR())
    policy: Mapped[str] = mapped_column(Text)
    candidates: Mapped[int] = mapped_column(Integer)
    budget: Mapped[int] = mapped_column(Integer)
    scorer_calls: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Its completion-model parameters are a QueryFactor row (none until solved).
    # Mean |prediction - observed| over this query's anchors that had history, each predicted
    # before it was folded in (leave-one-out); NULL when no anchor had history.
    prequential_abs_error: Mapped[float | None] = mapped_column(Double)
    prequential_count: Mapped[int] = mapped_column(Integer, server_default="0")
    returned_count: Mapped[int] = mapped_column(Integer, server_default="0")
    returned_estimated: Mapped[int] = mapped_column(Integer, server_default="0")
    # What was asked (service.retrieve.reuse.family_key; NULL for queries recorded before
    # families existed): a repeat of the namespace's family reuses its observations.
    family_key: Mapped[bytes | None] = mapped_column(LargeBinary)
    # The candidates this query took from its family's observations instead of scoring them.
    reused_memory_ids: Mapped[list[int]] = mapped_column(ARRAY(BigInteger), server_default="{}")
    # The query's trace (service/db/traces.py; NULL for queries recorded before 0012): its
    # budget stage, phase timings, and its candidates in rank order, one array element each.
    stage: Mapped[int | None] = mapped_column(SmallInteger)
    timings: Mapped[dict[str, float] | None] = mapped_column(JSONB)
    trace_memory_ids: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    trace_similarities: Mapped[list[float] | None] = mapped_column(ARRAY(REAL))
    trace_estimates: Mapped[list[float] | None] = mapped_column(ARRAY(REAL))
    trace_scores: Mapped[list[float] | None] = mapped_column(ARRAY(REAL))
    trace_sources: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    trace_origins: Mapped[list[str | None] | None] = mapped_column(ARRAY(Text))
    trace_anchors: Mapped[list[bool] | None] = mapped_column(ARRAY(Boolean))
    # Why each traced anchor was scored ("head", "estimate", "explore"; NULL: not an anchor),
    # and the exploring share the anchor rule used (NULL: no rule ran; both NULL before 0014).
    trace_anchor_reasons: Mapped[list[str | None] | None] = mapped_column(ARRAY(Text))
    exploration_share: Mapped[float | None] = mapped_column(REAL)
    scorer_rounds: Mapped[int | None] = mapped_column(SmallInteger)


class QueryFactor(Base):
    """Query-side parameters of the completion model, solved from the query's anchors (no row
    until then), replaced by each full refit. A narrow row of their own: a refit rewrites
    every one under the namespace's lock, and a ``queries`` row (embedding in line, trace) is
    ten times wider (migration 0022)."""

    __tablename__ = "query_factors"
    __table_args__ = (
        ForeignKeyConstraint(
            ["namespace", "query_id"], ["queries.namespace", "queries.id"], ondelete="CASCADE"
        ),
        _by_namespace(),
    )

    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    query_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    bias: Mapped[float] = mapped_column(Double)
    slope: Mapped[float] = mapped_column(Double)
    factors: Mapped[list[float]] = mapped_column(ARRAY(REAL))


class Score(Base):
    """One cell of the experience matrix: its current, effective observation. Feedback replaces
    it (the previous value goes to ``score_history``); an edit of the memory retires it."""

    __tablename__ = "scores"
    __table_args__ = (
        ForeignKeyConstraint(
            ["namespace", "query_id"], ["queries.namespace", "queries.id"], ondelete="CASCADE"
        ),
        ForeignKeyConstraint(
            ["namespace", "memory_id"], ["memories.namespace", "memories.id"], ondelete="CASCADE"
        ),
        Index("ix_scores_namespace_memory_id", "namespace", "memory_id"),
        # What a refit's write reads under the lock: the scores recorded since its horizon.
        Index("ix_scores_namespace_created_at", "namespace", "created_at"),
        _by_namespace(),
    )

    query_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    memory_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    score: Mapped[float] = mapped_column(REAL)  # on the namespace's common scale
    similarity: Mapped[float] = mapped_column(REAL)
    source: Mapped[str] = mapped_column(Text)
    # Who scored it ("<backend>:<model>", or "feedback") and the score as it gave it; NULL on
    # rows recorded before sources were (score kept as it was).
    scored_by: Mapped[str | None] = mapped_column(Text)
    raw_score: Mapped[float | None] = mapped_column(REAL)
    # Which part of the anchor rule chose the pair (service.retrieve.anchors: HEAD, EXPLOIT,
    # MARGINAL, EXPLORE); NULL for client feedback and rows recorded before 0014.
    anchor_kind: Mapped[int | None] = mapped_column(SmallInteger)
    # The service stamps clock_timestamp(), taken after the namespace's lock: a refit finds the
    # scores recorded since its horizon by it (model_state.replace_model).
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Set when the memory's text or embedding changed since: the cell judged the old content,
    # so nothing learns from it or counts it.
    retired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ScoreHistory(Base):
    """A value a cell held before feedback replaced it."""

    __tablename__ = "score_history"
    __table_args__ = (
        ForeignKeyConstraint(
            ["namespace", "query_id"], ["queries.namespace", "queries.id"], ondelete="CASCADE"
        ),
        ForeignKeyConstraint(
            ["namespace", "memory_id"], ["memories.namespace", "memories.id"], ondelete="CASCADE"
        ),
        Index(
            "ix_score_history_namespace_query_id_memory_id", "namespace", "query_id", "memory_id"
        ),
        Index("ix_score_history_namespace_memory_id", "namespace", "memory_id"),
        _by_namespace(),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    query_id: Mapped[int] = mapped_column(BigInteger)
    memory_id: Mapped[int] = mapped_column(BigInteger)
    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    score: Mapped[float] = mapped_column(REAL)
    source: Mapped[str] = mapped_column(Text)
    scored_by: Mapped[str | None] = mapped_column(Text)
    raw_score: Mapped[float | None] = mapped_column(REAL)
    observed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    retired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    replaced_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class MemoryFactor(Base):
    """Memory-side parameters of the completion model (only for memories with history)."""

    __tablename__ = "memory_factors"
    __table_args__ = (
        ForeignKeyConstraint(
            ["namespace", "memory_id"], ["memories.namespace", "memories.id"], ondelete="CASCADE"
        ),
        _by_namespace(),
    )

    memory_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    bias: Mapped[float] = mapped_column(Double)
    factors: Mapped[list[float]] = mapped_column(ARRAY(REAL))
    observation_count: Mapped[int] = mapped_column(Integer)
    # The row's packed sufficient statistics (service/completion/statistics.py) given the query
    # side; NULL: to be rebuilt from the memory's live observations when next observed.
    statistics: Mapped[list[float] | None] = mapped_column(ARRAY(Double))


class _Locator:
    """Which namespace holds an id of ``_located``: how a route that names an id and no
    namespace finds the one partition to read."""

    _located: str

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    namespace: Mapped[str] = mapped_column(Text)

    @declared_attr.directive
    def __table_args__(cls) -> tuple[ForeignKeyConstraint]:
        return (ForeignKeyConstraint(
            ["namespace", "id"], [f"{cls._located}.namespace", f"{cls._located}.id"],
            ondelete="CASCADE",
        ),)


class MemoryLocator(_Locator, Base):
    """Written in the statement that inserts the memory; deleted with it (explicitly, and by
    the foreign key's cascade)."""

    __tablename__ = "memory_locator"
    _located = "memories"


class QueryLocator(_Locator, Base):
    """``GET /queries/{id}``'s way to its query, as :class:`MemoryLocator`."""

    __tablename__ = "query_locator"
    _located = "queries"


class ApiKey(Base):
    """A bearer key scoped to namespace patterns; only its sha256 is stored (service/auth.py)."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(Text)
    key_hash: Mapped[str] = mapped_column(Text, unique=True)
    namespace_patterns: Mapped[list[str]] = mapped_column(ARRAY(Text))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AuthSettings(Base):
    """The authentication mode, one row (none: key enforcement was never turned on)."""

    __tablename__ = "auth_settings"

    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True, server_default="1")
    key_enforcement: Mapped[bool] = mapped_column(Boolean)
    changed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
