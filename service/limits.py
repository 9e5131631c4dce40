"""Request limits that pydantic cannot express: body size and body read time (an ASGI
middleware) and metadata size and depth. Every violation is answered in the JSON error format.

The body limits apply before anything parses the body: a ``Content-Length`` above
``EARM_MAX_BODY_BYTES`` is refused at once, and a body without one (chunked) is counted as it
streams in and refused as soon as it crosses the limit, so neither the JSON parser nor the
process memory ever sees more than the limit. A body still incomplete ``EARM_BODY_TIMEOUT_S``
after its headers is answered 408, so a client trickling its body cannot hold a connection (the
time to send the headers is bounded by the server, ``service.server``).
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import InvalidInput, LimitExceeded

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


def storable_text_problem(value: str) -> str | None:
    """Why Postgres cannot store this string as text/JSONB, or None: NUL characters, and lone
    UTF-16 surrogates (legal in a JSON escape, not encodable as UTF-8)."""
    if "\x00" in value:
        return "contains a NUL (\\u0000) character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode)"
    return None


def _walk(value: Any) -> tuple[int, str | None]:
    """(nesting depth, first problem) of a JSON value, iteratively, so a hostile document
    cannot exhaust the stack. Depth: 0 for a scalar, 1 for a flat object or array."""
    deepest = 0
    problem: str | None = None
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            deepest = max(deepest, depth + 1)
            for key, child in node.items():
                if problem is None and (found := storable_text_problem(str(key))):
                    problem = f"a key {found}"
                stack.append((child, depth + 1))
        elif isinstance(node, list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in node)
        else:
            deepest = max(deepest, depth)
            if problem is None:
                if isinstance(node, str):
                    if found := storable_text_problem(node):
                        problem = f"a string {found}"
                elif isinstance(node, float) and not math.isfinite(node):
                    problem = "a number is NaN or infinite, which JSON cannot hold"
    return deepest, problem


def json_depth(value: Any) -> int:
    """Nesting depth of a JSON value: 0 for a scalar, 1 for a flat object or array."""
    return _walk(value)[0]


def check_metadata(value: dict[str, Any] | None, max_bytes: int, max_depth: int, what: str) -> None:
    """413 ``limit_exceeded`` when a metadata object (or a filter) is too large or too deep;
    422 ``invalid_input`` when Postgres could not store it as JSONB."""
    if value is None:
        return
    depth, problem = _walk(value)
    if depth > max_depth:
        raise LimitExceeded(f"{what} is nested {depth} levels deep; the limit is {max_depth}")
    if problem is not None:
        raise InvalidInput(f"{what}: {problem}")
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    if size > max_bytes:
        raise LimitExceeded(f"{what} takes {size} bytes as JSON; the limit is {max_bytes}")
