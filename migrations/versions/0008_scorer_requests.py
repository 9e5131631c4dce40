"""Scorer requests per namespace: the HTTP requests the scorer made, next to the pairs it scored.

``scorer_calls`` stays the paper's unit (one per (query, memory) pair scored); a reranker scores
a whole batch of pairs per HTTP request, so what a provider bills or rate-limits is counted
apart. Namespaces recorded before this revision start from 0.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "namespaces",
        sa.Column("scorer_requests", sa.BigInteger(), server_default="0", nullable=False),
    )


def downgrade() -> None:
    op.drop_column("namespaces", "scorer_requests")
