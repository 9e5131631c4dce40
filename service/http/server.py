"""How ``earm serve`` runs uvicorn.

- :class:`HeadTimeoutProtocol` bounds the time a request's line and headers may take to arrive
  (``EARM_HEADER_TIMEOUT_S``). uvicorn has no such bound: its keep-alive timeout covers only the
  wait between requests and every byte received resets it, so a client trickling its headers
  (or sending nothing at all) holds a connection forever. The body's time is bounded in the app
  (``service.http.middleware.BodyLimits``), which sees it arrive.
- :func:`run` enters the app's lifespan around the server rather than letting uvicorn run it
  inside: a configuration error raised at start-up then reaches the ``earm`` command as an
  exception, which it prints as one line, instead of uvicorn's logged traceback. It runs on the
  event loop uvicorn would pick (uvloop where it is installed), as ``earm serve --workers``
  does through ``uvicorn.run``.
- :func:`freeze_start_up_objects` takes what start-up built out of the garbage collector's full
  passes: ~200k objects, which each full pass walked (~200 ms with the event loop stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import logging
import socket
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.errors import ConfigurationError
from service.http.middleware import REQUEST_TIMEOUT
from service.logs import logging_config
from service.settings_groups import ObservabilitySettings, ServingSettings

log = logging.getLogger(__name__)


class HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol (httptools) that answers 408 and closes the connection when a
    request's head takes longer than ``head_timeout_s``: counted from the connection's start for
    its first request and from the first byte of each later one (the wait between requests is
    the keep-alive timeout's)."""

    def __init__(self, *args: Any, head_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s
        self._head_timer: asyncio.TimerHandle | None = None

    # The ignore: this is uvicorn's signature, which narrows asyncio's BaseTransport to Transport.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # a later request on a kept-alive connection
            self._arm_head_timer()

    def on_headers_complete(self) -> None:
        self._disarm_head_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        log.info(
            "closing a connection whose request head took over %g s (EARM_HEADER_TIMEOUT_S)",
            self.head_timeout_s,
            extra={"client": self.client[0] if self.client else None},
        )
        if self.cycle is not None and not self.cycle.response_complete:
            # The previous (pipelined) request is still being answered: close after it.
            self.cycle.keep_alive = False
            return
        self.transport.write(self._timeout_response())
        self.transport.close()

    def _timeout_response(self) -> bytes:
        message = (
            f"the request line and headers did not arrive within {self.head_timeout_s:g} s "
            "(EARM_HEADER_TIMEOUT_S)"
        )
        body = json.dumps({"error": {"code": REQUEST_TIMEOUT, "message": message}}).encode()
        head = (
            "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        return head.encode() + body


def uvicorn_options(settings: ServingSettings, logs: ObservabilitySettings) -> dict[str, Any]:
    """uvicorn's options for ``settings`` and ``logs`` (its access log is replaced by ours)."""
    return {
        "host": settings.host,
        "port": settings.port,
        "log_level": logs.log_level.lower(),
        "log_config": logging_config(logs.log_level, logs.access_log),
        "access_log": False,
        # A request that never ends (a wedged dependency) must not keep the process alive.
        "timeout_graceful_shutdown": settings.shutdown_timeout_s,
        # A partial of a module-level class: workers receive it pickled.
        "http": functools.partial(HeadTimeoutProtocol, head_timeout_s=settings.header_timeout_s),
    }


def freeze_start_up_objects() -> None:
    """Move every object alive now into the garbage collector's permanent generation.

    A serving process builds ~200k tracked objects at start-up (modules, the app, its routes,
    schemas and providers) and keeps them for its whole life. Each full collection walked them
    all, ~200 ms with the event loop stopped (measured in docs/performance.md); frozen, a full
    pass walks only what requests allocate since. The cost: a reference cycle among them that
    later becomes garbage is never collected (start-up objects live as long as the process
    anyway)."""
    gc.freeze()


def create_served_app() -> FastAPI:
    """:func:`~service.http.app.create_app` for the processes ``earm serve --workers`` starts
    (``uvicorn.run``'s factory, :data:`SERVED_APP_FACTORY`): the app, with the start-up objects
    frozen."""
    from service.http.app import create_app

    app = create_app()
    freeze_start_up_objects()
    return app


#: Where ``uvicorn.run`` (and ``uvicorn --factory``) finds :func:`create_served_app`.
SERVED_APP_FACTORY = f"{__name__}:{create_served_app.__name__}"


def run(app: FastAPI, settings: ServingSettings, logs: ObservabilitySettings) -> None:
    """Serve ``app`` until SIGINT or SIGTERM: the address is checked first (a
    :class:`ConfigurationError` if it is taken), then the app's lifespan starts (and raises what
    it raises), the server binds, and the lifespan shuts down after the server has stopped."""
    config = uvicorn.Config(app, lifespan="off", **uvicorn_options(settings, logs))
    server = uvicorn.Server(config)
    check_address_free(settings.host, settings.port)

    async def serve() -> None:
        async with app.router.lifespan_context(app):
            if not server.should_exit:  # not stopped during the start-up
                freeze_start_up_objects()
                await server.serve()

    # uvicorn's signal handling from the start, so a signal during the app's start-up or
    # shutdown also stops the server and lets the lifespan finish; uvicorn raises the signal
    # again at the end, for Python's handlers, as `uvicorn.run` does. The loop is the one
    # `uvicorn.run` would make (uvloop where installed): asyncio.run would make asyncio's own,
    # on which a database round trip takes ~30 % longer (docs/perf/event_loop.py).
    with (
        contextlib.suppress(KeyboardInterrupt),
        server.capture_signals(),
        asyncio.Runner(loop_factory=config.get_loop_factory()) as runner,
    ):
        runner.run(serve())


def check_address_free(host: str, port: int) -> None:
    """A :class:`ConfigurationError` if ``host``:``port`` cannot be bound, tried as uvicorn binds.

    Checked before the app starts so that a taken port is one plain error at once, not uvicorn's
    exit from inside the running app (an exception group of the app's task groups) after Postgres
    had started for nothing. The address is let go again: uvicorn binds it itself, logging where
    it listens (it does not for a socket it is handed)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family=family, type=socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ConfigurationError(
                f"cannot listen on {host}:{port}: {error.strerror}; stop what serves there, or "
                "give earm another port (--port, EARM_PORT)"
            ) from None


def check_start_up(app: FastAPI) -> None:
    """Start and stop ``app`` once, raising what its start-up raises; ``earm serve --workers``
    does it before starting workers that would otherwise each fail in turn."""

    async def start_and_stop() -> None:
        async with app.router.lifespan_context(app):
            pass

    asyncio.run(start_and_stop())
