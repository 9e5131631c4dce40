"""What wraps every request before a handler sees it, and after.

- :class:`BodyLimits` (ASGI middleware): the body limits apply before anything parses the
  body: a ``Content-Length`` above ``EARM_MAX_BODY_BYTES`` is refused at once, and a body
  without one (chunked) is counted as it streams in and refused as soon as it crosses the
  limit, so neither the JSON parser nor the process memory ever sees more than the limit. A
  body still incomplete ``EARM_BODY_TIMEOUT_S`` after its headers is answered 408, so a client
  trickling its body cannot hold a connection (the time to send the headers is bounded by the
  server, ``service.http.server``).
- :class:`FastJSONRoute`: request bodies parsed by pydantic-core's JSON parser instead of the
  standard library's (below).
- :class:`RequestObservabilityMiddleware` (ASGI middleware): request id (``X-Request-ID``
  accepted when sane, generated otherwise, echoed in the response), request count and latency
  by route template and status, and one JSON log line per request, with the fields a router
  added with :func:`annotate` (namespace, policy, scorer calls; never memory text, query text
  or keys).

Why the JSON parser: FastAPI reads a JSON body with ``Request.json()`` (``json.loads``) and then
validates the Python objects. For an ingest batch of 1,000 memories of 384-d embeddings (about 4
MB of floats), ``json.loads`` took 45–60 ms, most of the service's CPU per batch; ``from_json``
(Rust) takes 22–30 ms for the same objects (NaN and Infinity literals included, which the checks
then reject with a clear 422). A document it refuses goes to ``json.loads``, which has the last
word: JSON that only the standard library takes (escaped lone surrogates, which the text checks
turn into a 422) keeps working, and a body neither reads raises :class:`json.JSONDecodeError`,
FastAPI's 400 ``malformed_json``, with pydantic-core's reason. (``json.loads`` refuses nesting
past the recursion limit and integers of more than 4300 digits with other errors, which FastAPI
would answer with a bare 400 ``http_error``.) A body that is not UTF-8 is refused the same way,
before ``json.loads``, which would have read UTF-16 and UTF-32 too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.logs import ACCESS_LOGGER, current_request_id
from service.metrics import Metrics

# ------------------------------------------------------------------------------ body limits

PAYLOAD_TOO_LARGE = "payload_too_large"
REQUEST_TIMEOUT = "request_timeout"


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a streamed body crosses the limit. FastAPI re-raises
    HTTPExceptions met while reading a body, so it reaches the app's error handler (413)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body exceeds {max_bytes} bytes (EARM_MAX_BODY_BYTES)")


class BodyReadTimeout(HTTPException):
    """Raised from ``receive`` when the body has not arrived within the body timeout; like
    :class:`BodyTooLarge`, it reaches the app's error handler (408)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            408, f"the request body did not arrive within {timeout_s:g} s (EARM_BODY_TIMEOUT_S)"
        )


def _declares_body(headers: Headers) -> bool:
    return "transfer-encoding" in headers or headers.get("content-length", "0").strip() != "0"


class BodyLimits:
    """ASGI middleware: 413 ``payload_too_large`` for bodies over ``max_bytes``, 408
    ``request_timeout`` for bodies not received whole within ``timeout_s``. A response that
    starts before its request's body was read whole closes the connection, so the server stops
    reading (or waiting for) the rest."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        if declared is not None:
            try:
                too_large = int(declared) > self.max_bytes
            except ValueError:
                too_large = False  # the server rejects a malformed Content-Length itself
            if too_large:
                await self._refuse(send, BodyTooLarge(self.max_bytes), PAYLOAD_TOO_LARGE)
                return

        # The app is called once the headers are in: the whole body is due by then + timeout_s.
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        received = 0
        body_complete = not _declares_body(headers)
        response_started = False

        async def limited_receive() -> Message:
            nonlocal received, body_complete
            if body_complete:
                return await receive()  # e.g. waiting for http.disconnect: not a body read
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise BodyReadTimeout(self.timeout_s) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
                body_complete = not message.get("more_body", False)
            return message

        async def closing_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
                if not body_complete:
                    MutableHeaders(scope=message)["connection"] = "close"
            await send(message)

        try:
            await self.app(scope, limited_receive, closing_send)
        except (BodyTooLarge, BodyReadTimeout) as exc:
            # Read outside a FastAPI route (which would have answered already).
            if response_started:
                raise
            code = PAYLOAD_TOO_LARGE if isinstance(exc, BodyTooLarge) else REQUEST_TIMEOUT
            await self._refuse(send, exc, code)

    async def _refuse(self, send: Send, error: HTTPException, code: str) -> None:
        body = json.dumps({"error": {"code": code, "message": error.detail}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": error.status_code,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


# ---------------------------------------------------------------------------- JSON bodies


class FastJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = pydantic_core.from_json(body)
            except ValueError as fast_error:
                self._json = _standard_json(body, fast_error)
        return self._json


def _standard_json(body: bytes, fast_error: ValueError) -> Any:
    """``json.loads``'s reading of a body pydantic-core refused, or JSONDecodeError."""
    try:
        # JSON text is UTF-8 (RFC 8259; a byte order mark is ignored). Given bytes, json.loads
        # would also guess UTF-16 or UTF-32 from the first bytes and read them.
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError(f"not UTF-8 ({exc.reason} at byte {exc.start})", "", 0) from exc
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        # pydantic-core's reason, which has the line and column
        raise json.JSONDecodeError(str(fast_error), "", 0) from exc


class FastJSONRoute(APIRoute):
    """Route class of the routers that take JSON bodies (FastAPI's documented way to use a
    custom ``Request``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def fast_json_handler(request: Request) -> Response:
            return await handler(FastJSONRequest(request.scope, request.receive))

        return fast_json_handler


REQUEST_ID_HEADER = "X-Request-ID"
#: A client's request id is kept if it looks like an id (no spaces, no control characters).
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/+=@-]{1,128}$")
#: Label of requests that matched no route (keeps the label set bounded).
UNMATCHED_ROUTE = "<unmatched>"
_LOG_FIELDS = "log_fields"


# ------------------------------------------------------------------------ request context


def annotate(request: Request, **fields: Any) -> None:
    """Add fields to this request's log line (namespace, policy, scorer_calls, ...). Never
    memory text, query text or keys."""
    state = request.scope.setdefault("state", {})
    state.setdefault(_LOG_FIELDS, {}).update(fields)


def annotated(request: Request) -> dict[str, Any]:
    """The fields :func:`annotate` has added to this request's log line so far."""
    fields: dict[str, Any] = request.scope.get("state", {}).get(_LOG_FIELDS, {})
    return fields


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            candidate: str = value.decode("latin-1")  # ASGI header values are bytes
            if _SANE_REQUEST_ID.match(candidate):
                return candidate
            break
    return uuid.uuid4().hex


def route_template(scope: Scope) -> str:
    """The template of the route that answered, under the paths its application is mounted at:
    the dashboard's ``/namespaces/{namespace}`` is ``/dashboard/namespaces/{namespace}`` (not
    the API's route of that name); a request a mounted application matched no route of is
    labelled with its mount path (``/dashboard/static``, ``/dashboard``)."""
    # Each Mount on the way appends its path to root_path; app_root_path is the root_path the
    # server gave, set by the first Mount.
    root_path: str = scope.get("root_path", "")
    mounted_at = root_path[len(scope.get("app_root_path", root_path)) :]
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str) and not isinstance(route, Mount):
        return mounted_at + path
    return mounted_at or UNMATCHED_ROUTE


class RequestObservabilityMiddleware:
    """Request id, HTTP metrics and one access log line per HTTP request (pure ASGI, so it
    neither buffers bodies nor breaks streaming)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, logger_name: str = ACCESS_LOGGER) -> None:
        self.app = app
        self.metrics = metrics
        self.logger = logging.getLogger(logger_name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = _request_id(scope)
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        status = 500  # if the app raises before answering, the server answers 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        token = current_request_id.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            current_request_id.reset(token)
            duration_s = time.perf_counter() - started
            route = route_template(scope)
            method = scope.get("method", "GET")
            self.metrics.observe_request(method, route, status, duration_s)
            fields = {
                "method": method,
                "path": route,
                "status": status,
                "duration_ms": round(duration_s * 1000.0, 3),
                "request_id": request_id,
                **state.get(_LOG_FIELDS, {}),
            }
            self.logger.log(
                logging.WARNING if status >= 500 else logging.INFO, "request", extra=fields
            )
