"""Routes of the dashboard (see the package's docstring)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path as FilePath
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from sqlalchemy.ext.asyncio import AsyncSession

from service.api.fields import MAX_BIGINT, NamespaceName
from service.api.queries import QueryTraceResult
from service.api.stats import NamespaceStats
from service.auth import Authenticator, Principal, require_namespace
from service.db import dashboard as dashboard_sql
from service.db import stats as stats_sql
from service.db.traces import query_namespace, query_trace
from service.errors import EarmError, Unauthenticated
from service.http.dashboard import charts
from service.http.deps import Components
from service.http.error_handlers import install_error_handlers, status_for

DASHBOARD_PATH = "/dashboard"
COOKIE_NAME = "earm_dashboard_key"
#: Points per history chart, recent queries listed, queries whose returned memories are mixed.
HISTORY_BUCKETS = 120
RECENT_QUERIES = 25
SOURCE_MIX_QUERIES = 1000
#: The experience matrix: its last queries (rows) and memory-id ranges (columns) at most.
MATRIX_ROWS = 100
MATRIX_COLUMNS = 200
#: Everything the pages load comes from the origin; no inline script.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

_HERE = FilePath(__file__).parent
templates = Jinja2Templates(directory=_HERE / "templates")


#: What the namespace page reads: its stats, history, source mix and recent queries.
_NamespaceReads = tuple[
    NamespaceStats,
    list[dashboard_sql.HistoryBucket],
    dict[str, int],
    list[dashboard_sql.RecentQuery],
]


class LoginRequired(Exception):
    """No key, or one that is unknown or revoked: the login page is next."""


def mount_dashboard(api: FastAPI) -> None:
    """Mount the dashboard under ``api`` at :data:`DASHBOARD_PATH`; it reads the API app's
    components (its lifespan's) when it answers."""
    dashboard = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    dashboard.state.api = api
    dashboard.mount("/static", StaticFiles(directory=_HERE / "static"), name="static")
    # What is not a page's (a malformed path or parameter, an unknown path, a database
    # failure) is answered as the API answers it; a page's own refusals are pages.
    install_error_handlers(dashboard)
    dashboard.add_exception_handler(LoginRequired, _to_login)
    dashboard.add_exception_handler(EarmError, _error_page)
    dashboard.middleware("http")(_security_headers)
    dashboard.include_router(_router())
    api.mount(DASHBOARD_PATH, dashboard)


async def _security_headers(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    response = await call_next(request)
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    if not request.url.path.startswith(f"{DASHBOARD_PATH}/static"):
        response.headers["Cache-Control"] = "no-store"
    return response


def _components(request: Request) -> Components:
    components: Components = request.app.state.api.state.components
    return components


def _authenticator(request: Request) -> Authenticator:
    authenticator: Authenticator = request.app.state.api.state.authenticator
    return authenticator


async def _principal(request: Request) -> Principal:
    """The cookie's key resolved as the API resolves a bearer key (same mode, same loopback
    rule); without a usable one, the login page."""
    key = request.cookies.get(COOKIE_NAME)
    peer = request.client.host if request.client else None
    try:
        return await _authenticator(request).authenticate(
            f"Bearer {key}" if key else None, peer, request.headers.get("host")
        )
    except Unauthenticated:
        raise LoginRequired() from None


PrincipalDep = Annotated[Principal, Depends(_principal)]


async def _to_login(request: Request, exc: Exception) -> Response:
    return RedirectResponse(f"{DASHBOARD_PATH}/login", status_code=303)


async def _error_page(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EarmError)
    status = status_for(exc)
    return _page(request, "error.html", {"message": exc.message, "status": status}, status)


def _page(
    request: Request, template: str, context: dict[str, Any], status: int = 200
) -> HTMLResponse:
    context = {"base": DASHBOARD_PATH, **context}
    return templates.TemplateResponse(request, template, context, status_code=status)


def _router() -> APIRouter:
    router = APIRouter()
    router.add_api_route("/", namespaces_page, methods=["GET"], response_class=HTMLResponse)
    router.add_api_route("/login", login_page, methods=["GET"], response_class=HTMLResponse)
    router.add_api_route("/login", login, methods=["POST"], response_class=HTMLResponse)
    router.add_api_route("/logout", logout, methods=["POST"])
    router.add_api_route(
        "/namespaces/{namespace}", namespace_page, methods=["GET"], response_class=HTMLResponse
    )
    router.add_api_route(
        "/namespaces/{namespace}/matrix",
        matrix_page,
        methods=["GET"],
        response_class=HTMLResponse,
    )
    router.add_api_route(
        "/queries/{query_id}", trace_page, methods=["GET"], response_class=HTMLResponse
    )
    return router


# ------------------------------------------------------------------------------ login


async def login_page(request: Request) -> HTMLResponse:
    return _page(request, "login.html", {"error": None})


async def login(request: Request) -> Response:
    """Check the key as the API would, then keep it in the cookie."""
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    key = (form.get("key") or [""])[0].strip()
    principal = await _authenticator(request).principal_for_key(key) if key else None
    if principal is None:
        return _page(request, "login.html", {"error": "This key is unknown or revoked."}, 401)
    response = RedirectResponse(f"{DASHBOARD_PATH}/", status_code=303)
    response.set_cookie(
        COOKIE_NAME,
        key,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=DASHBOARD_PATH,
    )
    return response


async def logout(request: Request) -> Response:
    response = RedirectResponse(f"{DASHBOARD_PATH}/login", status_code=303)
    response.delete_cookie(COOKIE_NAME, path=DASHBOARD_PATH, httponly=True, samesite="strict")
    return response


# ------------------------------------------------------------------------------ pages


async def namespaces_page(request: Request, principal: PrincipalDep) -> HTMLResponse:
    components = _components(request)
    rows = await components.database.replicas.read(
        None,
        lambda session: stats_sql.all_namespace_stats(
            session, components.pipeline.schedule, components.limits.default_candidates
        ),
    )
    visible = [row for row in rows if principal.allows(row.namespace)]
    return _page(request, "namespaces.html", {"principal": principal, "namespaces": visible})


async def namespace_page(
    request: Request, namespace: Annotated[NamespaceName, Path()], principal: PrincipalDep
) -> HTMLResponse:
    require_namespace(principal, namespace)
    components = _components(request)
    schedule = components.pipeline.schedule

    async def read(session: AsyncSession) -> _NamespaceReads:
        stats = await stats_sql.namespace_stats(
            session, namespace, schedule, components.limits.default_candidates
        )
        history = await dashboard_sql.namespace_history(
            session, namespace, stats.queries, HISTORY_BUCKETS
        )
        sources = await dashboard_sql.returned_sources(session, namespace, SOURCE_MIX_QUERIES)
        recent = await dashboard_sql.recent_queries(session, namespace, RECENT_QUERIES)
        return stats, history, sources, recent

    stats, history, sources, recent = await components.database.replicas.read(namespace, read)
    context = {
        "principal": principal,
        "stats": asdict(stats),
        "recent": recent,
        "charts": _namespace_charts(history, sources, schedule.stage_for),
        "source_mix_queries": SOURCE_MIX_QUERIES,
    }
    return _page(request, "namespace.html", context)


def _cumulative(
    history: list[dashboard_sql.HistoryBucket],
    calls: Callable[[dashboard_sql.HistoryBucket], int],
) -> list[tuple[float, float]]:
    """Running totals of ``calls`` at the end of each bucket of queries."""
    total, points = 0, []
    for bucket in history:
        total += calls(bucket)
        points.append((bucket.last_index + 1.0, float(total)))
    return points


def _namespace_charts(
    history: list[dashboard_sql.HistoryBucket],
    sources: dict[str, int],
    stage_for: Callable[[int], int],
) -> dict[str, Any]:
    cumulative_calls = _cumulative(history, lambda b: b.scorer_calls)
    cumulative_full = _cumulative(history, lambda b: b.full_rerank_calls)
    # Buckets recorded before stages were kept take the schedule's stage of their first query.
    stages = [
        (float(b.first_index), float(b.stage if b.stage is not None else stage_for(b.first_index)))
        for b in history
    ]
    if history:
        stages.append((history[-1].last_index + 1.0, stages[-1][1]))
    budget_share = [(b.last_index + 1.0, b.budget_share) for b in history]
    errors_new = [
        (b.last_index + 1.0, b.prequential_error_new)
        for b in history
        if b.prequential_error_new is not None
    ]
    errors_again = [
        (b.last_index + 1.0, b.prequential_error_again)
        for b in history
        if b.prequential_error_again is not None
    ]
    error_series = [
        charts.Series(name, points, css_class)
        for name, points, css_class in (
            ("new questions", errors_new, "error"),
            ("asked before (its scores reused)", errors_again, "error-again"),
        )
        if points
    ]
    return {
        "calls": charts.line_chart(
            "calls",
            "Cumulative scorer calls against full reranking",
            [
                charts.Series("full reranking", cumulative_full, "full"),
                charts.Series("earm scorer calls", cumulative_calls, "earm"),
            ],
            "queries",
            "scorer calls",
        ),
        "stage": charts.line_chart(
            "stage",
            "Budget stage and the share of candidates scored",
            [
                charts.Series("stage", stages, "stage", step=True),
                charts.Series("anchors / candidates", budget_share, "share"),
            ],
            "queries",
            "stage · share",
        ),
        "error": charts.line_chart(
            "error",
            "Prequential error over the query stream",
            error_series,
            "queries",
            "mean |estimate − observed|",
        ),
        "sources": charts.share_bar(
            "sources",
            "Sources of the returned memories",
            [
                ("observed", sources.get("observed", 0), "observed"),
                ("estimated", sources.get("estimated", 0), "estimated"),
                ("semantic", sources.get("semantic", 0), "semantic"),
            ],
        ),
    }


async def matrix_page(
    request: Request,
    namespace: Annotated[NamespaceName, Path()],
    principal: PrincipalDep,
    before: Annotated[int | None, Query(ge=1, le=MAX_BIGINT)] = None,
) -> HTMLResponse:
    require_namespace(principal, namespace)
    components = _components(request)
    matrix = await components.database.replicas.read(
        namespace,
        lambda session: dashboard_sql.experience_matrix(
            session, namespace, MATRIX_ROWS, MATRIX_COLUMNS, before
        ),
    )
    context = {
        "principal": principal,
        "namespace": namespace,
        "matrix": matrix,
        "chart": charts.matrix_chart(matrix),
        "legend": charts.colour_scale(),
        "shades": charts.MATRIX_SHADES,
        "older": matrix.query_indexes[0] if matrix.query_indexes else None,
    }
    return _page(request, "matrix.html", context)


async def trace_page(
    request: Request,
    query_id: Annotated[int, Path(ge=1, le=MAX_BIGINT)],
    principal: PrincipalDep,
) -> HTMLResponse:
    components = _components(request)

    async def read(session: AsyncSession) -> QueryTraceResult:
        namespace = await query_namespace(session, query_id)
        require_namespace(principal, namespace)
        return await query_trace(session, namespace, query_id)

    trace = await components.database.replicas.read(None, read)
    return _page(request, "trace.html", {"principal": principal, "trace": trace})
