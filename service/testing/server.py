"""The loopback server that serves a stand-in, and the fault a stand-in's callback raises."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import uvicorn

logger = logging.getLogger(__name__)


class LoopbackServer:
    """Runs an ASGI app with uvicorn on 127.0.0.1 in a daemon thread; a context manager.

    A separate thread with its own event loop (rather than a task on the caller's loop) lets the
    same server serve synchronous benchmark code, ``asyncio.run`` based tests and several client
    event loops in turn, and keeps a slow stand-in from stalling the client under test.
    ``port=0`` asks the OS for a free port; the port actually bound is read back from the
    listening socket, so parallel test runs never collide.
    """

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, loop: str = "asyncio"
    ) -> None:
        self.app = app
        self.loop = loop
        self.host = host
        self.port = port
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout_s: float = 10.0) -> LoopbackServer:
        """Start serving; returns once the server accepts connections."""
        if self._thread is not None:
            raise RuntimeError("LoopbackServer already started")
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self.port,
            loop=self.loop,
            log_level="warning",
            lifespan="on",
            # Stand-ins may be sleeping in a handler to simulate a hung provider; do not let
            # that hold up stop() for the whole simulated latency.
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="loopback-server", daemon=True)
        self._server, self._thread = server, thread
        thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"loopback server failed to start on {self.host}:{self.port}")
            if time.monotonic() > deadline:
                server.should_exit = True
                raise RuntimeError(f"loopback server did not start within {timeout_s} s")
            time.sleep(0.005)
        sockname = server.servers[0].sockets[0].getsockname()
        self.port = int(sockname[1])
        self.url = f"http://{self.host}:{self.port}"
        logger.debug("loopback server listening on %s", self.url)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit and wait for its thread; idempotent."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning("loopback server on %s did not stop within %s s", self.url, timeout_s)
        self._server = None
        self._thread = None

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class HTTPFault(Exception):
    """Raised by a reply/embed/rerank callback to answer with an HTTP error instead of a result.

    ``headers`` lets a stand-in send e.g. ``Retry-After`` with a 429, as real providers do.
    """

    def __init__(
        self, status: int, body: str = "", headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body
        self.headers = dict(headers or {})
