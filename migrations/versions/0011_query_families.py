"""Query families: a repeated query reuses the observations of its earlier askings.

``queries.family_key`` identifies what was asked (a digest of the normalised text, or of the
client's query vector; service/retrieve/reuse.py), indexed with the namespace so a retrieve
finds its family's observations in the same round trip as its search. ``reused_memory_ids``
keeps which candidates a query took from its family instead of scoring them (the trace shows
them as "reused"); the namespace counts those cells and the scorer calls they saved.

Queries recorded before this revision have no family key: they are never reused.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("queries", sa.Column("family_key", sa.LargeBinary(), nullable=True))
    op.add_column(
        "queries",
        sa.Column(
            "reused_memory_ids",
            postgresql.ARRAY(sa.BigInteger()),
            server_default="{}",
            nullable=False,
        ),
    )
    op.create_index(
        "ix_queries_namespace_family_key",
        "queries",
        ["namespace", "family_key"],
        postgresql_where=sa.text("family_key IS NOT NULL"),
    )
    for column in ("reused_cells", "reuse_saved_calls"):
        op.add_column(
            "namespaces", sa.Column(column, sa.BigInteger(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    for column in ("reuse_saved_calls", "reused_cells"):
        op.drop_column("namespaces", column)
    op.drop_index("ix_queries_namespace_family_key", table_name="queries")
    op.drop_column("queries", "reused_memory_ids")
    op.drop_column("queries", "family_key")
