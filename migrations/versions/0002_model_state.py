"""Completion model state: memory- and query-side parameters, per-namespace mean and counters.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for name, type_ in (
        ("score_sum", sa.Double()),
        ("score_count", sa.BigInteger()),
        ("scorer_calls", sa.BigInteger()),
        ("full_rerank_calls", sa.BigInteger()),
        ("queries_since_refit", sa.Integer()),
    ):
        op.add_column("namespaces", sa.Column(name, type_, server_default="0", nullable=False))
    op.add_column("namespaces", sa.Column("last_refit_at", sa.DateTime(timezone=True)))
    op.add_column("queries", sa.Column("bias", sa.Double(), nullable=True))
    op.add_column("queries", sa.Column("slope", sa.Double(), nullable=True))
    op.add_column("queries", sa.Column("factors", ARRAY(sa.REAL()), nullable=True))
    # Per-query quality and mix, so /stats and /metrics read a few recent rows, not the matrix.
    op.add_column("queries", sa.Column("prequential_abs_error", sa.Double(), nullable=True))
    op.add_column(
        "queries", sa.Column("prequential_count", sa.Integer(), server_default="0", nullable=False)
    )
    op.add_column(
        "queries", sa.Column("returned_count", sa.Integer(), server_default="0", nullable=False)
    )
    op.add_column(
        "queries", sa.Column("returned_estimated", sa.Integer(), server_default="0", nullable=False)
    )
    op.create_table(
        "memory_factors",
        sa.Column(
            "memory_id",
            sa.BigInteger(),
            sa.ForeignKey("memories.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("bias", sa.Double(), nullable=False),
        sa.Column("factors", ARRAY(sa.REAL()), nullable=False),
        sa.Column("observation_count", sa.Integer(), nullable=False),
    )
    op.create_index("ix_memory_factors_namespace", "memory_factors", ["namespace"])


def downgrade() -> None:
    op.drop_table("memory_factors")
    for name in (
        "returned_estimated", "returned_count", "prequential_count", "prequential_abs_error"
    ):
        op.drop_column("queries", name)
    op.drop_column("queries", "factors")
    op.drop_column("queries", "slope")
    op.drop_column("queries", "bias")
    for name in (
        "last_refit_at",
        "queries_since_refit",
        "full_rerank_calls",
        "scorer_calls",
        "score_count",
        "score_sum",
    ):
        op.drop_column("namespaces", name)
