"""Fixtures of the provider tests: loopback stand-ins of the providers' HTTP APIs."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from service.testing import LoopbackServer

#: Starts a loopback server for an ASGI app; the fixture stops every one when the test ends.
Serve = Callable[[object], LoopbackServer]


@pytest.fixture
def serve() -> Iterator[Serve]:
    servers: list[LoopbackServer] = []

    def start(app: object) -> LoopbackServer:
        server = LoopbackServer(app).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
