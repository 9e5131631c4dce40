"""Each recorded query keeps the scorer rounds its anchors went out in (``scorer_rounds``, as
the retrieve response said): the query trace shows it. NULL: recorded before it was kept.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A nullable column: a catalogue change, no rewrite of the table.
    op.add_column("queries", sa.Column("scorer_rounds", sa.SmallInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("queries", "scorer_rounds")
