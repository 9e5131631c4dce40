"""The scores a namespace recorded since a time, by index (``ix_scores_namespace_created_at``):
a refit's write reads those recorded since its horizon, under the namespace's lock, instead of
counting every live observation (service/db/model_state.py). The service stamps every score it
writes with ``clock_timestamp()``, taken after the namespace's lock; rows stored before keep
their stamps (the transaction's start), all of them older than any refit to come.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # On the partitioned table: one index per partition, built by this statement.
    op.create_index("ix_scores_namespace_created_at", "scores", ["namespace", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_scores_namespace_created_at", table_name="scores")
