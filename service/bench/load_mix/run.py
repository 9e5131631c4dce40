"""``earm bench load-mix`` from start to end: the service, the load, the audits."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from service.bench.common.processes import in_process_service
from service.bench.load_mix.audit import audit_database, audit_http
from service.bench.load_mix.config import LoadMixConfig
from service.bench.load_mix.driver import Driver
from service.bench.load_mix.report import LoadMixReport


def drive(base_url: str, config: LoadMixConfig, database_url: str | None = None) -> LoadMixReport:
    """Run the mix against ``base_url``; audit the database too when ``database_url`` is given."""
    driver = Driver(base_url.rstrip("/"), config, uuid.uuid4().hex[:8])
    duration = asyncio.run(driver.run())
    audits: dict[str, bool] = {}
    problems = list(driver.problems)
    audits["http: gap-free query indexes"], found = audit_http(driver.ledgers)
    problems += found
    if database_url:
        found_audits, found = audit_database(driver.ledgers, database_url)
        audits.update(found_audits)
        problems += found
    return LoadMixReport(config, duration, driver.stats, audits, problems)


def run_load_mix(
    config: LoadMixConfig,
    *,
    url: str | None = None,
    database_url: str | None = None,
    settings: Any | None = None,
) -> LoadMixReport:
    if url:
        return drive(url, config, database_url)
    # Without settings: a temporary embedded Postgres, the local scorer and no embedder (the
    # clients send vectors).
    with in_process_service(settings, embedder="none", scorer="local") as service:
        return drive(service.url, config, database_url or service.database_url)
