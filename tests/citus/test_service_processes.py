"""The service's work outside its requests on Citus: a full refit in the refit child process
(EARM_REFIT_PROCESS=child, the default), the indexing and refits of an `earm worker` process
for an API that does neither, and `earm namespace export` / `import`. The single-node tests
of the refit child and of the namespace transfer run here unchanged, on Citus databases."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import psycopg
import pytest

from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer
from service.testing.standby import libpq
from tests.cli.test_namespace_transfer import (
    exported,
    reranker,
    target,
    test_an_imported_namespace_answers_the_next_retrieves_as_the_original_does,
    test_import_as_another_name_keeps_every_row_under_new_ids,
)
from tests.retrieve.test_refit_process import (
    settings,
    test_a_child_process_refit_writes_the_model_an_in_process_refit_writes,
)
from tests.worker_processes import (
    NAMESPACE,
    REFIT_EVERY,
    Processes,
    ingest,
    retrieve,
    state,
    until,
)

# What pytest collects and uses from the modules above: their tests and the fixtures they need.
__all__ = [
    "exported",
    "reranker",
    "settings",
    "target",
    "test_a_child_process_refit_writes_the_model_an_in_process_refit_writes",
    "test_an_imported_namespace_answers_the_next_retrieves_as_the_original_does",
    "test_import_as_another_name_keeps_every_row_under_new_ids",
]


@pytest.fixture(scope="session")
def migrated_database(citus_database: Callable[[str], str]) -> Callable[[str], str]:
    """The namespace transfer's source and target: Citus databases."""
    return citus_database


def test_an_earm_worker_indexes_and_refits_what_the_api_leaves_it(
    clean_database: str, processes: Processes
) -> None:
    api_settings = Settings(database_url=clean_database, embedder="none", scorer="local",
                            background_work=False, refit_every=REFIT_EVERY, _env_file=None)
    rng = np.random.default_rng(0)
    with LoopbackServer(create_app(api_settings)) as api:
        ingest(api.url, rng, 0, 60)
        asked = [retrieve(api.url, rng, i) for i in range(REFIT_EVERY + 2)]
        before = state(clean_database)
        assert (before["unindexed"], before["last_refit_at"]) == (60, None)

        _, log = processes.start("worker", "worker")
        until(lambda: state(clean_database)["unindexed"] == 0, "the worker indexed the memories")
        until(lambda: state(clean_database)["last_refit_at"] is not None, "the worker refitted")
        after = state(clean_database)
        assert after["queries_since_refit"] < REFIT_EVERY
        assert (after["memories"], after["queries"]) == (60, len(asked))
        worked = log.read_text()
        assert "indexed memories" in worked and "refitted namespace" in worked
        assert retrieve(api.url, rng, len(asked)) not in asked
    with psycopg.connect(libpq(clean_database)) as conn:
        model_rows = conn.execute("SELECT count(*) FROM memory_factors WHERE namespace = %s",
                                  (NAMESPACE,)).fetchone()
    assert model_rows is not None and model_rows[0] > 0  # the worker's refit wrote its model
