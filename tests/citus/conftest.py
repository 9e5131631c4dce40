"""The Citus tier: a coordinator and two workers on loopback (``service.testing.citus``), once
per test session (per xdist worker that runs these tests), with Citus built into the embedded
PostgreSQL first when it is not there. Where it cannot be built (no source beside the
checkout, no compiler) the tests skip and say which command makes them possible.

``database_url`` is overridden here: the product's fixtures (``clean_database``, ``settings``,
``client``, ``judge_settings``) run every test of this folder against the coordinator of a
Citus database that ``earm migrate``'s code distributed."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from service.db import migrate
from service.testing.citus import CitusCluster, ensure_built, start_cluster

DIM = 384


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.citus)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def citus_cluster() -> Iterator[CitusCluster]:
    # One build for every worker of the session: the others wait for it.
    why_not = ensure_built()
    if why_not is not None:
        pytest.skip(why_not)
    # Not under pytest's temporary root: the servers run as the embedded server's user, who
    # must reach their directories (and another pytest run may make that root 0700 again).
    directory = Path(tempfile.mkdtemp(prefix="earm-citus-"))
    cluster = start_cluster(directory)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def citus_database(citus_cluster: CitusCluster) -> Callable[[str], str]:
    """Factory of Citus databases migrated (and distributed) by ``earm migrate``'s code."""

    def create(name: str) -> str:
        url = citus_cluster.database(name)
        migrate.upgrade_to_head(url, DIM)
        return url

    return create


@pytest.fixture(scope="session")
def database_url(citus_database: Callable[[str], str]) -> str:
    return citus_database("earm_citus")
