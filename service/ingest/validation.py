"""Request limits that pydantic cannot express: body size (an ASGI middleware) and metadata size
and depth. Every violation is answered in the JSON error format.

The body limit applies before anything parses the body: a ``Content-Length`` above
``EARM_MAX_BODY_BYTES`` is refused at once, and a body without one (chunked) is counted as it
streams in and refused as soon as it crosses the limit, so neither the JSON parser nor the
process memory ever sees more than the limit.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import InvalidInput, LimitExceeded

PAYLOAD_TOO_LARGE = "payload_too_large"


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a streamed body crosses the limit. FastAPI re-raises
    HTTPExceptions met while reading a body, so it reaches the app's error handler (413)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body exceeds {max_bytes} bytes (EARM_MAX_BODY_BYTES)")


class BodySizeLimit:
    """ASGI middleware: 413 ``payload_too_large`` for bodies over ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            try:
                too_large = int(declared) > self.max_bytes
            except ValueError:
                too_large = False  # the server rejects a malformed Content-Length itself
            if too_large:
                await self._refuse(send)
                return

        received = 0
        response_started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            # Read outside a FastAPI route (which would have answered already).
            if response_started:
                raise
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": {
                    "code": PAYLOAD_TOO_LARGE,
                    "message": f"the request body exceeds {self.max_bytes} bytes "
                    "(EARM_MAX_BODY_BYTES)",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
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
