"""One score scale: every observation records the source that scored it (``scored_by``: the
scorer's backend and model, or ``feedback``) and the score as that source gave it
(``raw_score``); ``score`` holds it on the namespace's common scale, each source's map to it
fitted by the refits into ``namespaces.score_scales`` (``service.completion.scale``). NULL in
both: recorded before sources were, ``score`` kept as it was.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Nullable columns, and a constant default: catalogue changes, no rewrite of the tables.
    for table in ("scores", "score_history"):
        op.add_column(table, sa.Column("raw_score", sa.REAL(), nullable=True))
        op.add_column(table, sa.Column("scored_by", sa.Text(), nullable=True))
    op.add_column(
        "namespaces",
        sa.Column("score_scales", JSONB(), server_default="{}", nullable=False),
    )


def downgrade() -> None:
    op.drop_column("namespaces", "score_scales")
    for table in ("score_history", "scores"):
        op.drop_column(table, "scored_by")
        op.drop_column(table, "raw_score")
