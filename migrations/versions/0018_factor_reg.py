"""The weight of a namespace's completion factors, chosen by each full refit from the namespace's
own causal error (``service.completion.strength``). NULL: the factors are weighted as the memory
bias is (the model every namespace had before; they shrink to nothing), until a refit chooses.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A nullable column without a default: a catalogue change, no rewrite of the table.
    op.add_column("namespaces", sa.Column("factor_reg", sa.Double(), nullable=True))


def downgrade() -> None:
    op.drop_column("namespaces", "factor_reg")
