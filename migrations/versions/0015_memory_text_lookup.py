"""Memories found by their text: the rerank protocol's documents.

A document a client sends to ``/v1/rerank`` is the memory of its namespace with that text
(``service.ingest.documents``): the first time a text is seen it is stored, and later calls,
and memories ingested through ``/memories``, with the same text are that memory. The lookup
goes through ``ix_memories_namespace_text_md5``, an index on the namespace and the md5 of the
text (a text can be far longer than a B-tree entry may be); the statement compares the text
itself too, so a digest collision cannot join two memories.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX ix_memories_namespace_text_md5 ON memories (namespace, md5(text), id)"
    )


def downgrade() -> None:
    op.drop_index("ix_memories_namespace_text_md5", table_name="memories")
