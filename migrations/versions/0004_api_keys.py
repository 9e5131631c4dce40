"""API keys: hashed bearer tokens, each scoped to namespace patterns.

Revision ID: 0004
Revises: 0002
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision: str = "0004"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("name", sa.Text(), nullable=False),
        # sha256 hex of the key; the key itself is never stored.
        sa.Column("key_hash", sa.Text(), nullable=False),
        # fnmatch-style globs over namespace names; '*' alone makes an admin key.
        sa.Column("namespace_patterns", ARRAY(sa.Text()), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
        sa.CheckConstraint(
            "cardinality(namespace_patterns) >= 1", name="ck_api_keys_has_patterns"
        ),
    )


def downgrade() -> None:
    op.drop_table("api_keys")
