"""The background work of a served app, run by a test on the app's own components: what the
background indexer (or an `earm worker`) would do, when the test's settings turn it off."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.ingest.indexer import index_all


def index_everything(client: TestClient) -> int:
    """Index the whole backlog of the client's app on its own sessions; how many were indexed."""
    assert client.portal is not None
    sessions = client.app.state.components.database.sessions  # type: ignore[attr-defined]
    return client.portal.call(index_all, sessions, 100)
