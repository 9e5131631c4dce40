"""Fixtures of the provider tests: loopback stand-ins of the providers' HTTP APIs, and a
loopback backend whose answers never end."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from service.testing import LoopbackServer
from tests.providers.raw_http import ServeTCP, read_request

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


#: What an endless backend's answer heads say about the body's end: ``chunked`` (chunks that
#: never stop), ``close`` (no length: the body would end with the connection, which it never
#: closes), ``length`` (a Content-Length of a terabyte) and ``declared`` (the same length, and
#: then no body at all, as if the backend were slow to send it).
FRAMINGS = {
    "chunked": b"Transfer-Encoding: chunked\r\n",
    "close": b"",
    "length": b"Content-Length: %d\r\n" % 2**40,
    "declared": b"Content-Length: %d\r\n" % 2**40,
}
PIECE = b'{"choices": [{"message": {"content": "0.5"}}], "padding": "' + b"x" * 16_000


@dataclass
class Sent:
    """One connection's answer: the body bytes written (whole pieces; ``sendall`` calls that
    returned), and whether the client closed the connection while the body was being sent;
    ``ended`` is set once the backend is done with the connection."""

    body: int = 0
    cut_off: bool = False
    ended: threading.Event = field(default_factory=threading.Event, repr=False)


@dataclass
class EndlessBackend:
    """An HTTP/1.1 backend on loopback that answers every request ``200`` with a body that
    never ends (``framing``, one of :data:`FRAMINGS`), until the client closes the connection.
    So that a client without a cap is not fed for ever, it stops at ``ceiling`` body bytes
    and closes the connection. One :class:`Sent` per connection, in ``connections``."""

    framing: str
    ceiling: int
    port: int = 0
    requests: int = 0
    connections: list[Sent] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def sent(self) -> list[Sent]:
        """The connections' answers, once the backend is done with each: its write that failed
        as the client hung up may still be under way when the client's call has returned."""
        for sent in self.connections:
            assert sent.ended.wait(30.0), "the backend is still writing"
        return self.connections

    def answer(self, stream: socket.socket, sent: Sent) -> None:
        stream.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                       + FRAMINGS[self.framing] + b"\r\n")
        if self.framing == "declared":
            stream.settimeout(5.0)  # the client has the head: it should hang up at once
            try:
                sent.cut_off = stream.recv(1) == b""
            except TimeoutError:
                pass
            except OSError:
                sent.cut_off = True
            return
        frame = (b"%x\r\n%s\r\n" % (len(PIECE), PIECE)) if self.framing == "chunked" else PIECE
        while sent.body < self.ceiling:
            try:
                stream.sendall(frame)
            except OSError:  # reset or broken pipe: the client hung up
                sent.cut_off = True
                return
            sent.body += len(PIECE)


@pytest.fixture
def tcp_server() -> Iterator[ServeTCP]:
    """Starts TCP servers on loopback, a thread per connection running the given function of
    it; every one stopped when the test ends. The hand-built backends below are made of it."""
    started: list[socketserver.ThreadingTCPServer] = []

    def serve(handle: Callable[[socket.socket], None]) -> int:
        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                handle(self.request)

        tcp = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        tcp.daemon_threads = True
        threading.Thread(target=tcp.serve_forever, daemon=True).start()
        started.append(tcp)
        return int(tcp.server_address[1])

    yield serve
    for tcp in started:
        tcp.shutdown()
        tcp.server_close()


@pytest.fixture
def endless_backend(tcp_server: ServeTCP) -> Callable[..., EndlessBackend]:
    """Starts :class:`EndlessBackend` servers, stopped when the test ends."""

    def start(framing: str, ceiling: int = 64 * 2**20) -> EndlessBackend:
        backend = EndlessBackend(framing, ceiling)

        def handle(stream: socket.socket) -> None:
            # A small send buffer: what the backend counts as sent is what left it.
            stream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
            sent = Sent()
            backend.connections.append(sent)
            try:
                if read_request(stream) is not None:
                    backend.requests += 1
                    backend.answer(stream, sent)
            finally:
                stream.close()
                sent.ended.set()

        backend.port = tcp_server(handle)
        return backend

    return start
