"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.errors import ErrorResponse
from service.api.health import HealthOut, ReadyOut
from service.db import migrate
from service.errors import DatabaseUnavailable, SchemaOutOfDate
from service.http.deps import ComponentsDep

router = APIRouter(tags=["health"])


# HEAD as well as GET, as load balancers and uptime checks probe with either (no body is sent
# for HEAD); it is left out of the OpenAPI document, which would list every operation twice.
@router.get("/healthz", response_model=HealthOut)
@router.head("/healthz", response_model=HealthOut, include_in_schema=False)
async def healthz() -> HealthOut:
    """The process is up (it does not touch the database)."""
    return HealthOut(status="ok")


@router.get("/readyz", response_model=ReadyOut, responses={503: {"model": ErrorResponse}})
@router.head("/readyz", response_model=ReadyOut, include_in_schema=False)
async def readyz(components: ComponentsDep) -> ReadyOut:
    """The database answers and its schema is at the head this code expects; with how this
    process's full refits have gone (a detail: failing refits fail no request)."""
    try:
        async with components.database.engine.connect() as conn:
            revision = await conn.run_sync(migrate.current_revision)
    except Exception as exc:  # any failure to reach the database means "not ready"
        raise DatabaseUnavailable(f"database unreachable: {type(exc).__name__}") from exc
    if revision != migrate.head_revision():
        raise SchemaOutOfDate(
            f"schema at {revision}, expected {migrate.head_revision()}: run `earm migrate`"
        )
    return ReadyOut(
        status="ready",
        schema_revision=revision,
        refits=components.refit_health.snapshot(),
    )
