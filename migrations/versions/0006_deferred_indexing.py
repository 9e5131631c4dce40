"""Deferred vector indexing: memories are committed unindexed and indexed in the background.

Inserting into the HNSW index is most of the cost of an ingest (about 300 rows/s at 100k
memories of 384 dimensions on 2 cores, against several thousand for the row itself), so an
ingest no longer waits for it. ``indexed`` is false for a new memory; the HNSW index is partial
(``WHERE indexed``) and a background task (``service.ingest.indexer``) flips the flag in batches,
which inserts those rows into it. Until then the search reaches a memory through an exact scan
of its namespace's unindexed rows (``ix_memories_unindexed``), so an acknowledged memory is
searchable at once.

Existing rows are indexed already (the column's initial default is true); the HNSW index is
rebuilt once as the partial index.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HNSW = (
    "CREATE INDEX ix_memories_embedding_hnsw ON memories "
    "USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 128)"
)


def upgrade() -> None:
    op.add_column(
        "memories",
        sa.Column("indexed", sa.Boolean(), server_default=sa.true(), nullable=False),
    )
    op.alter_column("memories", "indexed", server_default=sa.false())
    op.execute("DROP INDEX ix_memories_embedding_hnsw")
    op.execute(_HNSW + " WHERE indexed")
    op.execute("CREATE INDEX ix_memories_unindexed ON memories (namespace, id) WHERE NOT indexed")


def downgrade() -> None:
    op.execute("DROP INDEX ix_memories_unindexed")
    op.execute("DROP INDEX ix_memories_embedding_hnsw")
    op.execute(_HNSW)
    op.drop_column("memories", "indexed")
