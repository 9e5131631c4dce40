"""Anchor kinds: why each anchor was scored, and the exploring share a retrieve used.

``scores.anchor_kind`` says which part of the anchor rule chose a pair the scorer observed for
its query: 0 the head (most similar first), 1 the upper and 2 the lower half of the picks by
estimate, 3 an exploring pick (``service.retrieve.anchors``). The rule learns each namespace's
exploring share from the kinds and scores of its recent queries' anchors. NULL: not an anchor
of the rule (client feedback, or recorded before this revision; such rows teach the share
nothing). ``queries.exploration_share`` is the share the retrieve explored with, and
``queries.trace_anchor_reasons`` the reason of each traced candidate that was an anchor
(``head``, ``estimate``, ``explore``; NULL otherwise), with the other trace arrays.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("scores", sa.Column("anchor_kind", sa.SmallInteger(), nullable=True))
    op.add_column("queries", sa.Column("exploration_share", sa.REAL(), nullable=True))
    op.add_column(
        "queries", sa.Column("trace_anchor_reasons", postgresql.ARRAY(sa.Text()), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("queries", "trace_anchor_reasons")
    op.drop_column("queries", "exploration_share")
    op.drop_column("scores", "anchor_kind")
