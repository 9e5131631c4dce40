"""How ``earm serve`` runs the app (service/http/server.py): on uvicorn's choice of event loop,
with the start-up objects frozen out of the garbage collector's full passes."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from fastapi import FastAPI
from uvicorn.importer import import_from_string

from service.http import server
from service.settings import Settings


@pytest.fixture
def served_once(settings: Settings) -> Iterator[dict[str, Any]]:
    """Serve an app with :func:`server.run` until its first second of serving is over, as
    ``earm serve`` does, and say what the process looked like while it served."""
    seen: dict[str, Any] = {}

    def look_and_stop() -> None:
        seen["loop"] = type(asyncio.get_running_loop())
        seen["frozen"] = gc.get_freeze_count()
        os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C stops `earm serve`

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        asyncio.get_running_loop().call_later(1.0, look_and_stop)
        yield

    try:
        served = settings.model_copy(update={"port": 0})
        server.run(FastAPI(lifespan=lifespan), served.serving, served.observability)
        yield seen
    finally:
        gc.unfreeze()  # the rest of the test session collects as usual


def test_earm_serve_runs_on_the_event_loop_uvicorn_picks(served_once: dict[str, Any]) -> None:
    uvloop = pytest.importorskip("uvloop")  # uvicorn[standard] installs it where it runs
    assert served_once["loop"] is uvloop.Loop


def test_earm_serve_freezes_its_start_up_objects_before_serving(
    served_once: dict[str, Any],
) -> None:
    # What start-up built (this test process's imports, the app) is out of the full passes.
    assert served_once["frozen"] > 10_000


def test_the_factory_of_earm_serve_workers_freezes_the_app_it_builds() -> None:
    factory = import_from_string(server.SERVED_APP_FACTORY)  # as uvicorn.run finds it
    try:
        assert isinstance(factory(), FastAPI)
        assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()
