"""A lean ``/rerank`` backend of a fixed latency, for benchmarks that time it.

A backend of latency L should answer L after a request reaches it. The FastAPI stand-in of
:func:`service.testing.rerank_app` adds its own cost to L: uvicorn's parsing, routing,
reading the body before the callback starts the clock, encoding the answer after it, and an event
loop timer that fires up to a millisecond late (``docs/perf/rerank_rtt.py`` measured ~1.3 ms).
This server stamps a request when its first line arrives, works out the whole response (the
same protocol as :func:`~service.testing.rerank_app`: shared request parsing and response
shape) while it waits, and sends it in one write at ``arrival + L``, waiting with
``time.sleep`` (a thread per connection), which wakes within tens of microseconds.

It speaks HTTP/1.1 (keep-alive, ``Content-Length`` bodies) through the standard library's
:mod:`http.server`; only ``POST`` to the rerank paths is served.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from service.testing import RERANK_PATHS, rerank_request, rerank_response

__all__ = ["RerankServer", "ScoreFn"]

#: (query, documents) -> one raw score per document (``None``: left out), without latency.
ScoreFn = Callable[[str, list[str]], "list[float | None]"]


class RerankServer:
    """``POST /rerank`` (``/v1/rerank``, ``/v2/rerank``) on 127.0.0.1 answered with ``scores``
    ``latency_s()`` seconds after each request arrives (read per request, so a run can change
    it); a context manager serving from a daemon thread. ``url`` once started."""

    def __init__(
        self,
        scores: ScoreFn,
        latency_s: Callable[[], float],
        protocol: str = "rerank",
        model: str = "loopback-reranker",
    ) -> None:
        handler = type(
            "Handler",
            (_RerankHandler,),
            {"scores": staticmethod(scores), "latency_s": staticmethod(latency_s),
             "protocol": protocol, "model": model},
        )
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
            name="rerank-server", daemon=True,
        )

    def __enter__(self) -> RerankServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class _RerankHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the scorer's pooled connections expect
    wbufsize = 1 << 20  # buffered: the status line, headers and body leave in one write
    scores: ScoreFn
    latency_s: Callable[[], float]
    protocol: str
    model: str
    arrived = 0.0

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def parse_request(self) -> bool:
        # Called as soon as the request line has been read: the request's arrival.
        self.arrived = time.monotonic()
        return super().parse_request()

    def do_POST(self) -> None:
        if self.path not in RERANK_PATHS:
            self._reply(404, {"error": {"message": f"no route {self.path}", "code": 404}})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            query, documents = rerank_request(body, self.protocol)
        except ValueError as exc:
            self._reply(400, {"error": {"message": str(exc), "type": "invalid_request_error",
                                        "code": 400}})
            return
        answer = rerank_response(
            body, documents, self.scores(query, documents), self.protocol, self.model
        )
        self._reply(200, answer, answer_at=self.arrived + self.latency_s())

    def _reply(self, status: int, payload: Any, answer_at: float = 0.0) -> None:
        content = json.dumps(payload).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)
        delay = answer_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        # handle_one_request flushes the buffered response after this method returns.

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        """Quiet: a benchmark's server logs nothing per request."""
