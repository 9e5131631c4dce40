"""When a rerank call last named each memory the rerank protocol created: what its retention rule
(``EARM_RERANK_DOCUMENT_TTL_S``, docs/api.md "Rerank protocol") reads.

A row marks a memory as one the protocol stored for a document it had not seen; memories
ingested through ``/memories`` have none and never expire. The time lives beside the memory, not
on it: refreshing a column of ``memories`` would rewrite the memory's whole row (its vector
inline) and, as a non-HOT update, insert it again into every index of the table, the HNSW one
included. ``ix_rerank_documents_last_seen_at`` lets the sweep find the expired rows without a
scan of the table.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rerank_documents",
        sa.Column(
            "memory_id",
            sa.BigInteger(),
            sa.ForeignKey("memories.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "last_seen_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
    )
    op.create_index("ix_rerank_documents_last_seen_at", "rerank_documents", ["last_seen_at"])


def downgrade() -> None:
    op.drop_table("rerank_documents")
