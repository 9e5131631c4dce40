"""Foundation: namespaces, memories, queries and sparse scores.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from pgvector.sqlalchemy import VECTOR
from sqlalchemy.dialects.postgresql import JSONB

from service.settings import Settings

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _embedding_dim() -> int:
    # The vector column's dimension is fixed per deployment (EARM_EMBEDDING_DIM).
    return int(context.config.attributes.get("embedding_dim") or Settings().embedding_dim)


def upgrade() -> None:
    dim = _embedding_dim()
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.create_table(
        "namespaces",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("next_query_index", sa.BigInteger(), server_default="0", nullable=False),
    )
    op.create_table(
        "memories",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column(
            "namespace",
            sa.Text(),
            sa.ForeignKey("namespaces.name", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("external_id", sa.Text(), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("embedding", VECTOR(dim), nullable=False),
        sa.Column("embedding_model", sa.Text(), nullable=False),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("metadata", JSONB(), server_default="{}", nullable=False),
        sa.UniqueConstraint("namespace", "external_id", name="uq_memories_namespace_external_id"),
    )
    op.create_index("ix_memories_namespace_id", "memories", ["namespace", "id"])
    # m/ef_construction: pgvector defaults are 16/64; 16/128 buys recall at 200+ candidates for
    # a slower build, which ingest amortises.
    op.execute(
        "CREATE INDEX ix_memories_embedding_hnsw ON memories "
        "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 128)"
    )
    op.create_table(
        "queries",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column(
            "namespace",
            sa.Text(),
            sa.ForeignKey("namespaces.name", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("query_index", sa.BigInteger(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("embedding", VECTOR(dim), nullable=False),
        sa.Column("policy", sa.Text(), nullable=False),
        sa.Column("candidates", sa.Integer(), nullable=False),
        sa.Column("budget", sa.Integer(), nullable=False),
        sa.Column("scorer_calls", sa.Integer(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.UniqueConstraint("namespace", "query_index", name="uq_queries_namespace_query_index"),
    )
    op.create_table(
        "scores",
        sa.Column(
            "query_id",
            sa.BigInteger(),
            sa.ForeignKey("queries.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "memory_id",
            sa.BigInteger(),
            sa.ForeignKey("memories.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("score", sa.REAL(), nullable=False),
        # Cosine similarity of query and memory: the completion model's per-cell feature.
        sa.Column("similarity", sa.REAL(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("score >= 0 AND score <= 1", name="ck_scores_score_range"),
        sa.CheckConstraint("source IN ('scorer', 'feedback')", name="ck_scores_source"),
    )
    op.create_index("ix_scores_memory_id", "scores", ["memory_id"])
    op.create_index("ix_scores_namespace", "scores", ["namespace"])


def downgrade() -> None:
    op.drop_table("scores")
    op.drop_table("queries")
    op.drop_table("memories")
    op.drop_table("namespaces")
