"""Corrections and memory lifecycle: retired observations and the history of replaced ones.

- ``scores.retired_at``: set when the memory's text or embedding changed after the cell was
  observed. The cell judged the old content, so learning and counting skip it; the row stays
  (one row per (query, memory)) so feedback on the pair later replaces it like any other.
- ``score_history``: every value a cell held before feedback replaced it (the cell's current,
  effective value stays in ``scores``), so a correction never loses what was observed before.
- ``memories.content_changed_at``: when the text or embedding last changed (set under the
  namespace's lock), so a full refit that read the observations before that does not write the
  memory's row back from the retired ones.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("scores", sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "memories", sa.Column("content_changed_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_table(
        "score_history",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column(
            "query_id",
            sa.BigInteger(),
            sa.ForeignKey("queries.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "memory_id",
            sa.BigInteger(),
            sa.ForeignKey("memories.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("score", sa.REAL(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        # When the replaced value was observed, whether it was retired by then, and when
        # feedback replaced it.
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "replaced_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )
    op.create_index(
        "ix_score_history_query_id_memory_id", "score_history", ["query_id", "memory_id"]
    )
    op.create_index("ix_score_history_memory_id", "score_history", ["memory_id"])
    op.create_index("ix_score_history_namespace", "score_history", ["namespace"])


def downgrade() -> None:
    op.drop_table("score_history")
    op.drop_column("memories", "content_changed_at")
    op.drop_column("scores", "retired_at")
