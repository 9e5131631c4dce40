"""The only place with SQL: the engine, the schema (models, migrations) and one module per table
group. Every function takes an open ``AsyncSession`` and leaves the transaction to the caller,
so the caller decides what commits together; the exceptions say so in their docstrings (reads
that commit in the same round trip, writes that can carry the caller's COMMIT).

- ``engine``: where the database comes from (URL or embedded Postgres), the schema check.
- ``memories``: ingest, lookup, listing, deletion and the background indexer's batches.
- ``search``: a query's semantic candidates with their model parameters.
- ``experience``: recorded queries and observed scores (the experience matrix).
- ``model_state``: memory rows, query parameters, the content prior, the full refit's write.
- ``namespaces``: namespace counters, creation, row and advisory locks.
- ``keys``: API keys (hashes and namespace patterns).
- ``stats``: what ``GET /stats`` and the ``/metrics`` gauges read.
- ``codecs``: real values, factor arrays and binary COPY streams.
"""
