"""The scorers' lean HTTP/1.1 connection against raw loopback servers that write the bytes a
backend may send: bodies by length, chunked and until the connection closes; keep-alive and its
end; answers that are not HTTP; TLS verified against the CA the environment names; and a proxy
in the environment, which hands the backend to httpx; and answers that never end, which both
connections cut off at their size cap."""

from __future__ import annotations

import asyncio
import socket
import socketserver
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import trustme
import uvloop

from service.providers.http1 import (
    Answer,
    ConnectionFailed,
    CookieJar,
    Http1Connection,
    HttpxConnection,
    connection_factory,
)

OK_BODY = b'{"ok": true}'
OK = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(OK_BODY), OK_BODY)

#: What the server does with one request on a connection: the bytes to answer, and whether to
#: close the connection afterwards.
Reply = Callable[[bytes], tuple[bytes, bool]]


@dataclass
class RawServer:
    """A TCP server on loopback that answers each request with ``reply``'s bytes verbatim;
    counts connections and keeps the requests' heads."""

    reply: Reply
    tls: ssl.SSLContext | None = None
    connections: int = 0
    heads: list[bytes] = field(default_factory=list)

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://localhost:{self.port}/v1/score"


def read_request(stream: socket.socket) -> bytes | None:
    """One request's head (its body read and dropped), or None at the connection's end."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = stream.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += stream.recv(65536)
    return head


@pytest.fixture
def raw_server() -> Iterator[Callable[..., RawServer]]:
    started: list[socketserver.ThreadingTCPServer] = []

    def start(reply: Reply, tls: ssl.SSLContext | None = None) -> RawServer:
        server = RawServer(reply, tls)

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                server.connections += 1
                stream = tls.wrap_socket(self.request, server_side=True) if tls else self.request
                while (head := read_request(stream)) is not None:
                    server.heads.append(head)
                    answer, close = server.reply(head)
                    stream.sendall(answer)
                    if close:
                        break
                stream.close()

        tcp = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        tcp.daemon_threads = True
        server.port = tcp.server_address[1]  # type: ignore[attr-defined]
        threading.Thread(target=tcp.serve_forever, daemon=True).start()
        started.append(tcp)
        return server

    yield start
    for tcp in started:
        tcp.shutdown()
        tcp.server_close()


def post_all(connection: Http1Connection | HttpxConnection, times: int,
             loop: str = "asyncio") -> list[Answer]:
    """``times`` requests one after another; on uvloop where asked (``earm serve`` runs on it,
    and its transports are not asyncio's classes)."""
    async def run() -> list[Answer]:
        try:
            return [await connection.post(b"{}", {"Content-Type": "application/json"})
                    for _ in range(times)]
        finally:
            await connection.aclose()

    if loop == "uvloop":
        return uvloop.run(run())
    return asyncio.run(run())


def lean(server: RawServer, keepalive_s: float = 4.0) -> Http1Connection:
    return Http1Connection(server.url, None, keepalive_s)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_keep_alive_answers_many_requests_on_one_connection(raw_server, loop: str) -> None:
    server = raw_server(lambda head: (OK, False))
    answers = post_all(lean(server), 3, loop)
    assert [a.json() for a in answers] == [{"ok": True}] * 3
    assert server.connections == 1
    assert server.heads[0].startswith(b"POST /v1/score HTTP/1.1\r\nHost: localhost:")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_chunked_and_connection_delimited_bodies_are_read_whole(raw_server, loop: str) -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"6\r\n{\"ok\":\r\n6\r\n true}\r\n0\r\n\r\n")
    until_close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + OK_BODY
    replies = iter([(chunked, False), (until_close, True), (OK, False)])
    server = raw_server(lambda head: next(replies))
    answers = post_all(lean(server), 3, loop)
    assert [a.json() for a in answers] == [{"ok": True}] * 3
    assert server.connections == 2  # the body that ended with its connection took it along


def test_a_connection_the_backend_closes_after_answering_is_reopened(raw_server) -> None:
    server = raw_server(lambda head: (OK, True))  # the server's keep-alive ends at once
    answers = post_all(lean(server), 3)
    assert [a.status for a in answers] == [200] * 3
    assert server.connections == 3


def test_an_idle_connection_is_replaced_after_the_keep_alive(raw_server) -> None:
    server = raw_server(lambda head: (OK, False))
    post_all(lean(server, keepalive_s=0.0), 2)
    assert server.connections == 2


def test_an_answer_that_is_not_http_fails_its_request_and_the_next_one_reconnects(
    raw_server,
) -> None:
    replies = iter([(b"SSH-2.0-OpenSSH\r\n\r\n", False), (OK, False)])
    server = raw_server(lambda head: next(replies))
    connection = lean(server)

    async def run() -> Answer:
        with pytest.raises(ConnectionFailed, match="not HTTP"):
            await connection.post(b"{}", {})
        return await connection.post(b"{}", {})

    assert asyncio.run(run()).status == 200
    assert server.connections == 2


def test_a_backend_that_closes_without_answering_fails_the_request(raw_server) -> None:
    server = raw_server(lambda head: (b"", True))
    with pytest.raises(ConnectionFailed, match="closed the connection"):
        post_all(lean(server), 1)


def test_nothing_listening_fails_the_request() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    connection = Http1Connection(f"http://127.0.0.1:{port}/v1", None, 4.0)
    with pytest.raises(ConnectionFailed, match="cannot connect"):
        post_all(connection, 1)


def test_tls_is_verified_against_the_ca_the_environment_names(
    raw_server, monkeypatch: pytest.MonkeyPatch, tmp_path,
) -> None:
    authority = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(server_tls)
    server = raw_server(lambda head: (OK, False), tls=server_tls)
    with pytest.raises(ConnectionFailed, match="CERTIFICATE_VERIFY_FAILED"):
        post_all(connection_factory(server.url, 4.0, 5.0)(), 1)  # type: ignore[arg-type]
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    connection = connection_factory(server.url, 4.0, 5.0)()
    assert isinstance(connection, Http1Connection)
    assert [a.json() for a in post_all(connection, 2)] == [{"ok": True}] * 2


def test_a_proxy_in_the_environment_sends_the_backend_through_httpx(
    raw_server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = raw_server(lambda head: (OK, False))
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
    backend = "http://scorer.invalid:8080/v1/score"
    connection = connection_factory(backend, 4.0, 5.0)()
    assert isinstance(connection, HttpxConnection)
    assert post_all(connection, 1)[0].json() == {"ok": True}
    assert proxy.heads[0].startswith(f"POST {backend} HTTP/1.1".encode())
    monkeypatch.setenv("NO_PROXY", "scorer.invalid")
    assert isinstance(connection_factory(backend, 4.0, 5.0)(), Http1Connection)


def test_the_cookie_jar_keeps_what_the_backend_set_until_it_expires_it() -> None:
    jar = CookieJar()
    jar.take(Answer(200, {}, b"", ("lb=node-2; Path=/; HttpOnly", "zone=a")))
    assert jar.header() == {"Cookie": "lb=node-2; zone=a"}
    jar.take(Answer(200, {}, b"", ("lb=; Max-Age=0", "not a cookie;;=")))
    assert jar.header() == {"Cookie": "zone=a"}


# --- answers over the size cap ----------------------------------------------------------------

#: The connections' default cap on an answer's body.
DEFAULT_CAP = 8 * 2**20
#: What a backend can have sent beyond what the client read when the client hangs up: its own
#: send buffer (64 KiB, the endless backend's), the client's receive queue, which Linux lets
#: grow with the receive window (net.ipv4.tcp_rmem) while the client's event loop is busy, and
#: the client's last read (256 KiB). Seen on loopback: up to 0.5 MiB; 4 MiB leaves room.
SLACK = 4 * 2**20


def connection_to(kind: str, url: str, **cap: int) -> Http1Connection | HttpxConnection:
    """The lean connection or the httpx one to ``url``, with its default cap unless given one."""
    if kind == "lean":
        return Http1Connection(url, None, 4.0, **cap)
    return HttpxConnection(url, httpx.create_ssl_context(), 4.0, 30.0, **cap)


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
@pytest.mark.parametrize(("kind", "loop"), [("lean", "asyncio"), ("lean", "uvloop"),
                                            ("httpx", "asyncio")])
def test_an_endless_answer_is_cut_off_past_the_cap_and_its_connection_closed(
    endless_backend, kind: str, loop: str, framing: str,
) -> None:
    backend = endless_backend(framing)
    with pytest.raises(ConnectionFailed, match=f"over {DEFAULT_CAP} bytes"):
        post_all(connection_to(kind, backend.url + "/v1/score"), 1, loop)
    [sent] = backend.sent()
    assert sent.cut_off, f"the client read {sent.body} bytes and did not hang up"
    if framing == "length":  # refused by its head: the body was never read
        assert sent.body <= SLACK, sent
    else:
        assert DEFAULT_CAP <= sent.body <= DEFAULT_CAP + SLACK, sent


@pytest.mark.parametrize("kind", ["lean", "httpx"])
def test_an_answer_declaring_a_length_over_the_cap_is_refused_before_its_body_comes(
    endless_backend, kind: str,
) -> None:
    backend = endless_backend("declared")  # the head, then nothing until the client hangs up
    with pytest.raises(ConnectionFailed, match=f"over {DEFAULT_CAP} bytes"):
        post_all(connection_to(kind, backend.url + "/v1/score"), 1)
    [sent] = backend.sent()
    assert sent.cut_off and sent.body == 0


@pytest.mark.parametrize("kind", ["lean", "httpx"])
def test_an_answer_of_exactly_the_cap_is_read_and_one_byte_more_is_refused(
    raw_server, kind: str,
) -> None:
    def chunked(body: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (
            len(body), body)

    def by_length(body: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    cap = 64
    at_cap, over_cap = b'"' + b"x" * (cap - 2) + b'"', b'"' + b"x" * (cap - 1) + b'"'
    replies = iter([chunked(at_cap), chunked(over_cap), by_length(at_cap), by_length(over_cap)])
    server = raw_server(lambda head: (next(replies), False))
    connection = connection_to(kind, server.url, max_answer_bytes=cap)

    async def run() -> list[Answer | str]:
        answers: list[Answer | str] = []
        for _ in range(4):
            try:
                answers.append(await connection.post(b"{}", {}))
            except ConnectionFailed as failed:
                answers.append(str(failed))
        await connection.aclose()
        return answers

    first, second, third, fourth = asyncio.run(run())
    assert isinstance(first, Answer) and first.content == at_cap
    assert second == fourth == f"the backend's answer is over {cap} bytes"
    assert isinstance(third, Answer) and third.content == at_cap
    assert server.connections == 2  # a connection whose answer was refused is not used again
