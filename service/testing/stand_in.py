"""What every stand-in app shares: its request counters, ``GET /v1/models``, and the handling
of one JSON ``POST`` (recorded, answered by the protocol's code, or refused with a 400 or the
callback's :class:`~service.testing.server.HTTPFault`)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from service.testing.server import HTTPFault

T = TypeVar("T")


class BadRequest(ValueError):
    """The request does not speak the protocol; answered 400 like OpenAI does."""


def openai_app(title: str, model: str) -> FastAPI:
    """An app with the request counters and ``GET /v1/models`` listing ``model``."""
    app = FastAPI(title=title)
    _init_counters(app)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": model, "object": "model", "created": 0, "owned_by": "loopback"}],
        }

    return app


async def answer_post(
    app: FastAPI, request: Request, answer: Callable[[Any], Awaitable[Any]]
) -> Any:
    """One POST: counted, its JSON body recorded as ``last_request`` and answered by
    ``answer``, or a 400 (not JSON, or :class:`BadRequest`) or the callback's
    :class:`~service.testing.server.HTTPFault`."""
    with _Track(app):
        try:
            body = await request.json()
        except ValueError:
            return _bad_request("body is not valid JSON")
        app.state.last_request = {"headers": dict(request.headers), "json": body}
        try:
            return await answer(body)
        except BadRequest as exc:
            return _bad_request(str(exc))
        except HTTPFault as fault:
            return _fault_response(fault)


async def maybe_await(value: T | Awaitable[T]) -> T:
    """The callback's result, whether it is a plain or a coroutine function."""
    if inspect.isawaitable(value):
        return await value
    return value


def _init_counters(app: FastAPI) -> None:
    """Request accounting of every stand-in; mutated only on the server's event loop."""
    app.state.calls = 0
    app.state.in_flight = 0
    app.state.max_in_flight = 0
    app.state.last_request = None  # {"headers": {...}, "json": {...}} of the latest POST


class _Track:
    """Counts one request and keeps the in-flight high-water mark (for concurrency tests)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def __enter__(self) -> None:
        state = self.app.state
        state.calls += 1
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)

    def __exit__(self, *exc: object) -> None:
        self.app.state.in_flight -= 1


def _fault_response(fault: HTTPFault) -> JSONResponse:
    """An error body shaped like OpenAI's, so clients can parse it the same way."""
    payload = {
        "error": {
            "message": fault.body or f"HTTP {fault.status}",
            "type": "loopback_fault",
            "code": fault.status,
        }
    }
    return JSONResponse(payload, status_code=fault.status, headers=fault.headers)


def _bad_request(message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "code": 400}},
        status_code=400,
    )
