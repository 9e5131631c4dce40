"""``earm bench load``: scale and speed at 10k–100k memories and up to 1M observations, measured
against the raw pgvector floor.

The run builds synthetic data of known structure and drives the real service over HTTP:

- **memories**: ``--memories`` vectors (``--dim``, 384) in ``--topics`` clusters (cosine to the
  topic centre ≈ 0.74), each with a rank-``--true-rank`` latent vector of its topic plus noise;
- **judge**: a loopback OpenAI-compatible chat-completions server (:func:`service.testing.
  chat_completions_app`) that reads the query and memory numbers from the prompt and answers
  the low-rank relevance ``clip(0.5 + 0.5·a_q·b_m, 0, 1)``, after ``--latency-ms`` per call;
- **service**: ``earm serve`` in a child process (so its resident memory is its own), over an
  embedded Postgres in a temporary directory or ``--database-url``; the judge is its scorer.

It reports, as markdown on stdout and JSON with ``--out``:

1. **ingest** throughput (memories/s): ``POST /memories`` batches with client vectors; raw
   binary ``COPY`` streams (as many as the batches in flight) of the same kind of rows into the
   same table and index (the ingest floor);
   ``POST /memories`` with text only, embedded by the service's local embedder;
2. **retrieve** latency p50/p95/p99 per policy at each ``--concurrency``: total (``timings.
   total_ms``), scorer time (``score_ms``), server-side overhead (total − score), and
   client-side; throughput (requests/s); judge latency 0 ms;
3. **floor**: the raw top-``--candidates`` pgvector query (psycopg, binary vectors, one round
   trip, same ``hnsw.ef_search``/``iterative_scan`` settings), at the same concurrencies, on
   fresh query vectors of the same distribution (each retrieve cell's vectors are fresh too),
   and the ratio of earm's server-side overhead to it; then again on the cells' own vectors,
   replayed after them (a warmer cache: their pages were just read), for comparison;
4. **slow judge**: ``earm`` with a ``--slow-latency-ms`` judge and ``budget`` = the scorer
   concurrency (all anchors in one round), and with the schedule's budget;
5. **completion vs observations**: for each ``--observations`` tier, observations are
   bulk-inserted (synthetic queries of ``--obs-per-query`` scored cells of their topic, scores
   from the same low-rank truth), a full refit runs (the pipeline's ``refit``, timed), the
   database is vacuumed and analyzed (as after each ingest path), then sequential ``earm``
   retrieves report ``timings.complete_ms``; one more retrieve is made to
   trigger a full refit inside the service (its latency is reported), and the service's
   resident memory (psutil RSS, and its peak during that retrieve) is read after it; record
   p50 per tier, and the database's size (tables with their indexes, the HNSW index alone);
6. **dashboard**: at each tier, every page of the namespace (``/dashboard/`` and the namespace,
   its experience matrix, its latest query's trace) fetched ``--dashboard-requests`` times,
   client-side p50/p95/p99 over HTTP, against the target of 500 ms;
7. **scale-out** (``--scale-out``, after the largest tier): ``earm`` retrieves at
   ``--scale-out-concurrency`` against one ``earm serve`` doing its own background work, then
   against ``--api-processes`` ``earm serve --no-background-work`` (round robin) and
   ``--workers`` ``earm worker`` processes on the same database, each row after making the
   namespace due for a refit and until that refit is written: requests/s, latency, and each
   process's peak RSS, refits and index batches.

The judge runs in a child process of the bench, the service in another; all of them, and
Postgres, share the machine. Numbers are as measured, on whatever machine runs the command.
"""

# The package: config (the flags), world (the data), judge, session (what the phases share, and
# timed retrieves), ingest, floor, observations, dashboard, database, scale_out, run (the phases
# in order), targets, report, plot and cli. The docstring above is `earm bench load --help`'s
# description.

from earm_bench.load.cli import add_load_parser
from earm_bench.load.config import LoadConfig
from earm_bench.load.plot import plot
from earm_bench.load.report import render_markdown
from earm_bench.load.run import run_load
from earm_bench.load.world import World

__all__ = ["LoadConfig", "World", "add_load_parser", "plot", "render_markdown", "run_load"]
