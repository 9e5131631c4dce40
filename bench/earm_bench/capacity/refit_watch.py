"""When a namespace's full refit ran during T6's window, seen from Postgres, whichever process
refits: its transaction holds the namespace's refit lock (an advisory lock) from before the
read to the commit, and has a transaction id only from its write on (the staging of the
queries' parameters, then the write under the namespace's lock; ``service.retrieve.refit``).
A poll every :data:`POLL_S` of ``pg_locks`` tells the two apart; each retrieve of the window
is then put with the refits' writes, the rest of the refits, or neither, by its start and end,
and by how long after the end of the latest write it started (:data:`SINCE_WRITE_S`). Each poll
also counts the backends waiting for a lock, the namespace's memory rows without statistics
(a refit writes those of the memories observed while it ran without; the next retrieve that
observes one rebuilds it from the memory's history) and the backends reading such histories.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from earm_bench.load.session import LoadRun, Samples

POLL_S = 0.1
# The refit lock's key is hashtextextended('earm-refit:' || namespace, 0)
# (service.db.namespaces); an int8 advisory key is classid (high half) and objid (low half).
# With it, the backends waiting for a lock (a record queued on the namespace's row), the
# namespace's memory rows without statistics, and the backends reading the histories of such
# rows (service.db.memory_rows: the only statement with this condition).
_HOLDER_SQL = """
    SELECT (SELECT a.backend_xid IS NOT NULL
            FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
            WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
              AND ((l.classid::bigint << 32) | l.objid::bigint)
                  = hashtextextended('earm-refit:' || %s, 0)
            LIMIT 1),
           (SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'),
           (SELECT count(*) FROM memory_factors WHERE namespace = %s AND statistics IS NULL),
           (SELECT count(*) FROM pg_stat_activity WHERE state = 'active'
              AND pid <> pg_backend_pid() AND query LIKE '%%f.statistics IS NOT NULL%%')
"""
#: What a refit's transaction was doing at a poll: reading and fitting, or writing.
FIT, WRITE = "fit", "write"
#: The bounds of the split by seconds from the end of the latest write to a retrieve's start.
SINCE_WRITE_S = (3.0, 10.0)


@dataclass
class RefitWatch:
    """The polls of one window: ``(perf_counter, state, lock waiters, rows without
    statistics, history readers)``, state None when no refit ran."""

    polls: list[tuple[float, str | None, int, int, int]] = field(default_factory=list)

    def intervals(self, state: str | None = None) -> list[tuple[float, float]]:
        """Spans of consecutive polls in ``state`` (any refit's state when None), widened by
        a poll on each side: a retrieve outside all of them overlapped no such state."""
        spans: list[tuple[float, float]] = []
        start: float | None = None
        last = 0.0
        for at, seen, *_ in self.polls:
            inside = seen is not None and (state is None or seen == state)
            if inside and start is None:
                start = at
            if not inside and start is not None:
                spans.append((start - POLL_S, last + POLL_S))
                start = None
            if inside:
                last = at
        if start is not None:
            spans.append((start - POLL_S, last + POLL_S))
        return spans

    def split(self, samples: Samples) -> dict[str, Any]:
        """The window's retrieves by what ran beside them: a refit's write, the rest of a
        refit (its read and fit), no refit; the percentiles of each part."""
        writes, refits = self.intervals(WRITE), self.intervals()

        def overlaps(span: tuple[float, float], spans: list[tuple[float, float]]) -> bool:
            return any(span[0] < end and start < span[1] for start, end in spans)

        during_write = [overlaps(span, writes) for span in samples.spans]
        during_refit = [overlaps(span, refits) for span in samples.spans]
        parts = {
            "during_write": during_write,
            "during_read_or_fit": [r and not w for r, w in zip(during_refit, during_write,
                                                                strict=True)],
            "outside_refits": [not r for r in during_refit],
        }
        def waiters(state: str | None, readers: bool = False) -> dict[str, Any]:
            counts = [reading if readers else waiting
                      for _, seen, waiting, _, reading in self.polls if seen == state]
            return {"polls": len(counts), "max": max(counts, default=None),
                    "mean": round(sum(counts) / len(counts), 2) if counts else None}

        write_ends = [end for _, end in writes]
        since = [next((span[0] - end for end in reversed(write_ends) if end <= span[0]), None)
                 for span in samples.spans]
        low, high = SINCE_WRITE_S
        after = {
            "before_any_write": [s is None for s in since],
            f"from_0_to_{low:g}_s_after_a_write": [s is not None and s < low for s in since],
            f"from_{low:g}_to_{high:g}_s": [s is not None and low <= s < high for s in since],
            f"from_{high:g}_s_on": [s is not None and s >= high for s in since],
        }
        stale = [poll[3] for poll in self.polls]
        return {
            "rows_without_statistics": {"max": max(stale, default=None),
                                        "at_end": stale[-1] if stale else None},
            "lock_waiters": {"write": waiters(WRITE), "read_or_fit": waiters(FIT),
                             "no_refit": waiters(None)},
            "history_readers": {"write": waiters(WRITE, True), "read_or_fit": waiters(FIT, True),
                                "no_refit": waiters(None, True)},
            "refit_s": [round(end - start - 2 * POLL_S, 1) for start, end in refits],
            "write_s": [round(end - start - 2 * POLL_S, 1) for start, end in writes],
            "poll_s": POLL_S,
            **{name: _tails(samples.subset(keep)) for name, keep in parts.items()},
            "since_write": {name: _tails(samples.subset(keep)) for name, keep in after.items()},
        }


def _tails(samples: Samples) -> dict[str, Any]:
    return {"client_ms": samples.summary()["client_ms"], "phases_ms": samples.phase_tails()}


@contextlib.asynccontextmanager
async def watching(run: LoadRun) -> AsyncIterator[RefitWatch]:
    """Poll the refits of ``run``'s namespace until the block ends."""
    watch = RefitWatch()
    conn = await run.connect()

    async def poll() -> None:
        while True:
            cursor = await conn.execute(_HOLDER_SQL, (run.namespace, run.namespace))
            writing, waiting, stale, reading = await cursor.fetchone()
            watch.polls.append((time.perf_counter(),
                                None if writing is None else WRITE if writing else FIT, waiting,
                                stale, reading))
            await asyncio.sleep(POLL_S)

    task = asyncio.create_task(poll())
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await conn.close()
