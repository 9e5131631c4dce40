"""Query embeddings stay in their row; the trace arrays go out of line instead.

Since 0012 a query row holds its trace (seven arrays over its ~200 candidates, a few KB even
compressed) next to its embedding (1,540 bytes at 384 dimensions). A row that large gets
TOASTed, and pgvector's ``vector`` is stored EXTERNAL, so Postgres moved the embedding out of
line first: every query's embedding sat in the TOAST table, and the paraphrase scan, which
compares the query with the embeddings of the namespace's latest EARM_PARAPHRASE_WINDOW
queries, fetched one TOAST value per query (a query row took a heap page of its own). With
storage MAIN the embedding stays in the row, the traces (read only by ``GET /queries/{id}``
and the dashboard) go out of line, and the scan reads a few rows per page: over the 800 queries
of a 20k-memory namespace, 215 buffers instead of 5,615, 3.2 ms instead of 19.5 ms on a cold
cache (docs/performance.md).

Only the column's storage changes (no rewrite, no lock held for long): rows written before keep
their layout until they are rewritten, so the window turns over to the new layout as queries
arrive.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE queries ALTER COLUMN embedding SET STORAGE MAIN")


def downgrade() -> None:
    # pgvector's default storage for vector
    op.execute("ALTER TABLE queries ALTER COLUMN embedding SET STORAGE EXTERNAL")
