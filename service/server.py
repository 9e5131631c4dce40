"""How ``earm serve`` runs uvicorn.

:func:`run` enters the app's lifespan around the server rather than letting uvicorn run it
inside: a configuration error raised at start-up then reaches the ``earm`` command as an
exception, which it prints as one line, instead of uvicorn's logged traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import uvicorn
from fastapi import FastAPI

from service.observability import logging_config
from service.settings import Settings


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for ``settings`` (its access log is replaced by ours)."""
    return {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level.lower(),
        "log_config": logging_config(settings.log_level),
        "access_log": False,
    }


def run(app: FastAPI, settings: Settings) -> None:
    """Serve ``app`` until SIGINT or SIGTERM: its lifespan starts before the server binds (and
    raises what it raises) and shuts down after the server has stopped."""
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", **uvicorn_options(settings)))

    async def serve() -> None:
        async with app.router.lifespan_context(app):
            if not server.should_exit:  # not stopped during the start-up
                await server.serve()

    # uvicorn's signal handling from the start, so a signal during the app's start-up or
    # shutdown also stops the server and lets the lifespan finish; uvicorn raises the signal
    # again at the end, for Python's handlers, as `uvicorn.run` does.
    with contextlib.suppress(KeyboardInterrupt), server.capture_signals():
        asyncio.run(serve())


def check_start_up(app: FastAPI) -> None:
    """Start and stop ``app`` once, raising what its start-up raises; ``earm serve --workers``
    does it before starting workers that would otherwise each fail in turn."""

    async def start_and_stop() -> None:
        async with app.router.lifespan_context(app):
            pass

    asyncio.run(start_and_stop())
