"""The only place with SQL: the engine, the schema (models, migrations) and one module per table
group. Every function takes an open ``AsyncSession`` and leaves the transaction to the caller,
so the caller decides what commits together; the exceptions say so in their docstrings (reads
that commit in the same round trip, writes that can carry the caller's COMMIT).

One SQL style, for new code too: SQL text as module-level constants, with named ``%(name)s``
parameters, executed on the session's psycopg connection (:func:`engine.driver_connection`,
in the session's transaction; :mod:`statements` runs one statement and returns its rows), and
pipelined (``conn.pipeline()``) where a path issues several statements. Why: the hot paths (the
search, the record, the refit's COPYs) need what only the driver gives, statements pipelined
into one round trip with their COMMIT, vectors and float arrays in binary, rows without
SQLAlchemy's per-row processing (docs/performance.md); writing every other statement the same
way means one way to read and review SQL, the statement as Postgres sees it, and no second
adaptation layer between a parameter and its column. SQLAlchemy stays for what it does well
around the SQL: the engine, its pool, sessions and transactions; ``models`` declares the schema
Alembic compares its migrations against and is not a way to query.

- ``engine``: where the database comes from (URL or embedded Postgres), the schema check.
- ``replicas``, ``writes``: which server a read runs on; where a namespace's write
  transactions begin, so this process's replica reads see them.
- ``statements``: running one statement on the session's connection.
- ``memories``: ingest, lookup, listing, edits, deletion and the background indexer's batches.
- ``documents``: the rerank protocol's documents, their sightings and their expiry.
- ``search``: a query's semantic candidates with their model parameters.
- ``record``: what one retrieve records (the query, its observations and trace, the counters).
- ``experience``: feedback, retired observations and the experience matrix's other reads.
- ``memory_rows``: what the online update of memory rows reads, and rebuilt statistics.
- ``model_state``: memory rows, query parameters, the content prior, the full refit's write.
- ``namespaces``: namespace counters, creation, erasure, row and advisory locks.
- ``keys``: API keys (hashes and namespace patterns).
- ``stats``, ``dashboard``, ``traces``: what ``GET /stats``, ``/metrics``, the dashboard and
  ``GET /queries/{id}`` read.
- ``codecs``: real values, factor arrays and binary COPY streams.
"""
