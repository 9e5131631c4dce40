"""Key enforcement as an explicit, persistent mode: revoking every key no longer reopens access.

Until now a deployment required keys exactly while at least one unrevoked key existed, so
revoking the last one silently switched it back to anonymous access. ``auth_settings`` holds the
mode instead (one row; none: enforcement was never turned on): the first key created turns it
on, and only ``earm keys enforcement off`` turns it off (service/auth.py).

A deployment that has created keys, revoked or not, starts with enforcement on.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "auth_settings",
        # Always 1: the table holds at most one row.
        sa.Column("id", sa.SmallInteger(), primary_key=True, server_default="1"),
        sa.Column("key_enforcement", sa.Boolean(), nullable=False),
        sa.Column(
            "changed_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("id = 1", name="ck_auth_settings_one_row"),
    )
    op.execute(
        "INSERT INTO auth_settings (key_enforcement) "
        "SELECT true WHERE EXISTS (SELECT 1 FROM api_keys)"
    )


def downgrade() -> None:
    op.drop_table("auth_settings")
