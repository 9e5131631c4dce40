"""Content prior: each namespace's learned γ (similarity slope) and w (embedding weights).

Written by every full refit; NULL until the first one (no prior: the model then starts from
calibrated similarity). ``vector`` without a dimension, so the search query can take
``embedding <#> content_weights`` whatever the deployment's embedding size.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from pgvector.sqlalchemy import VECTOR

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("namespaces", sa.Column("content_slope", sa.Double(), nullable=True))
    op.add_column("namespaces", sa.Column("content_weights", VECTOR(), nullable=True))


def downgrade() -> None:
    op.drop_column("namespaces", "content_weights")
    op.drop_column("namespaces", "content_slope")
