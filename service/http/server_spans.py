"""The server span of each HTTP request (pure ASGI middleware, outermost, so the span covers
every other middleware's work too): a child of the caller's span when the request carries W3C
trace context, else a new trace's root. The request runs with the app's tracing current
(``service.tracing.traced_by``), so the spans below it, and the trace context sent on to the
scorer, belong to this trace. With tracing off, a request passes straight through."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.http.middleware import route_template
from service.tracing import Tracing, traced_by


class ServerSpans:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Set by the lifespan (service.http.app); the app's state, not this middleware's,
        # because middleware is built before the lifespan runs.
        tracing: Tracing = scope["app"].state.tracing
        if not tracing.enabled:
            await self.app(scope, receive, send)
            return
        method: str = scope.get("method", "GET")
        headers = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in scope["headers"]}
        status = 500  # if the app raises before answering, the server answers 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        attributes = {
            "http.request.method": method,
            "url.path": scope.get("path", ""),
            "url.scheme": scope.get("scheme", "http"),
        }
        with tracing.server_span(method, headers, attributes) as span, traced_by(tracing):
            try:
                await self.app(scope, receive, send_status)
            finally:
                route = route_template(scope)
                span.rename(f"{method} {route}")
                span.set({"http.route": route, "http.response.status_code": status})
                if status >= 500:  # a 4xx is the caller's error, not the server's
                    span.fail(str(status))
