"""One ``earm bench capacity`` run: the service rows, then ``earm bench deadline``'s (T2) and
``earm bench tenancy``'s (T7) measurements at the issue's settings, and every verdict row."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from earm_bench.capacity import backends, serving
from earm_bench.capacity.config import CapacityConfig
from earm_bench.capacity.rows import rows
from earm_bench.common.cpu import postmaster_pid
from earm_bench.common.database import migrated_database
from earm_bench.common.processes import judge_process, rerank_judge_process, service_process
from earm_bench.deadline import DeadlineConfig, run_deadline
from earm_bench.load import World
from earm_bench.load.database import environment
from earm_bench.load.judge import Judge
from earm_bench.load.session import LoadRun
from earm_bench.tenancy import TenancyConfig, run_tenancy


async def _serve(config: CapacityConfig, judge: Judge, world: World, database_url: str,
                 judge_urls: tuple[str, str, str], workdir: Path) -> dict[str, Any]:
    """T4, T9, T1 (and T8), T10, T3, T5 and T6 (background refits) against one shipped ``earm
    serve`` (T9's small backlog and T1's rerank cells through services of their own), then T6
    against ``earm serve --no-background-work`` and ``earm worker``. ``judge_urls``: the chat
    judge, the same on a small listen backlog, the ``/rerank`` backend."""
    judge_url, backlog_url, rerank_url = judge_urls
    postmaster = None if config.database_url else postmaster_pid(workdir / "pgdata")
    settings = serving.shipped_settings(database_url, judge_url)
    report: dict[str, Any] = {"service_settings": {
        k: v for k, v in settings.items() if k != "EARM_DATABASE_URL"}}
    with service_process(settings, workdir) as service, \
            service_process(backends.backlog_settings(settings, backlog_url), workdir,
                            "backlog-service", ready=False) as small_backlog:
        async with httpx.AsyncClient(base_url=service.url, timeout=900,
                                     limits=httpx.Limits(max_connections=32)) as client:
            base = LoadRun(world.config, world, judge, service, database_url, client)
            cap = serving.Capacity(config, judge, serving.namespaces(base, world), settings,
                                   rerank_url, workdir, postmaster)
            report["prepare"] = await serving.prepare(cap)  # while T9's service starts
            report["refit_costs"] = await serving.refit_costs(cap)
            # The shipped service's first scoring, on a pool as cold as a new process's.
            report["backlog"] = await backends.backlog(cap, small_backlog)
            report["score"] = await serving.score_cells(cap)
            report["limited_backend"] = await backends.limited_backend(cap)
            report["throughput"] = await serving.throughput(cap)
            report["semantic_tail"] = await serving.semantic_tail(cap)
            report["refit_window"] = {"in_process": await serving.refit_window(
                cap, client, [service])}
    report["refit_window"]["worker"] = await serving.worker_window(cap)
    return report


def _service_rows(config: CapacityConfig, workdir: Path) -> dict[str, Any]:
    world = World(serving.load_config(config))
    judge = Judge(world, config.chat_ms)
    # The judges are forked first, before this process has threads or connections.
    with judge_process(judge.reply) as judge_url, \
            judge_process(judge.reply, backends.SMALL_BACKLOG) as backlog_url, \
            rerank_judge_process(judge.rerank, judge.latency_s) as rerank_url, \
            migrated_database(config.database_url, world.config.dim, workdir) as database_url:
        machine = environment(database_url)
        measured = asyncio.run(_serve(config, judge, world, database_url,
                                      (judge_url, backlog_url, rerank_url), workdir))
        return {"environment": machine, **measured}


def run_capacity(config: CapacityConfig, command: str = "") -> dict[str, Any]:
    """The whole run; returns the JSON report (its ``rows`` are the verdicts)."""
    started = time.perf_counter()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="earm-capacity-") as tmp:
        report = _service_rows(config, Path(tmp))
    report["deadline"] = run_deadline(DeadlineConfig(
        deadline_ms=config.deadline_ms, backend_ms=config.deadline_backend_ms,
        retrieves=config.deadline_retrieves, seed=config.seed,
        database_url=config.database_url))
    report["tenancy"] = run_tenancy(TenancyConfig(
        memories=config.memories, tenants=config.tenants, tenant_size=config.tenant_size,
        queries=config.tenancy_queries, seed=config.seed,
        database_url=config.database_url, partitions=None))  # the shipped schema's 16
    report |= {
        "command": command, "config": config.as_json(),
        "load_average": {"start": load_at_start, "end": [round(x, 2) for x in os.getloadavg()]},
        "duration_s": round(time.perf_counter() - started, 1),
    }
    report["rows"] = rows(report)
    return report
