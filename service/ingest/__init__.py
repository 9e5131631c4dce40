"""The ingest flow: input checks, the idempotent batch ingest (and memory lookup, listing,
edits, deletion), and the background indexer that moves new memories into the HNSW index."""
