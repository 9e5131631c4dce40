"""The one place where errors become HTTP responses: ``{"error": {"code", "message"}}``."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.db.writes import retry_may_succeed
from service.errors import (
    DatabaseUnavailable,
    EarmError,
    EmbedderUnavailable,
    Forbidden,
    IndexingBacklog,
    InvalidInput,
    LimitExceeded,
    NamespaceBusy,
    NotFound,
    SchemaOutOfDate,
    Unauthenticated,
)
from service.http.middleware import annotated

log = logging.getLogger(__name__)

# Most specific class first: the first isinstance match wins.
STATUS_BY_ERROR: list[tuple[type[EarmError], int]] = [
    (LimitExceeded, 413),
    (InvalidInput, 422),
    (NotFound, 404),
    (Unauthenticated, 401),
    (Forbidden, 403),
    (EmbedderUnavailable, 503),
    (DatabaseUnavailable, 503),
    (NamespaceBusy, 503),
    (IndexingBacklog, 503),
    (SchemaOutOfDate, 503),
]
RETRY_AFTER_S = "5"
# SQLSTATE classes of errors that go away by themselves: connection exceptions, transaction
# rollbacks (serialization failure, deadlock), insufficient resources, operator intervention
# (shutdown, "cannot connect now"). They are answered 503 + Retry-After, never 500.
TRANSIENT_SQLSTATE_CLASSES = ("08", "40", "53", "57")
#: lock_timeout ran out (EARM_DB_LOCK_TIMEOUT_S): 503 namespace_busy.
LOCK_NOT_AVAILABLE = "55P03"


def is_transient_database_error(exc: BaseException) -> bool:
    if isinstance(exc, (PoolTimeout, psycopg.OperationalError, psycopg.InterfaceError)):
        return True
    # A conflict the server rolled back (Citus's replaced shard among them), once a write
    # transaction's retries (service.db.writes) ran out, or of a read.
    if retry_may_succeed(exc):
        return True
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated or isinstance(exc, (OperationalError, InterfaceError)):
            return True
        sqlstate = getattr(exc.orig, "sqlstate", None) or ""
        return sqlstate[:2] in TRANSIENT_SQLSTATE_CLASSES
    return False


def _sqlstate(exc: BaseException) -> str:
    return str(getattr(getattr(exc, "orig", None) or exc, "sqlstate", None) or "")


def _namespace_busy(request: Request) -> JSONResponse:
    """A lock the request needed (its namespace's row, which the namespace's writers take in
    turn) was held longer than ``EARM_DB_LOCK_TIMEOUT_S``: the request let go of its connection
    instead of queueing with it, so one busy namespace cannot take the pool from the others."""
    namespace = annotated(request).get("namespace")
    subject = "a namespace" if namespace is None else f"namespace {namespace!r}"
    log.warning("lock wait timed out: %s is busy", subject)
    return error_response(
        503,
        NamespaceBusy.code,
        f"{subject} is busy (a lock it needs was held over EARM_DB_LOCK_TIMEOUT_S); retry "
        "shortly",
        {"Retry-After": RETRY_AFTER_S},
    )


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"error": {"code": code, "message": message}}, headers=headers
    )


def status_for(error: EarmError) -> int:
    return next((status for cls, status in STATUS_BY_ERROR if isinstance(error, cls)), 500)


def _describe_validation_errors(exc: RequestValidationError) -> tuple[str, str]:
    """One precise, human message from pydantic's error list, e.g. `body.memories.0.text: ...`."""
    errors = exc.errors()
    if any(error.get("type") == "json_invalid" for error in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid")
        return (
            "malformed_json",
            f"request body is not valid JSON: {detail.get('ctx', {}).get('error', 'parse error')}",
        )
    parts = []
    for error in errors[:5]:
        location = ".".join(str(part) for part in error.get("loc", ()))
        parts.append(f"{location}: {error.get('msg', 'invalid')}")
    if len(errors) > 5:
        parts.append(f"... and {len(errors) - 5} more")
    return "validation_error", "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(EarmError)
    async def _domain_error(request: Request, exc: EarmError) -> JSONResponse:
        status = status_for(exc)
        headers = {"Retry-After": RETRY_AFTER_S} if status == 503 else None
        if status == 401:
            headers = {"WWW-Authenticate": 'Bearer realm="earm"'}
        return error_response(status, exc.code, exc.message, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        code, message = _describe_validation_errors(exc)
        return error_response(400 if code == "malformed_json" else 422, code, message)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {
            404: "not_found",
            405: "method_not_allowed",
            408: "request_timeout",
            413: "payload_too_large",
        }
        return error_response(
            exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail), exc.headers
        )

    @app.exception_handler(OperationalError)
    @app.exception_handler(DBAPIError)
    @app.exception_handler(PoolTimeout)
    @app.exception_handler(psycopg.Error)
    async def _database_error(request: Request, exc: Exception) -> JSONResponse:
        if _sqlstate(exc) == LOCK_NOT_AVAILABLE:
            return _namespace_busy(request)
        if is_transient_database_error(exc):
            log.warning(
                "database unavailable: %s", type(getattr(exc, "orig", None) or exc).__name__
            )
            return error_response(
                503,
                DatabaseUnavailable.code,
                "the database is unavailable; retry shortly",
                {"Retry-After": RETRY_AFTER_S},
            )
        log.exception("database error")
        return error_response(500, "internal_error", "internal error")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, "internal_error", "internal error")
