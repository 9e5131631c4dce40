"""The phases of ``earm bench load`` in order, and the processes they run against."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from earm_bench.common.database import citus_database, migrated_database
from earm_bench.common.processes import (
    ServiceProcess,
    judge_process,
    rerank_judge_process,
    service_process,
)
from earm_bench.common.serve import REFIT_IN_REQUEST
from earm_bench.common.stats import percentiles
from earm_bench.load.config import LoadConfig
from earm_bench.load.dashboard import dashboard_pages
from earm_bench.load.database import (
    analyze,
    database_sizes,
    environment,
    observation_counts,
    refit,
    settle,
)
from earm_bench.load.floor import floor
from earm_bench.load.ingest import ingest_phase
from earm_bench.load.judge import Judge
from earm_bench.load.observations import add_observations, trigger_service_refit
from earm_bench.load.scale_out import scale_out
from earm_bench.load.session import LoadRun, drive
from earm_bench.load.targets import targets
from earm_bench.load.world import World

#: Anchors of the rerank-backend row: the issue's "a retrieve scoring 35 anchors".
RERANK_ANCHORS = 35
#: Untimed retrieves before the latency matrix and before the rerank row, each the first
#: requests of its service process (pool connections opened, statements prepared, code loaded),
#: so the overhead the rerank target allows and the rerank row's own are measured alike.
WARM_UP_RETRIEVES = 8


def service_settings(
    config: LoadConfig, database_url: str, judge_url: str, scorer: str = "openai"
) -> dict[str, str]:
    """The service's whole EARM_* environment: its scorer is the judge (chat completions, or
    ``scorer="rerank"``: the judge's ``/rerank``)."""
    return {
        "EARM_DATABASE_URL": database_url,
        "EARM_EMBEDDING_DIM": str(config.dim),
        "EARM_EMBEDDER": "local",
        "EARM_SCORER": scorer,
        "EARM_SCORER_BASE_URL": judge_url + "/v1",
        "EARM_SCORER_MODEL": "loopback-judge",
        "EARM_SCORER_CONCURRENCY": str(config.scorer_concurrency),
        # Generous: `full` at concurrency 32 queues 6,400 judge calls behind one semaphore.
        "EARM_SCORER_TIMEOUT_S": "600",
        "EARM_DB_POOL_SIZE": str(config.db_pool_size),
        "EARM_MAX_CANDIDATES": str(max(1000, config.candidates)),
        "EARM_LOG_LEVEL": "WARNING",
        # The bench's own switch (earm_bench.common.serve): a refit runs in the request that
        # makes it due, so that request times it (the service runs it after the response).
        REFIT_IN_REQUEST: "true",
    }


async def latency_matrix(
    run: LoadRun,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Every (policy, concurrency) cell, and two floors of each concurrency: on fresh query
    vectors, as each cell's retrieves are (the one the ratios use), and replaying the cells'
    own vectors after them (whose index and heap pages the cells have just read, so it runs
    on a warmer cache: kept to show by how much)."""
    config = run.config
    run.judge.latency_ms = config.latency_ms
    await drive(run, run.query_numbers(WARM_UP_RETRIEVES), 1, "earm", "warm-up")
    cells, floors, replayed = [], [], []
    for concurrency in config.concurrency:
        asked: list[int] = []
        for policy in config.policies:
            numbers = run.query_numbers(max(config.requests, concurrency))
            asked += numbers
            samples = await drive(run, numbers, concurrency, policy, f"{policy} c={concurrency}")
            cells.append({"policy": policy, "concurrency": concurrency,
                          "judge_latency_ms": config.latency_ms, **samples.summary()})
        floors.append(await floor(run, run.query_numbers(len(asked)), concurrency))
        replayed.append(await floor(run, asked, concurrency))
    return cells, floors, replayed


async def slow_judge(run: LoadRun) -> list[dict[str, Any]]:
    """``earm`` with a slow judge: budget = the scorer concurrency (all anchors in one round),
    alone and with concurrent clients, and the schedule's budget."""
    config = run.config
    run.judge.latency_ms = config.slow_latency_ms
    cells: list[tuple[int | None, int]] = [(config.scorer_concurrency, 1), (None, 1)]
    if max(config.concurrency) > 1:
        cells.insert(1, (config.scorer_concurrency, min(8, max(config.concurrency))))
    rows = []
    for budget, concurrency in cells:
        numbers = run.query_numbers(max(config.slow_requests, concurrency))
        samples = await drive(run, numbers, concurrency, "earm",
                              f"earm {config.slow_latency_ms:g} ms judge", budget=budget)
        rows.append({"policy": "earm", "scorer": "openai", "budget": budget or "schedule",
                     "concurrency": concurrency, "judge_latency_ms": config.slow_latency_ms,
                     **samples.summary()})
    run.judge.latency_ms = config.latency_ms
    return rows


async def rerank_backend(run: LoadRun, judge_url: str, workdir: Path) -> dict[str, Any]:
    """``earm`` through a ``/rerank`` backend of the slow judge's latency, scoring
    :data:`RERANK_ANCHORS` anchors per retrieve (one batch per round of the anchor rule, so at
    most two requests), concurrency 1:
    a second service on the same database and namespace whose scorer is the rerank judge,
    warmed up as the latency matrix's service is before its cells."""
    config = run.config
    workdir.mkdir(exist_ok=True)
    settings = service_settings(config, run.database_url, judge_url, scorer="rerank")
    run.judge.latency_ms = config.slow_latency_ms
    with service_process(settings, workdir) as service:
        async with httpx.AsyncClient(base_url=service.url, timeout=900) as client:
            description = f"earm {config.slow_latency_ms:g} ms rerank"
            try:
                await drive(run, run.query_numbers(WARM_UP_RETRIEVES), 1, "earm",
                            f"{description} warm-up", budget=RERANK_ANCHORS, clients=[client])
                numbers = run.query_numbers(config.slow_requests)
                samples = await drive(run, numbers, 1, "earm", description,
                                      budget=RERANK_ANCHORS, clients=[client])
            finally:
                run.judge.latency_ms = config.latency_ms
    return {"policy": "earm", "scorer": "rerank", "budget": RERANK_ANCHORS, "concurrency": 1,
            "judge_latency_ms": config.slow_latency_ms, "warm_up": WARM_UP_RETRIEVES,
            **samples.summary()}


async def observation_tier(
    run: LoadRun, target: int, report: dict[str, Any], rerank_judge: tuple[str, Path]
) -> dict[str, Any]:
    """Grow the namespace to ``target`` observations, refit, and measure ``earm`` there; the
    first tier also measures the latency matrix, the floor and the slow judge."""
    current = (await observation_counts(run))["observations"]
    added = await add_observations(run, target, current)
    refit_s = await refit(run)
    await analyze(run)
    tier: dict[str, Any] = {"target": target, **await observation_counts(run), "insert": added,
                            "refit_s": round(refit_s, 2)}
    if "retrieve" not in report:  # the first tier
        report["retrieve"], report["floor"], report["floor_replayed"] = await latency_matrix(run)
        report["slow_judge"] = [
            *await slow_judge(run), await rerank_backend(run, *rerank_judge)
        ] if run.config.slow_requests else []
    samples = await drive(run, run.query_numbers(run.config.completion_requests), 1, "earm",
                          f"earm @ {current} observations")
    tier["earm"] = samples.summary()
    tier["complete_ms"] = percentiles(samples.timing("complete_ms"))
    tier["record_ms"] = percentiles(samples.timing("record_ms"))
    tier["service_refit"] = await trigger_service_refit(run)
    tier["dashboard"] = await dashboard_pages(run, run.config.dashboard_requests)
    tier["database"] = await database_sizes(run)
    tier["rss_after"] = run.service.rss_mb()
    return tier


async def _run(config: LoadConfig, world: World, judge: Judge, service: ServiceProcess,
               database_url: str, rerank_judge: tuple[str, Path],
               settings: dict[str, str], workdir: Path) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=max(config.concurrency) + 4)
    async with httpx.AsyncClient(base_url=service.url, timeout=900, limits=limits) as client:
        run = LoadRun(config, world, judge, service, database_url, client)
        report: dict[str, Any] = {"namespace": run.namespace, "rss_start": service.rss_mb()}
        report["ingest"] = await ingest_phase(run)
        report["rss_after_ingest"] = service.rss_mb()
        await settle(run)
        report["observations"] = [
            await observation_tier(run, target, report, rerank_judge)
            for target in config.observations
        ]
        if config.scale_out:
            report["scale_out"] = await scale_out(run, settings, workdir / "scale-out")
    return report


def run_load(config: LoadConfig) -> dict[str, Any]:
    """The whole benchmark; returns the JSON report."""
    world = World(config)
    judge = Judge(world, config.latency_ms)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="earm-load-") as tmp_name:
        tmp = Path(tmp_name)
        # The judge is forked first, before this process has threads or connections.
        with judge_process(judge.reply) as judge_url, rerank_judge_process(
            judge.rerank, judge.latency_s
        ) as rerank_url, (
            citus_database(config.dim) if config.citus
            else migrated_database(config.database_url, config.dim, tmp)
        ) as database_url:
            settings = service_settings(config, database_url, judge_url)
            with service_process(settings, tmp) as service:
                machine = environment(database_url)
                rerank_judge = (rerank_url, tmp / "rerank-service")
                report = asyncio.run(_run(config, world, judge, service, database_url,
                                          rerank_judge, settings, tmp))
                machine["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
                report["rss_end"] = service.rss_mb()
                report["service_settings"] = service.settings
    report["environment"] = machine
    report["config"] = config.as_json()
    report["duration_s"] = round(time.perf_counter() - started, 1)
    report["targets"] = targets(report)
    return report
