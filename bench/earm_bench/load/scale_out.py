"""The scale-out cell of ``earm bench load`` (``--scale-out``): ``earm`` retrieves
at one concurrency against ``--api-processes`` ``earm serve`` processes without background work
(round robin, by request) and ``--workers`` ``earm worker`` processes on the one database, and,
for comparison in the same run, against one ``earm serve`` doing its own background work.

Each row starts its processes afresh, makes the namespace due for a full refit, drives the
retrieves, then waits until a refit has been written, so the peaks of resident memory cover
both the requests and a refit wherever it ran. What each process did is counted from its own
log (``EARM_LOG_LEVEL=INFO``: "refitted namespace", "indexed memories").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Any

import httpx

from earm_bench.common.processes import (
    ChildProcess,
    ServiceProcess,
    child_process,
    service_process,
)
from earm_bench.common.serve import REFIT_IN_REQUEST
from earm_bench.load.database import last_refit_at, make_refit_due
from earm_bench.load.session import LoadRun, drive

#: The log messages of a full refit and of an indexer batch (service/retrieve/learning.py,
#: service/ingest/indexer.py).
REFIT_MESSAGE = "refitted namespace"
INDEX_BATCH_MESSAGE = "indexed memories"
#: The counter of answered retrieves in ``/metrics`` (service/metrics.py), one line per label set.
RETRIEVES_METRIC = "earm_retrieves_total{"
#: Sequential retrieves each API process answers before a row is measured.
WARM_UP_PER_PROCESS = 4
#: How long a row waits after its retrieves for the refit they made due.
REFIT_WAIT_S = 1800.0


async def _work(process: ChildProcess, client: httpx.AsyncClient | None) -> dict[str, int]:
    """What ``process`` has done so far: refits and index batches (its log) and, for an API
    process (``client`` is its), the ``/retrieve`` requests it answered (its ``/metrics``)."""
    work = {"refits": process.log_count(REFIT_MESSAGE),
            "index_batches": process.log_count(INDEX_BATCH_MESSAGE)}
    if client is not None:
        response = await client.get("/metrics")
        response.raise_for_status()
        work["retrieves"] = round(sum(
            float(line.rsplit(" ", 1)[1])
            for line in response.text.splitlines()
            if line.startswith(RETRIEVES_METRIC)
        ))
    return work


async def until_refitted(run: LoadRun, since: Any, processes: Sequence[ChildProcess]) -> float:
    """Seconds until the namespace's latest refit is newer than ``since``; an error if one of
    ``processes`` (those that could refit) exits or none refits within :data:`REFIT_WAIT_S`."""
    began = time.perf_counter()
    while await last_refit_at(run) == since:
        exited = [p.log_path.name for p in processes if p.process.poll() is not None]
        if exited:
            raise RuntimeError(f"{', '.join(exited)}: the process exited (see its log)")
        if time.perf_counter() - began > REFIT_WAIT_S:
            raise RuntimeError(f"no refit of {run.namespace} within {REFIT_WAIT_S:g} s")
        await asyncio.sleep(0.5)
    return time.perf_counter() - began


async def _measure(run: LoadRun, topology: str, apis: Sequence[ServiceProcess],
                   workers: Sequence[ChildProcess]) -> dict[str, Any]:
    """One row: after a warm-up, the retrieves, spread over ``apis``, and the refit they made
    due; each process's work and peak memory over that span."""
    config = run.config
    limits = httpx.Limits(max_connections=config.scale_out_concurrency)
    async with AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=api.url, timeout=900, limits=limits)
            )
            for api in apis
        ]
        # Fresh processes: their first requests open pools and load code.
        await drive(run, run.query_numbers(WARM_UP_PER_PROCESS * len(apis)), len(apis), "earm",
                    "warm-up", clients=clients)
        processes = [*zip(apis, clients, strict=True), *((w, None) for w in workers)]
        before = [await _work(process, client) for process, client in processes]
        for process, _ in processes:
            process.reset_peak_rss()
        refitted_before = await last_refit_at(run)
        await make_refit_due(run)
        samples = await drive(run, run.query_numbers(config.scale_out_requests),
                              config.scale_out_concurrency, "earm", topology, clients=clients)
        waited = await until_refitted(run, refitted_before, [*apis, *workers])
        done = [
            {**process.rss_mb(),
             **{k: v - was[k] for k, v in (await _work(process, client)).items()}}
            for (process, client), was in zip(processes, before, strict=True)
        ]
    return {
        "topology": topology,
        "api_processes": len(apis),
        "workers": len(workers),
        "concurrency": config.scale_out_concurrency,
        **samples.summary(),
        "refit_wait_after_retrieves_s": round(waited, 1),
        "api": done[:len(apis)],
        "worker": done[len(apis):],
    }


async def scale_out(
    run: LoadRun, settings: Mapping[str, str], workdir: Path
) -> list[dict[str, Any]]:
    """The cell's rows: one API process doing its own background work, then
    ``--api-processes`` without it and ``--workers`` workers; ``settings`` are the run's
    service's (its whole EARM_* environment), the processes' logs go under ``workdir``."""
    config = run.config
    # Every API process is `earm serve` as deployed: its refits run after the response (the
    # run's service refits in the request: earm_bench.common.serve).
    logged = dict(settings) | {"EARM_LOG_LEVEL": "INFO", REFIT_IN_REQUEST: "false"}
    rows = []
    with ExitStack() as stack:
        one = stack.enter_context(service_process(
            logged, _directory(workdir, "one-process"), "api-0",
        ))
        rows.append(await _measure(run, "1 API process, its own background work", [one], []))
    with ExitStack() as stack:
        directory = _directory(workdir, "scale-out")
        workers = [
            stack.enter_context(child_process(("worker",), logged, directory, f"worker-{i}"))
            for i in range(config.workers)
        ]
        apis = [
            stack.enter_context(service_process(
                logged | {"EARM_BACKGROUND_WORK": "false"}, directory, f"api-{i}"
            ))
            for i in range(config.api_processes)
        ]
        rows.append(await _measure(
            run, f"{config.api_processes} API processes without background work + "
                 f"{config.workers} worker(s)", apis, workers,
        ))
    return rows


def _directory(parent: Path, name: str) -> Path:
    directory = parent / name
    directory.mkdir(parents=True, exist_ok=True)
    return directory
