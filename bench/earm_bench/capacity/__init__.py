"""``earm bench capacity``: every capacity target of the service as a verdict row of one run,
each a ratio of two figures measured in that run.

The service is ``earm serve`` at its shipped defaults (background work and background refits
on) in a child process, over a scratch database, with loopback backends of fixed latency in
processes of their own: a chat judge of 100 ms per call (and the same judge on a listen backlog
of 5, for T9) and a ``/rerank`` backend of 50 ms per request (the load bench's low-rank
judge). Ten namespaces of ``--serving-memories`` client
vectors each are ingested; two of them get 10k and 1M bulk-inserted observations. A row that
must set something says so in its ``setting`` column; nothing else is set.

- **T1**: ``earm`` at budget 35 and ``full`` (200 anchors), concurrency 1, chat and rerank
  (a second service whose scorer is the rerank backend): score phase p50 ≤ 1.3 × the backend
  latency per round (the rerank backend's requests per retrieve: one per round of the anchor
  rule, at most two), ≤ 1.6 × for ``full`` (one round).
- **T2**: ``earm bench deadline`` at a 150 ms deadline and a 500 ms backend: client p99 ≤ 1.5 ×
  the deadline; every late anchor recorded (counted).
- **T3**: an instant scorer, concurrency 8: ``earm`` retrieves/s ≥ 0.5 × ``semantic``'s; eight
  clients of one namespace ≥ 0.7 × one client on each of eight namespaces.
- **T4**: full-refit CPU seconds (this process and its children, measured; the median of
  ``refit_repeats``) × the refits the shipped rule (``refit_due``) makes per 1,000 retrieves at
  that size (counted from the rule): at 1M observations ≤ 2 × at 10k.
- **T5**: ``semantic`` at concurrency 1 while the service refits the 1M namespace in the
  background: client p95 ≤ 2 × p50.
- **T6**: ``earm`` to the 1M namespace at concurrency 8 (chat judge), its refit made due at the
  start and again whenever one lands (``namespaces.last_refit_at``), until two have landed:
  client p99 ≤ 3 × p50 with refits in the serving process; ≤ 2 × with ``earm serve
  --no-background-work`` and an ``earm worker``.
- **T7**: ``earm bench tenancy`` at ``--memories``, on the shipped schema (16 partitions per
  table): a namespace of 1% of the table, and 1,000 namespaces of 100 memories, against one of
  50%: search p50 ≤ 1.3 ×, top-200 recall ≥ 0.95.
- **T8**: at the shipped default (``EARM_ANCHOR_ROUNDS=1``) a retrieve's anchors leave in one
  round: the most ``scorer_rounds`` any of T1's chat ``earm`` retrieves answered ≤ 1; and T1's
  chat cells in backend latencies, at one round: score p50 ≤ 1.3 latencies at budget 35, ≤ 1.6
  at 200 anchors (``full``).
- **T9**: ``full`` (200 anchors) on a cold scorer pool against the chat judge with a listen
  backlog of 5 (a second service, ``EARM_BACKGROUND_WORK=false``) and with a deep one (the
  shipped service, whose first scoring this is): the first retrieve of each, then one after
  each pause that closes the pool's idle connections: score p50 ≤ 2 × the deep backlog's.
- **T10**: ``full`` against the chat judge working on 4 calls at once (each for its latency,
  the rest queued without a word): the most calls it had at once, waiting or worked on, ≤ 2 ×
  4. The scorer's client bounds them by its 64 connections (``EARM_SCORER_MAX_CONNECTIONS``)
  and an AIMD window that halves on a 429, a 503 or no answer and is cut to twice what a
  backend that queues works on, once its answers' latency rises with the requests at it (a
  retrieve's first requests leave before that: the note has the most at once of each
  retrieve); the note has the retrieve's score p50 in backend latencies against the
  backend's own floor (200 / 4).

The report (markdown on stdout, JSON with ``--out``) has each row's figure, bound, ratio and
verdict, the phases' own figures, the config, the command and the load average at start and
end. ``--quick`` runs every row at small sizes with faster backends (what the smoke test
runs); its verdicts say little. ``--database-url``: an empty scratch database; T7 truncates it.
"""

from earm_bench.capacity.cli import add_capacity_parser, render_markdown
from earm_bench.capacity.config import CapacityConfig
from earm_bench.capacity.run import run_capacity

__all__ = ["CapacityConfig", "add_capacity_parser", "render_markdown", "run_capacity"]
