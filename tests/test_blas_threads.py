"""Each earm process runs numpy's BLAS on one thread (service/cpu.py): the serving app from its
start-up on, and a refit child from its start. Each test first gives BLAS two threads, so it
fails where nothing limits them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from threadpoolctl import threadpool_info, threadpool_limits

from service.http.app import create_app
from service.retrieve.refit_process import ChildRefits
from service.settings import Settings


def blas_threads(info: list[dict]) -> set[int]:
    return {library["num_threads"] for library in info if library["user_api"] == "blas"}


@pytest.fixture
def two_blas_threads() -> Iterator[None]:
    """BLAS on two threads for the test, as numpy starts on a machine of two cores or more."""
    with threadpool_limits(limits=2, user_api="blas"):
        if blas_threads(threadpool_info()) != {2}:
            pytest.skip("BLAS cannot run two threads here (one core)")
        yield


def test_the_serving_app_runs_blas_on_one_thread(
    two_blas_threads: None, settings: Settings
) -> None:
    with TestClient(create_app(settings)) as client:
        assert client.get("/healthz").status_code == 200
        assert blas_threads(threadpool_info()) == {1}


def test_a_refit_child_runs_blas_on_one_thread(
    two_blas_threads: None, settings: Settings
) -> None:
    """The child starts from the fork server with the parent's environment, not its limits."""
    refits = ChildRefits(settings.database_url, settings.learning)
    try:
        child_info = refits._start().submit(threadpool_info).result(timeout=60)
    finally:
        refits.close()
    assert blas_threads(child_info) == {1}
