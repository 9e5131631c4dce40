"""The services ``earm bench locomo`` replays through: one in this process per policy (over an
embedded Postgres of its own, a fresh database on ``--database-server``, or the shared
``--database-url``), or the running service at ``--url``."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from earm_bench.common.processes import in_process_service
from earm_bench.locomo.config import STATELESS_POLICIES, TOP_B, LocomoConfig
from earm_bench.locomo.judge import RunningJudge
from service.budget import DEFAULT_BUDGET_SCHEDULE
from service.settings import Settings

logger = logging.getLogger(__name__)


@contextmanager
def service_for(
    config: LocomoConfig, judge: RunningJudge, policies: Sequence[str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The base URL of the service to use and a description of its settings. A service of
    stateless policies alone (``full``, ``top-b``) reranks as peers do: every asking scores
    every candidate it ranks (no reuse of earlier askings' observations)."""
    if config.url:
        _warn_external(config, policies)
        yield config.url.rstrip("/"), {"url": config.url, "external": True}
        return
    options: dict[str, Any] = {
        "embedder": "local",
        "scorer_concurrency": config.scorer_concurrency,
        "budget_schedule": config.schedule or DEFAULT_BUDGET_SCHEDULE,
        "max_candidates": max(config.candidates, 1000),
        # top-b asks for all of its B candidates back (k = B): the pairs it scored
        "max_k": max(100, config.candidates),
        "reuse_observations": not set(policies) <= STATELESS_POLICIES,
        **judge.service_settings(),
    }
    if config.profile != "earm":
        options["profile"] = config.profile
    with _database(config, options) as database_url:
        logger.info("starting the service")
        # Refits inside the request that makes them due: the replay is then exactly
        # reproducible (a background refit lands after a timing-dependent number of queries).
        with in_process_service(
            **options, database_url=database_url, refit_in_request=True
        ) as service:
            logger.info("service listening on %s", service.url)
            described = service.settings.model_dump(
                mode="json",
                exclude={"scorer_api_key", "embedder_api_key", "data_dir", "database_url"},
            )
            yield service.url, described | {"external": False, "refit_in_request": True}


def _warn_external(config: LocomoConfig, policies: Sequence[str]) -> None:
    """What the bench cannot set on a running service, and what follows for the report."""
    if config.profile != "earm":
        logger.warning("--profile does not reach a service at --url: run the service with "
                       "EARM_PROFILE=%s for the profile's figures", config.profile)
    if config.schedule:
        logger.warning("--schedule does not reach a service at --url: its own schedule applies "
                       "to its policies (top-b's budgets follow --schedule)")
    if TOP_B in policies:
        logger.warning("with --url the service's budget schedule is unknown: top-b's budgets "
                       "follow %s (--schedule or the default), and it asks for k up to "
                       "--candidates (the service needs EARM_MAX_K >= %d)",
                       config.schedule or "the default schedule", config.candidates)
    stateless = sorted(set(policies) & STATELESS_POLICIES)
    if config.repeat and stateless:
        logger.warning("with --url, %s reuse earlier askings' observations unless the service "
                       "runs with EARM_REUSE_OBSERVATIONS=false: their --repeat rounds are then "
                       "not stateless reranking", " and ".join(stateless))


@contextmanager
def _database(config: LocomoConfig, options: dict[str, Any]) -> Iterator[str | None]:
    """The database URL of one in-process service: a fresh database on ``--database-server``
    (dropped afterwards), else ``--database-url`` (None: the service starts an embedded
    Postgres of its own)."""
    if not config.database_server:
        yield config.database_url
        return
    with fresh_database(config.database_server, Settings(**options).embedding_dim) as url:
        yield url


@contextmanager
def fresh_database(server_url: str, embedding_dim: int) -> Iterator[str]:
    """URL of a new database at the schema head on the server of ``server_url`` (a URL of any
    database there that may create databases), dropped on exit."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from service.db import migrate
    from service.db.urls import sqlalchemy_url

    server = make_url(sqlalchemy_url(server_url))
    name = f"earm_locomo_{secrets.token_hex(4)}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        url = server.set(database=name).render_as_string(hide_password=False)
        try:
            migrate.upgrade_to_head(url, embedding_dim)
            yield url
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()
