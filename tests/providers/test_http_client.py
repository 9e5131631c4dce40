"""The scorers' HTTP client against raw loopback servers that write the bytes a backend may
send: bodies by length, chunked and until the connection closes; keep-alive and its end; answers
that are not HTTP; TLS verified against the CA the environment names; a proxy in the
environment; cookies set by the backend; answers that never end, which the client cuts off at
its size cap; a backend whose listen backlog is small, which the pool's bounds spare; and the
backend's time of an answer, from its request sent."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import trustme
import uvloop

from service.providers.chat_scorer import OpenAIChatScorer
from service.providers.http_client import Answer, ConnectionFailed, PoolLimits, ScorerClient
from tests.providers.raw_http import ServeTCP, read_request, read_request_async

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
    port: int = 0

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://localhost:{self.port}/v1/score"


@pytest.fixture
def raw_server(tcp_server: ServeTCP) -> Callable[..., RawServer]:
    def start(reply: Reply, tls: ssl.SSLContext | None = None) -> RawServer:
        server = RawServer(reply, tls)

        def handle(connection: socket.socket) -> None:
            server.connections += 1
            stream = tls.wrap_socket(connection, server_side=True) if tls else connection
            while (head := read_request(stream)) is not None:
                server.heads.append(head)
                answer, close = server.reply(head)
                stream.sendall(answer)
                if close:
                    break
            stream.close()

        server.port = tcp_server(handle)
        return server

    return start


def post_all(connection: ScorerClient, times: int, loop: str = "asyncio") -> list[Answer]:
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


def client(server: RawServer, keepalive_s: float = 4.0, **cap: int) -> ScorerClient:
    return ScorerClient(server.url, PoolLimits(keepalive_s=keepalive_s), **cap)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_keep_alive_answers_many_requests_on_one_connection(raw_server, loop: str) -> None:
    server = raw_server(lambda head: (OK, False))
    answers = post_all(client(server), 3, loop)
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
    answers = post_all(client(server), 3, loop)
    assert [a.json() for a in answers] == [{"ok": True}] * 3
    assert server.connections == 2  # the body that ended with its connection took it along


def test_a_connection_the_backend_closes_after_answering_is_reopened(raw_server) -> None:
    server = raw_server(lambda head: (OK, True))  # the server's keep-alive ends at once
    answers = post_all(client(server), 3)
    assert [a.status for a in answers] == [200] * 3
    assert server.connections == 3


def test_an_idle_connection_is_replaced_after_the_keep_alive(raw_server) -> None:
    server = raw_server(lambda head: (OK, False))
    post_all(client(server, keepalive_s=0.0), 2)
    assert server.connections == 2


def test_an_answer_that_is_not_http_fails_its_request_and_the_next_one_reconnects(
    raw_server,
) -> None:
    replies = iter([(b"SSH-2.0-OpenSSH\r\n\r\n", False), (OK, False)])
    server = raw_server(lambda head: next(replies))
    connection = client(server)

    async def run() -> Answer:
        with pytest.raises(ConnectionFailed, match="Bad status line"):
            await connection.post(b"{}", {})
        return await connection.post(b"{}", {})

    assert asyncio.run(run()).status == 200
    assert server.connections == 2


def test_a_backend_that_closes_without_answering_fails_the_request(raw_server) -> None:
    server = raw_server(lambda head: (b"", True))
    with pytest.raises(ConnectionFailed, match="Server disconnected"):
        post_all(client(server), 1)
    assert server.connections == 2  # once more on a new connection, as a stale one is


def test_nothing_listening_fails_the_request() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    connection = ScorerClient(f"http://127.0.0.1:{port}/v1", PoolLimits())
    with pytest.raises(ConnectionFailed, match="Cannot connect"):
        post_all(connection, 1)


def test_tls_is_verified_against_the_ca_the_environment_names(
    raw_server, monkeypatch: pytest.MonkeyPatch, tmp_path,
) -> None:
    authority = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(server_tls)
    server = raw_server(lambda head: (OK, False), tls=server_tls)
    with pytest.raises(ConnectionFailed, match="CERTIFICATE_VERIFY_FAILED"):
        post_all(client(server), 1)
    bundle = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(bundle))
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    assert [a.json() for a in post_all(client(server), 2)] == [{"ok": True}] * 2
    assert server.connections == 2  # the refused handshake's, then one kept alive


def test_a_proxy_in_the_environment_carries_the_requests_unless_no_proxy_names_the_backend(
    raw_server, monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy, backend = raw_server(lambda head: (OK, False)), raw_server(lambda head: (OK, False))
    for name in ("http_proxy", "no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
    assert post_all(client(backend), 1)[0].json() == {"ok": True}
    assert proxy.heads[0].startswith(f"POST {backend.url} HTTP/1.1".encode())
    monkeypatch.setenv("NO_PROXY", "localhost")
    post_all(client(backend), 1)
    assert (len(proxy.heads), len(backend.heads)) == (1, 1)


def test_cookies_the_backend_sets_are_sent_back_until_it_expires_them(raw_server) -> None:
    sets = iter([b"Set-Cookie: lb=node-2; Path=/; HttpOnly\r\nSet-Cookie: zone=a\r\n",
                 b"Set-Cookie: lb=; Path=/; Max-Age=0\r\n", b""])
    server = raw_server(lambda head: (OK.replace(b"\r\n\r\n", b"\r\n" + next(sets) + b"\r\n"),
                                      False))
    post_all(client(server), 3)
    cookies = [next((line for line in head.split(b"\r\n") if line.startswith(b"Cookie:")), b"")
               for head in server.heads]
    assert cookies == [b"", b"Cookie: lb=node-2; zone=a", b"Cookie: zone=a"]


# --- answers over the size cap ----------------------------------------------------------------

#: The client's default cap on an answer's body.
DEFAULT_CAP = 8 * 2**20
#: What a backend can have sent beyond what the client read when the client hangs up: its own
#: send buffer (64 KiB, the endless backend's), the client's receive queue, which Linux lets
#: grow with the receive window (net.ipv4.tcp_rmem) while the client's event loop is busy, and
#: the client's last read (256 KiB). Seen on loopback: up to 0.5 MiB; 4 MiB leaves room.
SLACK = 4 * 2**20


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_endless_answer_is_cut_off_past_the_cap_and_its_connection_closed(
    endless_backend, loop: str, framing: str,
) -> None:
    backend = endless_backend(framing)
    with pytest.raises(ConnectionFailed, match=f"over {DEFAULT_CAP} bytes"):
        post_all(ScorerClient(backend.url + "/v1/score", PoolLimits()), 1, loop)
    [sent] = backend.sent()
    assert sent.cut_off, f"the client read {sent.body} bytes and did not hang up"
    if framing == "length":  # refused by its head: the body was never read
        assert sent.body <= SLACK, sent
    else:
        assert DEFAULT_CAP <= sent.body <= DEFAULT_CAP + SLACK, sent


def test_an_answer_declaring_a_length_over_the_cap_is_refused_before_its_body_comes(
    endless_backend,
) -> None:
    backend = endless_backend("declared")  # the head, then nothing until the client hangs up
    with pytest.raises(ConnectionFailed, match=f"over {DEFAULT_CAP} bytes"):
        post_all(ScorerClient(backend.url + "/v1/score", PoolLimits()), 1)
    [sent] = backend.sent()
    assert sent.cut_off and sent.body == 0


def test_an_answer_of_exactly_the_cap_is_read_and_one_byte_more_is_refused(raw_server) -> None:
    def chunked(body: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (
            len(body), body)

    def by_length(body: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    cap = 64
    at_cap, over_cap = b'"' + b"x" * (cap - 2) + b'"', b'"' + b"x" * (cap - 1) + b'"'
    replies = iter([chunked(at_cap), chunked(over_cap), by_length(at_cap), by_length(over_cap)])
    server = raw_server(lambda head: (next(replies), False))
    connection = client(server, max_answer_bytes=cap)

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


# --- a backend with a small listen backlog ----------------------------------------------------


def retransmits(sock: socket.socket) -> int:
    """The TCP segments ``sock`` sent again (Linux's ``tcpi_total_retrans``): on a connected
    socket, its SYN's retransmits; on an accepted one, its SYN-ACK's (the kernel drops a
    handshake's last ACK while the listen backlog is full, and the server sends its SYN-ACK
    again after 1 s)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int(struct.unpack_from("I", info, 100)[0])


class BacklogJudge:
    """A chat-completions judge on loopback whose listen backlog is 5, as Python's http.server's:
    connects beyond it are dropped by the kernel and retried after 1 s. It answers each request
    after ``delay_s`` on its own event loop (a daemon thread), counts the connections it
    accepted and their handshakes' retransmits."""

    BACKLOG = 5

    def __init__(self, delay_s: float = 0.003) -> None:
        self.delay_s = delay_s
        self.accepted = 0
        self.retransmits = 0
        self.url = ""
        self._ready = threading.Event()
        threading.Thread(target=asyncio.run, args=(self._serve_forever(),), daemon=True).start()
        assert self._ready.wait(10)

    async def _serve_forever(self) -> None:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=self.BACKLOG)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._ready.set()
        await server.serve_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.retransmits += retransmits(writer.get_extra_info("socket"))
        body = b'{"choices": [{"message": {"content": "0.5"}}]}'
        try:
            while True:
                await read_request_async(reader)
                await asyncio.sleep(self.delay_s)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


class ConnectCountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the connects in flight on it (aiohttp connects its sockets
    through ``sock_connect``), the most there ever were (the pool's bound, on connections
    opened and not answered yet, is stricter) and their SYNs' retransmits."""

    in_flight = most = retransmits = 0

    async def sock_connect(self, sock: socket.socket, address: Any) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await super().sock_connect(sock, address)
            self.retransmits += retransmits(sock)
        finally:
            self.in_flight -= 1


def test_a_scoring_call_of_200_requests_spares_a_small_backlog_and_reuses_its_connections() -> None:
    judge = BacklogJudge()
    limits = PoolLimits()
    scorer = OpenAIChatScorer(base_url=judge.url + "/v1", model="judge", pool=limits)
    memories = [f"m{i}" for i in range(200)]

    async def score_twice() -> list[list[float | None]]:
        try:
            return [(await scorer.score("q", np.zeros(4), memories, np.zeros((200, 4)))).values
                    for _ in range(2)]
        finally:
            await scorer.aclose()

    with asyncio.Runner(loop_factory=ConnectCountingLoop) as runner:
        started = time.perf_counter()
        first, second = runner.run(score_twice())
        elapsed = time.perf_counter() - started
        loop = runner.get_loop()
        assert isinstance(loop, ConnectCountingLoop)
    assert first == second == [0.5] * 200
    # Each retransmit costs a connect 1 s or more; the time is only a witness (a busy machine
    # can take as long without one).
    assert (loop.retransmits, judge.retransmits) == (0, 0), f"{elapsed:.2f} s"
    assert 1 < loop.most <= limits.connecting
    assert judge.accepted <= limits.connections  # the second call reused the first's connections


def test_an_answer_times_the_backend_from_its_request_sent_not_from_a_wait_for_a_connection(
        ) -> None:
    judge = BacklogJudge(delay_s=0.05)
    client = ScorerClient(judge.url + "/v1/chat/completions",
                          PoolLimits(connections=1, queue_signal=True))

    async def two_at_once() -> list[Answer]:
        try:
            return await asyncio.gather(*(client.post(b"{}", {}) for _ in range(2)))
        finally:
            await client.aclose()

    started = time.perf_counter()
    first, second = asyncio.run(two_at_once())
    elapsed = time.perf_counter() - started
    assert elapsed >= 0.1  # one connection: the second request waited for the first's answer
    for answer in (first, second):
        assert 0.05 <= answer.backend_s < 0.09, (first.backend_s, second.backend_s)
        assert answer.at_backend == 1  # sent alone
