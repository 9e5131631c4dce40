"""The rows of ``earm bench capacity`` that drive ``earm serve`` (T1, T3, T4, T5, T6): the
namespaces, the shipped service and the backends they share, and each target's measurement."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from earm_bench.capacity.config import CapacityConfig
from earm_bench.capacity.refit_watch import RefitWatch, watching
from earm_bench.common.cpu import CpuReading
from earm_bench.common.processes import ChildProcess, child_process, service_process
from earm_bench.load import LoadConfig, World
from earm_bench.load.database import (
    last_refit_at,
    make_refit_due,
    observation_counts,
    refit_cost,
    settle,
)
from earm_bench.load.ingest import ingest_vectors
from earm_bench.load.judge import Judge
from earm_bench.load.observations import add_observations
from earm_bench.load.scale_out import until_refitted
from earm_bench.load.session import LoadRun, Samples, drive

#: The serving namespaces of T3 (eight, one client each, against eight clients of the first).
SERVING = tuple(f"serving-{n}" for n in range(8))
#: T1's anchor budget, and the anchor count of ``full`` (every candidate).
BUDGET, CANDIDATES = 35, 200
#: Untimed retrieves before each cell of a service (pools opened, code loaded).
WARM_UP = 4


def load_config(config: CapacityConfig) -> LoadConfig:
    """The load bench's world at this run's sizes: its memories, queries and judge."""
    return LoadConfig(memories=config.serving_memories,
                      observations=(config.small_observations, config.large_observations),
                      candidates=min(CANDIDATES, config.serving_memories), topics=config.topics,
                      obs_per_query=config.obs_per_query, seed=config.seed)


def shipped_settings(database_url: str, judge_url: str, scorer: str = "openai") -> dict[str, str]:
    """The whole EARM_* environment of a service at the shipped defaults: only the database,
    client vectors (no embedder) and the loopback scorer are set."""
    return {"EARM_DATABASE_URL": database_url, "EARM_EMBEDDER": "none", "EARM_SCORER": scorer,
            "EARM_SCORER_BASE_URL": judge_url + "/v1", "EARM_SCORER_MODEL": "loopback-judge",
            "EARM_LOG_LEVEL": "WARNING"}


@dataclass
class Capacity:
    """What the rows share: the judge (its latency is set per row), a namespace per role
    (:data:`SERVING`, whose first is also T4's small one, and ``large``), the shipped
    service's settings, the ``/rerank`` backend and a directory for more processes."""

    config: CapacityConfig
    judge: Judge
    runs: dict[str, LoadRun]
    settings: dict[str, str]
    rerank_url: str
    workdir: Path
    postmaster: int | None = None  # the embedded Postgres' (None: an external database)

    @contextlib.asynccontextmanager
    async def cpu_of(self, cell: str, into: dict[str, dict[str, float | None]],
                     requests: int) -> AsyncIterator[None]:
        """Where the CPU of a cell of ``requests`` retrieves went, per request, into
        ``into[cell]`` (:class:`~earm_bench.common.cpu.CpuReading`)."""
        pid = self.serving.service.process.pid
        before = CpuReading.now(pid, self.postmaster)
        yield
        into[cell] = before.per_request_ms(CpuReading.now(pid, self.postmaster), requests)

    @property
    def serving(self) -> LoadRun:
        return self.runs[SERVING[0]]

    def numbers(self, n: int) -> list[int]:
        """Query numbers no retrieve of the run has used (one sequence for all namespaces)."""
        return self.serving.query_numbers(n)


def namespaces(base: LoadRun, world: World) -> dict[str, LoadRun]:
    """A run per role, on ``base``'s service and client, each its own namespace."""
    return {role: LoadRun(base.config, world, base.judge, base.service, base.database_url,
                          base.client, namespace=f"capacity-{role}")
            for role in (*SERVING, "large")}


async def prepare(cap: Capacity) -> dict[str, Any]:
    """Every namespace's memories through ``POST /memories`` (indexed, analyzed), then
    bulk-inserted observations: ``small_observations`` in each serving namespace (so all of
    them are past the young namespace's frequent refits, and alike), ``large_observations``
    in ``large``; the serving namespaces but the first (T4 refits it) refitted once."""
    began = time.perf_counter()
    for run in cap.runs.values():
        await ingest_vectors(run)
    await settle(cap.serving)
    ingest_s = time.perf_counter() - began
    sizes = {"large": cap.config.large_observations}
    inserted = {role: await add_observations(run, sizes.get(role, cap.config.small_observations), 0)
                for role, run in cap.runs.items()}
    await settle(cap.serving)
    for role in SERVING[1:]:
        await refit_cost(cap.runs[role])
    return {"ingest_s": round(ingest_s, 1), "memories_per_namespace": cap.config.serving_memories,
            "namespaces": len(cap.runs), "observations_inserted": inserted}


# ------------------------------------------------------------------------------------- T1


async def score_cells(cap: Capacity) -> list[dict[str, Any]]:
    """``earm`` at budget 35 and ``full`` (200 anchors), concurrency 1: through the chat judge
    of the shipped service, then through the ``/rerank`` backend of a second service."""
    cells = await _score_cells(cap, cap.serving.client, "chat", cap.config.chat_ms)
    settings = shipped_settings(cap.settings["EARM_DATABASE_URL"], cap.rerank_url, "rerank")
    with service_process(settings, cap.workdir, "rerank-service") as rerank:
        async with httpx.AsyncClient(base_url=rerank.url, timeout=900) as client:
            cells += await _score_cells(cap, client, "rerank", cap.config.rerank_ms)
    return cells


async def _score_cells(cap: Capacity, client: httpx.AsyncClient, scorer: str,
                       latency_ms: float) -> list[dict[str, Any]]:
    cap.judge.latency_ms = latency_ms
    run, cells = cap.serving, []
    try:
        await drive(run, cap.numbers(WARM_UP), 1, "earm", f"{scorer} warm-up", budget=BUDGET,
                    clients=[client])
        for policy, budget in (("earm", BUDGET), ("full", None)):
            samples = await drive(run, cap.numbers(cap.config.score_requests), 1, policy,
                                  f"{scorer} {policy}", budget=budget, clients=[client])
            cells.append({"scorer": scorer, "policy": policy, "backend_ms": latency_ms,
                          "anchors": budget or run.config.candidates, **samples.summary()})
    finally:
        cap.judge.latency_ms = cap.config.chat_ms
    return cells


# ------------------------------------------------------------------------------------- T3


async def throughput(cap: Capacity) -> dict[str, Any]:
    """An instant scorer, concurrency 8: ``semantic`` and ``earm`` to one namespace, then
    ``earm`` with one client per namespace over eight namespaces."""
    n, runs = cap.config.throughput_requests, [cap.runs[role] for role in SERVING]
    cap.judge.latency_ms = 0.0
    cpu: dict[str, dict[str, float | None]] = {}
    try:
        for run in runs:
            await drive(run, cap.numbers(WARM_UP), 1, "earm", "warm-up")
        async with cap.cpu_of("semantic", cpu, n):
            semantic = await drive(cap.serving, cap.numbers(n), 8, "semantic", "semantic c=8")
        async with cap.cpu_of("earm_one_namespace", cpu, n):
            one = await drive(cap.serving, cap.numbers(n), 8, "earm", "earm c=8, one namespace")
        began = time.perf_counter()
        per_namespace = max(1, n // len(runs))
        async with cap.cpu_of("earm_eight_namespaces", cpu, per_namespace * len(runs)):
            eight = await asyncio.gather(*(
                drive(run, cap.numbers(per_namespace), 1, "earm", f"earm {run.namespace}")
                for run in runs))
        wall_s = time.perf_counter() - began
    finally:
        cap.judge.latency_ms = cap.config.chat_ms
    merged = merge(eight)
    merged.wall_s = wall_s
    return {"semantic": semantic.summary(), "earm_one_namespace": one.summary(),
            "earm_eight_namespaces": merged.summary(), "cpu_ms_per_request": cpu}


def merge(parts: Sequence[Samples]) -> Samples:
    """The samples of ``parts`` as one cell's (its ``wall_s`` is the caller's to set)."""
    merged = Samples()
    for part in parts:
        merged.client_ms += part.client_ms
        merged.timings += part.timings
        merged.scorer_calls += part.scorer_calls
        merged.scorer_requests += part.scorer_requests
        merged.scorer_rounds += part.scorer_rounds
        merged.spans += part.spans
        merged.degraded += part.degraded
        merged.errors += part.errors
    return merged


# ------------------------------------------------------------------------------------- T4


def refit_interval(queries: int) -> int:
    """Queries after a refit until the shipped rule (:func:`service.retrieve.learning.
    refit_due` at the default ``EARM_REFIT_EVERY``, ``EARM_REFIT_GROWTH``) makes the next one
    due, for a namespace of ``queries`` queries at that refit."""
    from service.retrieve.learning import refit_due
    from service.settings import Settings

    every = int(Settings.model_fields["refit_every"].default)
    growth = float(Settings.model_fields["refit_growth"].default)
    since = 1
    while not refit_due(since, queries + since, every, growth):
        since += 1
    return since


async def refit_costs(cap: Capacity) -> list[dict[str, Any]]:
    """Per observation size: the CPU seconds of a full refit (the median of ``refit_repeats``,
    measured), times the refits the shipped rule makes per 1,000 retrieves (counted)."""
    rows = []
    for role in (SERVING[0], "large"):
        run = cap.runs[role]
        costs = [await refit_cost(run) for _ in range(cap.config.refit_repeats)]
        counts = await observation_counts(run)
        interval = refit_interval(counts["queries"])
        cpu_s = statistics.median(cost.cpu_s for cost in costs)
        rows.append({"namespace": role, **counts,
                     "refit_s": round(statistics.median(cost.seconds for cost in costs), 2),
                     "refit_cpu_s": round(cpu_s, 2), "refit_every_queries": interval,
                     "refits_per_1000": round(1000 / interval, 3),
                     "cpu_s_per_1000": round(cpu_s * 1000 / interval, 3)})
    return rows


# --------------------------------------------------------------------------------- T5, T6


async def semantic_tail(cap: Capacity) -> dict[str, Any]:
    """``semantic`` at concurrency 1 while the service refits ``large`` in the background (made
    due, and started by one ``earm`` retrieve there, just before)."""
    large = cap.runs["large"]
    since = await last_refit_at(large)
    await make_refit_due(large)
    await drive(large, cap.numbers(1), 1, "earm", "start a refit")
    samples = await drive(cap.serving, cap.numbers(cap.config.tail_requests), 1, "semantic",
                          "semantic c=1")
    landed_in_window = await last_refit_at(large) != since
    waited_s = await until_refitted(large, since, [cap.serving.service])
    return {**samples.summary(), "refit_landed_in_window": landed_in_window,
            "refit_landed_after_s": round(waited_s, 1)}


async def refit_window(cap: Capacity, client: httpx.AsyncClient,
                       processes: Sequence[ChildProcess],
                       raw: list[tuple[Samples, RefitWatch]] | None = None) -> dict[str, Any]:
    """``earm`` to ``large`` at concurrency 8 (the chat judge) until ``window_refits`` refits
    of it have landed: due at the start, and again as soon as each one lands. With each
    phase's percentiles, and the same split by what ran beside each retrieve (a refit's write,
    the rest of a refit, none) and by the time since a refit's write ended
    (:mod:`~earm_bench.capacity.refit_watch`). ``raw``: where to put the window's samples and
    polls too."""
    large, config = cap.runs["large"], cap.config
    await drive(large, cap.numbers(WARM_UP), 1, "earm", "warm-up", clients=[client])
    since, landed, chunks = await last_refit_at(large), 0, []
    await make_refit_due(large)
    began = time.perf_counter()
    async with watching(large) as watch:
        while (landed < config.window_refits
               and time.perf_counter() - began < config.window_timeout_s):
            chunks.append(await drive(large, cap.numbers(config.window_chunk), 8, "earm",
                                      "window", clients=[client]))
            latest = await last_refit_at(large)
            if latest != since:
                since, landed = latest, landed + 1
                await make_refit_due(large)
            if any(p.process.poll() is not None for p in processes):
                raise RuntimeError("a process of the refit window exited (see its log)")
    samples = merge(chunks)
    samples.wall_s = time.perf_counter() - began
    if raw is not None:
        raw.append((samples, watch))
    return {**samples.summary(), "phases_ms": samples.phase_tails(),
            "by_refit": watch.split(samples), "refits_landed": landed,
            "window_s": round(samples.wall_s, 1)}


async def worker_window(cap: Capacity,
                        raw: list[tuple[Samples, RefitWatch]] | None = None) -> dict[str, Any]:
    """:func:`refit_window` against ``earm serve --no-background-work`` and an ``earm
    worker`` on the same database (the shipped service stopped by then)."""
    settings = cap.settings | {"EARM_BACKGROUND_WORK": "false"}
    with child_process(("worker",), cap.settings, cap.workdir, "worker") as worker, \
            service_process(settings, cap.workdir, "api") as api:
        async with httpx.AsyncClient(base_url=api.url, timeout=900) as client:
            return await refit_window(cap, client, [worker, api], raw)
