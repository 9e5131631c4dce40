"""``earm bench load-mix`` from start to end: the service (and the faults' judge), the load,
the audits."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from earm_bench.common.processes import (
    InProcessService,
    in_process_service,
    judge_process,
)
from earm_bench.load_mix import fault_report
from earm_bench.load_mix.audit import audit_database, audit_http
from earm_bench.load_mix.config import LoadMixConfig
from earm_bench.load_mix.driver import Driver
from earm_bench.load_mix.faults import STALL_FACTOR, FaultInjector, StallingJudge
from earm_bench.load_mix.report import LoadMixReport


def drive(base_url: str, config: LoadMixConfig, database_url: str | None = None,
          faults: FaultInjector | None = None) -> LoadMixReport:
    """Run the mix against ``base_url``, with the ``faults`` the injector brings; audit the
    database too when ``database_url`` is given."""
    if faults is None and config.faults.any:
        faults = FaultInjector(config.faults, config.seconds)  # deletes: the clients' doing
    driver = Driver(base_url.rstrip("/"), config, uuid.uuid4().hex[:8], faults)
    duration = asyncio.run(driver.run())
    if faults is not None:
        faults.wait_for_postgres(base_url)
    audits, problems = audit_http(driver.ledgers, config)
    problems = driver.problems + problems
    if database_url:
        found_audits, found = audit_database(driver.ledgers, database_url, config)
        audits.update(found_audits)
        problems += found
    figures = {} if faults is None else fault_report.figures(
        faults, driver.events, driver.ledgers, config.clients
    )
    return LoadMixReport(config, duration, driver.stats, audits, problems, figures)


@contextmanager
def _stalling_judge(
    config: LoadMixConfig,
) -> Iterator[tuple[StallingJudge | None, dict[str, Any]]]:
    """The judge of the stalling-scorer fault, and the service settings that make it the
    scorer; nothing without that fault."""
    if not config.faults.stalling_scorer:
        yield None, {}
        return
    timeout_s = config.faults.scorer_timeout_s
    judge = StallingJudge(STALL_FACTOR * timeout_s)
    # Forked first, before the in-process service starts its threads.
    with judge_process(judge.reply) as url:
        yield judge, {"scorer": "openai", "scorer_base_url": f"{url}/v1",
                      "scorer_model": "loopback-judge", "scorer_timeout_s": timeout_s}


@contextmanager
def _service(settings: Any | None, overrides: dict[str, Any]) -> Iterator[InProcessService]:
    # Without settings: a temporary embedded Postgres, the local scorer and no embedder (the
    # clients send vectors).
    if settings is not None:
        with in_process_service(settings.model_copy(update=overrides)) as service:
            yield service
    else:
        with in_process_service(**({"embedder": "none", "scorer": "local"} | overrides)) as service:
            yield service


def run_load_mix(
    config: LoadMixConfig,
    *,
    url: str | None = None,
    database_url: str | None = None,
    settings: Any | None = None,
) -> LoadMixReport:
    """The run against ``url``, or against the service in this process (over ``settings``, by
    default a temporary embedded Postgres). The stalling-scorer and kill-Postgres faults need
    the service in this process, the kill its embedded Postgres."""
    if url:
        if config.faults.in_process_only:
            raise ValueError("the stalling-scorer and kill-postgres faults need the in-process "
                             "service (no --url)")
        return drive(url, config, database_url)
    external = database_url or (settings is not None and settings.database_url)
    if config.faults.kill_postgres and external:
        raise ValueError("--fault-kill-postgres needs the embedded Postgres (no --database-url)")
    with _stalling_judge(config) as (judge, overrides), _service(settings, overrides) as service:
        if config.faults.kill_postgres and service.settings.database_url:  # from EARM_*
            raise ValueError("--fault-kill-postgres needs the embedded Postgres "
                             "(EARM_DATABASE_URL is set)")
        data_dir = service.settings.data_dir if config.faults.kill_postgres else None
        faults = FaultInjector(config.faults, config.seconds, judge, data_dir)
        return drive(service.url, config, database_url or service.database_url,
                     faults if config.faults.any else None)
