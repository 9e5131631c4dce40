"""The rows of ``earm bench capacity`` about the scorer's backend, not the service's own work: a
chat backend with a listen backlog of 5 (T9) and one that works on 4 calls at once and queues
the rest without a word (T10). T8 (the rounds of a retrieve) reads T1's cells."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from earm_bench.capacity.serving import CANDIDATES, Capacity, merge
from earm_bench.common.processes import ServiceProcess, until_ready
from earm_bench.load.session import Samples, drive
from service.testing import interrupt

#: T9: the backlog of the small backend (Python's http.server's).
SMALL_BACKLOG = 5
#: T10: calls the limited backend works on at once.
WORKS_ON = 4


def backlog_settings(cap_settings: dict[str, str], backlog_url: str) -> dict[str, str]:
    """T9's second service: the shipped one with the small-backlog judge as its scorer, and no
    background work (it would refit the namespaces in the other rows' way)."""
    return cap_settings | {"EARM_SCORER_BASE_URL": backlog_url + "/v1",
                           "EARM_BACKGROUND_WORK": "false"}


async def backlog(cap: Capacity, small: ServiceProcess) -> dict[str, Any]:
    """T9: ``full`` (every candidate scored) on a cold scorer pool, against the chat judge on a
    deep listen backlog through the shipped service (whose first scoring this must be: its
    pool is as cold as a new process's), and on a backlog of :data:`SMALL_BACKLOG` through
    ``small`` (:func:`backlog_settings`, started alongside, never used before): the first
    retrieve of each, then one after each idle pause that closes the pool's connections
    (``PoolLimits.keepalive_s``)."""
    from service.providers.http_client import PoolLimits

    idle_s = PoolLimits().keepalive_s + 1.0
    cells: dict[str, Any] = {"idle_s": idle_s}
    cells["deep"] = await _cold_retrieves(cap, cap.serving.client, "deep", idle_s)
    until_ready(small)
    async with httpx.AsyncClient(base_url=small.url, timeout=900) as client:
        cells[f"backlog_{SMALL_BACKLOG}"] = await _cold_retrieves(
            cap, client, f"backlog {SMALL_BACKLOG}", idle_s)
    interrupt(small.process)  # done with: out of the other rows' way
    return cells


async def _cold_retrieves(cap: Capacity, client: httpx.AsyncClient, name: str,
                          idle_s: float) -> dict[str, Any]:
    parts: list[Samples] = []
    for n in range(cap.config.backlog_retrieves):
        if n:
            await asyncio.sleep(idle_s)
        parts.append(await drive(cap.serving, cap.numbers(1), 1, "full",
                                 f"{name} backlog, cold pool", clients=[client]))
    return {"backend_ms": cap.judge.latency_ms,
            "anchors": min(CANDIDATES, cap.config.serving_memories), **merge(parts).summary()}


async def limited_backend(cap: Capacity) -> dict[str, Any]:
    """T10: ``full`` against the chat judge working on :data:`WORKS_ON` calls at once (each for
    its latency, the rest queued), through the shipped service: the most calls the judge had
    at once, waiting or worked on, over the retrieves and in each (the first's are sent before
    any answer tells the scorer the judge queues), and the retrieves' own figures."""
    from service.settings import Settings

    cap.judge.limit = WORKS_ON
    parts: list[Samples] = []
    each: list[int] = []
    try:
        for number in cap.numbers(cap.config.limited_retrieves):
            cap.judge.reset_most_at_once()
            parts.append(await drive(cap.serving, [number], 1, "full",
                                     f"backend working on {WORKS_ON}"))
            each.append(cap.judge.most_at_once)
    finally:
        cap.judge.limit = 0
    fields = Settings.model_fields
    return {"works_on": WORKS_ON, "most_at_once": max(each), "most_at_once_each": each,
            "backend_ms": cap.judge.latency_ms,
            "anchors": min(CANDIDATES, cap.config.serving_memories),
            "client_bound": {"scorer_max_connections": fields["scorer_max_connections"].default,
                             "scorer_concurrency": fields["scorer_concurrency"].default},
            **merge(parts).summary()}
