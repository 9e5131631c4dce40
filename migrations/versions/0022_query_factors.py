"""A query's parameters (bias, slope, factors) move from its ``queries`` row to a narrow row of
their own, ``query_factors`` (NULL parameters: no row).

A full refit rewrites every query's parameters under the namespace's lock. In ``queries`` each
one rewrote the whole row, its embedding kept in line (1,540 bytes at 384 dimensions, 0013)
with it: 0.9 s of the lock's hold at a million observations (28,571 queries; docs/perf/
refit_lock.py). A ``query_factors`` row is a tenth of that.

Partitioned by the namespace like every table of a namespace's data (0017), with as many
partitions as ``scores`` has; keyed (namespace, query_id), deleted with its query.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PARTITIONS_SQL = (
    "SELECT count(*) FROM pg_inherits WHERE inhparent = 'scores'::regclass"
)


def upgrade() -> None:
    op.execute(
        "CREATE TABLE query_factors (namespace text NOT NULL, query_id bigint NOT NULL, "
        "bias float8 NOT NULL, slope float8 NOT NULL, factors real[] NOT NULL, "
        "CONSTRAINT pk_query_factors PRIMARY KEY (namespace, query_id), "
        "CONSTRAINT fk_query_factors_query_id_queries FOREIGN KEY (namespace, query_id) "
        "REFERENCES queries (namespace, id) ON DELETE CASCADE) PARTITION BY HASH (namespace)"
    )
    modulus = op.get_bind().execute(sa.text(_PARTITIONS_SQL)).scalar_one()
    for remainder in range(modulus):
        op.execute(
            f"CREATE TABLE query_factors_p{remainder:02d} PARTITION OF query_factors "
            f"FOR VALUES WITH (MODULUS {modulus}, REMAINDER {remainder})"
        )
    op.execute(
        "INSERT INTO query_factors (namespace, query_id, bias, slope, factors) "
        "SELECT namespace, id, bias, slope, factors FROM queries "
        "WHERE bias IS NOT NULL AND slope IS NOT NULL AND factors IS NOT NULL"
    )
    for column in ("bias", "slope", "factors"):
        op.drop_column("queries", column)
    op.execute("ANALYZE query_factors")


def downgrade() -> None:
    op.add_column("queries", sa.Column("bias", sa.Double(), nullable=True))
    op.add_column("queries", sa.Column("slope", sa.Double(), nullable=True))
    op.add_column("queries", sa.Column("factors", ARRAY(sa.REAL()), nullable=True))
    op.execute(
        "UPDATE queries q SET bias = f.bias, slope = f.slope, factors = f.factors "
        "FROM query_factors f WHERE f.namespace = q.namespace AND f.query_id = q.id"
    )
    op.drop_table("query_factors")
