"""``earm bench load-mix``: a bounded mixed load, then an audit of what it left behind.

``--clients`` concurrent clients send a random mix of ``POST /memories`` (batches with client
vectors), ``POST /retrieve`` and ``POST /feedback`` (on queries answered earlier) for
``--seconds``, over a few fresh namespaces of this run. Then the run is audited:

- **zero errors**: every request answered 2xx;
- **HTTP-level** (any service): per namespace, the ``query_index`` values of the answered
  retrieves are exactly 0..n-1 (the namespaces are this run's only, so gap-free and no dupes);
- **database-level** (when the database is reachable: always for the in-process service, or
  with ``--database-url``): per namespace ``namespaces.next_query_index`` = rows in ``queries``
  = answered retrieves; memories = seeded + created; rows in ``scores`` = scorer observations
  of the answered retrieves + feedback recorded; ``namespaces.scorer_calls`` = the sum of
  ``scorer_calls``; ``namespaces.score_count`` = rows in ``scores``.

Without ``--url`` the service runs in-process on a loopback port over a temporary embedded
Postgres (or ``--database-url``), with the local scorer; the exit status is 0 only when the run
had no error and every audit holds.

Faults (``--fault-*``, any combination): a scorer that stalls for a window in the middle of the
run (the in-process service is then scored by a loopback judge), clients that delete memories
their retrieves just returned, and a SIGKILL of the embedded Postgres mid-run. Errors a fault
explains (a 503 while Postgres is down, a 404 for a deleted memory) are reported by status and
fail nothing; any other error, a 500 above all, fails the run. The counts are then audited
within what the faults explain (writes that failed with a 5xx may have committed; a delete
takes its memory's observations with it), and by id: every answered query, every memory
created and not deleted and every acknowledged observation of it is in the database. The
report adds each fault's figures: degraded retrieves before, during and after the stall and
whether the first ones after it are scored normally; deletes and the errors meanwhile; the
503s after the kill and the time until a request succeeds again.
"""

# The package: config (the flags), ledger (what the clients were told), driver (the clients),
# audit, report, run and cli. The docstring above is `earm bench load-mix --help`'s description.

from earm_bench.load_mix.cli import add_load_mix_parser
from earm_bench.load_mix.config import LoadMixConfig
from earm_bench.load_mix.report import LoadMixReport
from earm_bench.load_mix.run import drive, run_load_mix

__all__ = ["LoadMixConfig", "LoadMixReport", "add_load_mix_parser", "drive", "run_load_mix"]
