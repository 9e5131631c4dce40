"""Query traces: what ``GET /queries/{id}`` and the dashboard show of one retrieve.

Every retrieve writes, on its own ``queries`` row (the same INSERT as before, so no extra round
trip), its budget stage, the phase timings known when it is recorded, and its candidates in rank
order (best first, so a candidate's rank is its position + 1): memory id, similarity to the
query, the completion model's estimate when it ranked (what it ranked by, for an unobserved
candidate), the final score, the score's source, the observation's origin (NULL when not
observed) and which candidates were anchors. Queries recorded before this revision have none
(NULL): their trace lists no candidates.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    ("stage", sa.SmallInteger()),
    ("timings", postgresql.JSONB()),
    ("trace_memory_ids", postgresql.ARRAY(sa.BigInteger())),
    ("trace_similarities", postgresql.ARRAY(sa.REAL())),
    ("trace_estimates", postgresql.ARRAY(sa.REAL())),
    ("trace_scores", postgresql.ARRAY(sa.REAL())),
    ("trace_sources", postgresql.ARRAY(sa.Text())),
    ("trace_origins", postgresql.ARRAY(sa.Text())),
    ("trace_anchors", postgresql.ARRAY(sa.Boolean())),
)


def upgrade() -> None:
    for name, type_ in _COLUMNS:
        op.add_column("queries", sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    for name, _ in reversed(_COLUMNS):
        op.drop_column("queries", name)
