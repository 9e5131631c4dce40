"""Per-memory sufficient statistics of the online re-solve, so it costs the same however long a
memory's history grows.

``memory_factors.statistics`` holds the packed normal equations of the memory's row given the
query side (service/completion/statistics.py): the online update adds each new observation's
terms instead of reading the memory's whole history. NULL (rows written before this revision,
or invalidated) means "rebuild from the live observations", which the next retrieve that
observes the memory does.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "memory_factors",
        sa.Column("statistics", postgresql.ARRAY(sa.Double()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("memory_factors", "statistics")
