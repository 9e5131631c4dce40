"""A live earm on loopback (real HTTP, real database) with two API keys, for the integrations."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from service.client import EarmClient
from service.http.app import create_app
from service.settings import Settings
from service.testing import LoopbackServer


@dataclass(frozen=True)
class LiveService:
    url: str
    #: Reaches the namespaces agent-*.
    agent_key: str = "integrations-agent-key-0123456789"
    #: Reaches every namespace.
    admin_key: str = "integrations-admin-key-0123456789"
    #: EARM_MCP_DEFAULT_NAMESPACE of the service.
    default_namespace: str = "agent-default"


@pytest.fixture
def service(clean_database: str) -> Iterator[LiveService]:
    """earm serving on 127.0.0.1 in a thread of this process, with its two keys seeded."""
    keys = LiveService(url="")
    settings = Settings(
        database_url=clean_database,
        api_keys=f"{keys.agent_key}=agent-*;{keys.admin_key}=*",
        mcp_default_namespace=keys.default_namespace,
        _env_file=None,
    )
    with LoopbackServer(create_app(settings)) as server:
        yield LiveService(url=server.url)


@pytest.fixture
def keyless_service(clean_database: str) -> Iterator[str]:
    """The URL of earm as `earm serve` first runs on a new machine: no API keys, so loopback
    clients are served without one. Refits run inside the request that makes them due: a
    script's next request comes within milliseconds, where a person's would find the
    background refit long done (a refit that overlaps feedback leaves the fed-back memory
    without a model row until it is next observed)."""
    settings = Settings(database_url=clean_database, _env_file=None)
    with LoopbackServer(create_app(settings, refit_in_request=True)) as server:
        yield server.url


@pytest.fixture
def agent_memories(service: LiveService) -> list[dict[str, Any]]:
    """Three memories stored in the namespace agent-1, each with its ``id``."""
    memories: list[dict[str, Any]] = [
        {
            "text": "My dog is called Rex and loves the beach.",
            "external_id": "dog",
            "metadata": {"topic": "pets"},
        },
        {"text": "I work night shifts as a nurse.", "occurred_at": "2023-06-01T08:00:00Z"},
        {"text": "We went camping at the lake in June."},
    ]
    with EarmClient(service.url, api_key=service.admin_key) as earm:
        ids = earm.add("agent-1", memories).ids
    return [memory | {"id": memory_id} for memory, memory_id in zip(memories, ids, strict=True)]
