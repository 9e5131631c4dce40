"""The scorers' HTTP connections: a lean HTTP/1.1 connection on asyncio and httptools' parser for
the hot path, and an httpx one where the environment names a proxy for the backend.

Why not httpx everywhere: a retrieve sends its anchors at once, 35 to 200 chat requests, and the
client's CPU per request is paid on the event loop before the first one leaves and after the last
answer lands. Measured on loopback (``python docs/perf/scorer_client_cpu.py``, 35 concurrent
requests, uvloop, two runs): httpx 0.76 / 0.83 ms of CPU per request, httpcore alone 0.53 /
0.49 ms, this connection 0.065 / 0.064 ms; the chat scorer's whole call, prompts and parsing
included, 0.11 / 0.15 ms per pair. At 200 anchors httpx alone was 150 ms of event-loop time.

What the lean connection does not do, and why it does not need to: redirects (an API endpoint
answers where it is configured), compression (it asks for none), HTTP/2, and proxies
(:func:`connection_factory` gives those backends the httpx connection, so ``HTTPS_PROXY`` and
``NO_PROXY`` keep working as they do for httpx). TLS uses the same context httpx would build
(``SSL_CERT_FILE`` honoured).

Both read an answer's body up to ``max_answer_bytes`` (:data:`MAX_ANSWER_BYTES` by default): a
``Content-Length`` over it is refused once the head is in, a chunked or connection-delimited
body as soon as it passes it, and the connection is closed (:class:`AnswerTooLarge`). A backend
streaming an endless answer would otherwise be buffered until the scorer's timeout.
"""

from __future__ import annotations

import asyncio
import http.cookies
import json
import ssl
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

import httptools
import httpx

__all__ = [
    "MAX_ANSWER_BYTES",
    "Answer",
    "AnswerTooLarge",
    "ConnectionFailed",
    "ConnectionTimedOut",
    "CookieJar",
    "Http1Connection",
    "HttpxConnection",
    "ScorerConnection",
    "connection_factory",
    "encode_json",
]


class ConnectionFailed(Exception):
    """The request got no complete answer: refused, reset, closed early, or not HTTP."""


class ConnectionTimedOut(ConnectionFailed):
    """The backend did not answer in time (the httpx connection's own timeout)."""


class AnswerTooLarge(ConnectionFailed):
    """The answer's body is over the connection's ``max_answer_bytes`` (or its head is: the
    lean connection counts a head that never ends too); the connection was closed."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the backend's answer is over {limit} bytes")
        self.limit = limit


#: The default cap on an answer's body (``EARM_SCORER_MAX_ANSWER_BYTES``). A chat answer is a
#: few KB (``max_tokens`` is 16 a pair); a rerank answer is ~60 bytes a document, or with the
#: documents echoed back (vLLM always, Jina by default) up to a memory's 8000 characters each:
#: a default batch of 64 such documents is at most 64 x 8000 x 6 bytes (JSON's \uXXXX escapes)
#: = 3 MB. 8 MiB leaves more than twice that, and bounds what a backend that answers without
#: end costs: 8 MiB a request in flight.
MAX_ANSWER_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Answer:
    """A backend's complete response: status, headers (names in lower case; of a repeated
    header the last) and body, and its ``Set-Cookie`` headers, each whole."""

    status: int
    headers: Mapping[str, str]
    content: bytes
    set_cookies: tuple[str, ...] = ()

    def json(self) -> Any:
        """The body as JSON (``ValueError`` when it is not)."""
        return json.loads(self.content)


class ScorerConnection(Protocol):
    """One connection to a scorer backend, used by one request at a time."""

    async def post(self, body: bytes, headers: Mapping[str, str]) -> Answer: ...

    async def aclose(self) -> None: ...


class CookieJar:
    """The cookies a backend set (``Set-Cookie``), sent back with every later request of the
    scorer: a provider's load balancer pins a client to a node this way (session affinity).
    Names and values only; a cookie whose ``Max-Age`` is 0 or below is dropped."""

    def __init__(self) -> None:
        self._cookies: dict[str, str] = {}

    def take(self, answer: Answer) -> None:
        for line in answer.set_cookies:
            cookie = http.cookies.SimpleCookie()
            try:
                cookie.load(line)
            except http.cookies.CookieError:
                continue  # a malformed cookie is not worth failing a score for
            for name, morsel in cookie.items():
                if morsel["max-age"] and morsel["max-age"].lstrip("-").isdigit() \
                        and int(morsel["max-age"]) <= 0:
                    self._cookies.pop(name, None)
                else:
                    self._cookies[name] = morsel.value

    def header(self) -> dict[str, str]:
        """The ``Cookie`` header to send (none while the jar is empty)."""
        if not self._cookies:
            return {}
        return {"Cookie": "; ".join(f"{name}={value}" for name, value in self._cookies.items())}


def encode_json(body: Any) -> bytes:
    """A request body as httpx's ``json=`` encodes it (compact, UTF-8, no NaN)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


@dataclass
class _Exchange:
    """What the parser has read of the response to the request in flight."""

    answered: asyncio.Future[Answer]
    received: bool = False  # any byte of the answer
    head_bytes: int = 0  # of the answer's head while it is incomplete
    body_bytes: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    set_cookies: list[str] = field(default_factory=list)
    body: list[bytes] = field(default_factory=list)
    headers_complete: bool = False


class _Protocol(asyncio.Protocol):
    """The socket's side: feeds httptools and completes the exchange in flight."""

    def __init__(self, max_answer_bytes: int) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.max_answer_bytes = max_answer_bytes
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.closed = False
        self.reusable = True  # false once a response said "Connection: close" (or HTTP/1.0)
        self.answered = 0  # requests answered on this connection
        self.received_any = False  # of the last request: any byte of its answer

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports implement asyncio.Transport's
        # interface without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:  # nothing was asked: a server speaking out of turn
            self._fail(ConnectionFailed("the backend sent data no request asked for"))
            return
        exchange.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(ConnectionFailed(f"the backend's response is not HTTP/1.1: {error}"))
            return
        if not exchange.headers_complete:  # all of it was head (httptools buffers a header)
            exchange.head_bytes += len(data)
            if exchange.head_bytes > self.max_answer_bytes:
                self._fail(AnswerTooLarge(self.max_answer_bytes))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        exchange = self.exchange
        if exchange is None or exchange.answered.done():
            return
        if exchange.headers_complete and _until_close(exchange.headers):
            self.on_message_complete()  # a body delimited by the connection's end
        else:
            self._fail(ConnectionFailed(f"the backend closed the connection: {exc or 'EOF'}"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.exchange is not None
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        self.exchange.headers[key] = text
        if key == "set-cookie":
            self.exchange.set_cookies.append(text)

    def on_headers_complete(self) -> None:
        assert self.exchange is not None
        self.exchange.headers_complete = True
        length = self.exchange.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_answer_bytes:
            self._fail(AnswerTooLarge(self.max_answer_bytes))

    def on_body(self, body: bytes) -> None:
        exchange = self.exchange
        assert exchange is not None
        if exchange.answered.done():  # failed: the rest of the data at hand is dropped
            return
        exchange.body_bytes += len(body)
        if exchange.body_bytes > self.max_answer_bytes:
            self._fail(AnswerTooLarge(self.max_answer_bytes))
            return
        exchange.body.append(body)

    def on_message_complete(self) -> None:
        exchange, self.exchange = self.exchange, None
        assert exchange is not None
        self.reusable = self.reusable and self.parser.should_keep_alive()
        self.answered += 1
        if not exchange.answered.done():
            exchange.answered.set_result(Answer(
                self.parser.get_status_code(), exchange.headers, b"".join(exchange.body),
                tuple(exchange.set_cookies)))

    def _fail(self, error: ConnectionFailed) -> None:
        self.reusable = False
        if self.exchange is not None and not self.exchange.answered.done():
            self.exchange.answered.set_exception(error)
        if self.transport is not None:
            self.transport.close()


def _until_close(headers: Mapping[str, str]) -> bool:
    """Whether the body ends when the connection does (no length, not chunked)."""
    return "content-length" not in headers and "chunked" not in headers.get(
        "transfer-encoding", "").lower()


class Http1Connection:
    """One keep-alive HTTP/1.1 connection to ``url``: opened at the first request, and again
    after the backend closed it or it idled ``keepalive_s`` (below the common 5 s server
    keep-alive, so a request is never sent on a connection the server is closing)."""

    def __init__(self, url: str, tls: ssl.SSLContext | None, keepalive_s: float,
                 max_answer_bytes: int = MAX_ANSWER_BYTES) -> None:
        parts = urlsplit(url)
        if parts.hostname is None:
            raise ValueError(f"no host in {url!r}")
        self.host = parts.hostname
        self.tls = tls if parts.scheme == "https" else None
        self.port = parts.port or (443 if self.tls else 80)
        self.keepalive_s = keepalive_s
        self.max_answer_bytes = max_answer_bytes
        default_port = self.port == (443 if self.tls else 80)
        authority = self.host if default_port else f"{self.host}:{self.port}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._head = f"POST {target} HTTP/1.1\r\nHost: {authority}\r\n"
        self._protocol: _Protocol | None = None
        self._idle_since = 0.0

    async def post(self, body: bytes, headers: Mapping[str, str]) -> Answer:
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        request = f"{self._head}{lines}Content-Length: {len(body)}\r\n\r\n".encode("latin-1")
        protocol = await self._open()
        try:
            answer = await self._exchange(protocol, request + body)
        except ConnectionFailed:
            if not protocol.answered or protocol.received_any:
                raise
            # A kept-alive connection the backend closed as the request went out (its FIN not
            # read yet): nothing was answered, so the request is sent once more on a new one,
            # as HTTP clients do (a score has no side effect to repeat).
            self._drop()
            protocol = await self._open()
            answer = await self._exchange(protocol, request + body)
        if protocol.reusable and not protocol.closed:
            self._idle_since = time.monotonic()
        else:
            self._drop()
        return answer

    @staticmethod
    async def _exchange(protocol: _Protocol, request: bytes) -> Answer:
        exchange = _Exchange(asyncio.get_running_loop().create_future())
        protocol.exchange = exchange
        assert protocol.transport is not None
        protocol.transport.write(request)
        try:
            return await exchange.answered
        finally:
            protocol.received_any = exchange.received

    async def _open(self) -> _Protocol:
        protocol = self._protocol
        stale = time.monotonic() - self._idle_since > self.keepalive_s
        if protocol is not None and not protocol.closed and protocol.reusable and not stale:
            return protocol
        self._drop()
        try:
            _, opened = await asyncio.get_running_loop().create_connection(
                lambda: _Protocol(self.max_answer_bytes), self.host, self.port, ssl=self.tls,
                server_hostname=self.host if self.tls else None,
            )
        except (OSError, ssl.SSLError) as error:  # refused, unreachable, name, certificate
            raise ConnectionFailed(f"cannot connect to {self.host}:{self.port}: {error}") from None
        self._protocol = opened
        return opened

    def _drop(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol = None

    async def aclose(self) -> None:
        """Close the socket (a request interrupted half-way leaves it unusable)."""
        self._drop()


class HttpxConnection:
    """The same connection over one single-connection httpx client: for backends reached
    through a proxy the environment names."""

    def __init__(self, url: str, tls: ssl.SSLContext, keepalive_s: float, timeout_s: float,
                 max_answer_bytes: int = MAX_ANSWER_BYTES):
        self.url = url
        self.max_answer_bytes = max_answer_bytes
        self._client = httpx.AsyncClient(
            verify=tls, timeout=timeout_s,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1,
                                keepalive_expiry=keepalive_s),
            # As the lean connection: no compression, so the bytes counted are the body's.
            headers={"Accept-Encoding": "identity"},
        )

    async def post(self, body: bytes, headers: Mapping[str, str]) -> Answer:
        try:
            async with self._client.stream(
                "POST", self.url, content=body, headers=dict(headers)
            ) as response:
                content = await self._read(response)
        except httpx.TimeoutException as error:
            raise ConnectionTimedOut(str(error) or "timed out") from None
        except httpx.HTTPError as error:  # connect/read/protocol errors
            raise ConnectionFailed(str(error) or type(error).__name__) from None
        return Answer(response.status_code, {k.lower(): v for k, v in response.headers.items()},
                      content, tuple(response.headers.get_list("set-cookie")))

    async def _read(self, response: httpx.Response) -> bytes:
        """The body as it came (not decoded, as the lean connection's), up to the cap; leaving
        the stream early closes the connection."""
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_answer_bytes:
            raise AnswerTooLarge(self.max_answer_bytes)
        pieces: list[bytes] = []
        size = 0
        async for piece in response.aiter_raw():
            size += len(piece)
            if size > self.max_answer_bytes:
                raise AnswerTooLarge(self.max_answer_bytes)
            pieces.append(piece)
        return b"".join(pieces)

    async def aclose(self) -> None:
        await self._client.aclose()


def connection_factory(url: str, keepalive_s: float, timeout_s: float,
                       max_answer_bytes: int = MAX_ANSWER_BYTES
                       ) -> Callable[[], ScorerConnection]:
    """What opens the scorer's connections to ``url``: httpx's where the environment routes the
    backend through a proxy (``HTTP(S)_PROXY``, ``ALL_PROXY``, less ``NO_PROXY``), the lean
    connection otherwise. One TLS context for all of them: loading the CA bundle costs ~25 ms.
    Either reads an answer's body up to ``max_answer_bytes``."""
    parts = urlsplit(url)
    tls = httpx.create_ssl_context() if parts.scheme == "https" else None
    proxies = urllib.request.getproxies()
    proxied = (parts.scheme in proxies or "all" in proxies) and not urllib.request.proxy_bypass(
        parts.hostname or "")
    if proxied:
        context = tls or httpx.create_ssl_context()
        return lambda: HttpxConnection(url, context, keepalive_s, timeout_s, max_answer_bytes)
    return lambda: Http1Connection(url, tls, keepalive_s, max_answer_bytes)
