"""The scorers' HTTP client: one aiohttp session per scorer, its keep-alive pool bounded in
connections and in connections not answered yet, answers read up to a size cap.

Why aiohttp: a retrieve sends its anchors at once, 35 to 200 chat requests, and the client's CPU
per request is paid on the event loop before the first one leaves and after the last answer
lands. Measured on loopback (``docs/perf/scorer_client_cpu.py``, uvloop): httpx's pooled client
2.4 ms of CPU per request at 35 at once and 3.1 ms at 200, aiohttp's 0.19 and 0.24 ms (its
parser and writer are C). The session resolves its proxy once, from the standard variables
(``HTTP(S)_PROXY``, ``NO_PROXY``, ``.netrc``) as its ``trust_env`` would: ``trust_env`` itself
reads the environment again for every request, which cost 0.2 to 0.5 ms each.

Why bounds: a backend's listen backlog can be small (5 for Python's ``http.server``), and
connects beyond it are dropped and retried by the kernel after 1 s, 3 s, 7 s: 200 connects at
once made a retrieve wait several backend latencies. The pool keeps at most
``PoolLimits.connections`` connections to the backend (requests beyond wait for one to come
free, a warm one first), of which at most ``PoolLimits.connecting`` opened and not answered yet
(for at most ``PoolLimits.unanswered_s``). aiohttp's connector bounds the first but not the
second, hence :class:`_GatedConnector`. The price: a cold pool grows by ``connecting``
connections per backend latency, or per ``unanswered_s`` if that is shorter. A pool is cold at a
process's first retrieve and again after ``keepalive_s`` idle, i.e. between most agents'
questions, so the hold is short (20 ms; 100 ms made a 35-anchor retrieve against a 100 ms
backend wait 9.4 latencies instead of 2.8: ``docs/perf/scorer_cold_pool.py``).

An answer's body is read up to ``max_answer_bytes``: a ``Content-Length`` over it is refused once
the head is in, a chunked or connection-delimited body as soon as it passes it, and the
connection is closed (:class:`AnswerTooLarge`). A backend streaming an endless answer would
otherwise be buffered until the scorer's timeout. TLS trusts what the embedder's httpx client
trusts (``SSL_CERT_FILE`` honoured).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.helpers import get_env_proxy_for_url
from aiohttp.tracing import Trace
from yarl import URL

__all__ = [
    "MAX_ANSWER_BYTES",
    "Answer",
    "AnswerTooLarge",
    "CannotConnect",
    "ConnectionFailed",
    "PoolLimits",
    "ScorerClient",
    "encode_json",
]

#: The default cap on an answer's body (``EARM_SCORER_MAX_ANSWER_BYTES``). A chat answer is a
#: few KB (``max_tokens`` is 16 a pair); a rerank answer is ~60 bytes a document, or with the
#: documents echoed back (vLLM always, Jina by default) up to a memory's 8000 characters each:
#: a default batch of 64 such documents is at most 64 x 8000 x 6 bytes (JSON's \uXXXX escapes)
#: = 3 MB. 8 MiB leaves more than twice that, and bounds what a backend that answers without
#: end costs: 8 MiB a request in flight.
MAX_ANSWER_BYTES = 8 * 1024 * 1024


class ConnectionFailed(Exception):
    """The request got no complete answer: refused, reset, closed early, or not HTTP."""


class CannotConnect(ConnectionFailed):
    """No connection to the backend: refused, unreachable, unknown name, TLS refused."""


class AnswerTooLarge(ConnectionFailed):
    """The answer's body is over the client's ``max_answer_bytes``; the connection was closed."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the backend's answer is over {limit} bytes")
        self.limit = limit


@dataclass(frozen=True)
class Answer:
    """A backend's complete response: status, headers (case-insensitive) and body."""

    status: int
    headers: Mapping[str, str]
    content: bytes
    #: Seconds from the request being written to its answer's first bytes read off the socket:
    #: the backend's time and the network's, without the client's waits for a connection or a
    #: connect slot, nor its own work on other answers before it reads this one's body (0
    #: unless the pool's ``queue_signal`` is on).
    backend_s: float = 0.0
    #: The client's requests at the backend (written, no answer begun) when this one was
    #: written, itself included (0 unless the pool's ``queue_signal`` is on).
    at_backend: int = 0

    def json(self) -> Any:
        """The body as JSON (``ValueError`` when it is not)."""
        return json.loads(self.content)


def encode_json(body: Any) -> bytes:
    """A request body as compact UTF-8 JSON (no NaN)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True)
class PoolLimits:
    """The connections a scorer keeps to its backend: at most ``connections`` open, of which at
    most ``connecting`` opened and not answered yet (4: under the listen backlog of small
    servers, 5 for Python's http.server), each counted for ``unanswered_s`` at most (a backend
    that answers some requests late or never must not stop the pool from growing; long enough
    for a server's accept loop to take the connection, short enough that a cold pool reaches a
    retrieve's 35 anchors in under 0.2 s); an idle one
    closed after ``keepalive_s`` (below the common 5 s server keep-alive, so a request is rarely
    sent on one the server is closing). With ``queue_signal`` a latency rising with the
    requests at the backend cuts the scorer's window too
    (:class:`~service.providers.concurrency_limit.QueueEstimate`)."""

    connections: int = 64
    connecting: int = 4
    unanswered_s: float = 0.02
    keepalive_s: float = 4.0
    queue_signal: bool = False


class _Sending:
    """One request's timing: when it was written and when its answer's first bytes came, and
    the client's requests at the backend then (its :attr:`ScorerClient.at_backend`)."""

    __slots__ = ("answered_at", "at_backend", "client", "sent_at")

    def __init__(self, client: ScorerClient) -> None:
        self.client = client
        self.sent_at: float | None = None
        self.answered_at: float | None = None
        self.at_backend = 0

    def sent(self, now: float) -> None:
        self.sent_at = now
        self.client.at_backend += 1
        self.at_backend = self.client.at_backend

    def answered(self, now: float) -> None:
        if self.sent_at is not None and self.answered_at is None:
            self.answered_at = now
            self.client.at_backend -= 1

    def ended(self) -> None:
        """The exchange is over, answered or not: no longer at the backend."""
        if self.sent_at is not None and self.answered_at is None:
            self.answered_at = self.sent_at
            self.client.at_backend -= 1


#: The exchange under way in the current task, which its connection's handler times.
_SENDING: contextvars.ContextVar[_Sending | None] = contextvars.ContextVar(
    "earm_scorer_sending", default=None)


class _AnsweringHandler(ResponseHandler):
    """aiohttp's protocol of a connection, holding its connector's permit to be opened until
    the backend's first bytes on it, its end, or :meth:`give_back_permit`; and timing each
    request on it from its writing to its answer's first bytes (:class:`_Sending`).

    aiohttp calls ``set_response_params`` on the connection in the request's own task just
    before it writes the request (an internal: the timing test in
    tests/providers/test_http_client.py fails if a release changes it). The first bytes are
    timed as they come off the socket, before the event loop gets to the task that reads them:
    a client busy with other answers would otherwise see its own backlog as the backend's."""

    permit: asyncio.Semaphore | None = None
    sending: _Sending | None = None

    def set_response_params(self, **params: Any) -> None:
        self.sending = _SENDING.get()
        if self.sending is not None:
            self.sending.sent(self._loop.time())
        super().set_response_params(**params)

    def data_received(self, data: bytes) -> None:
        if self.sending is not None:
            self.sending.answered(self._loop.time())
            self.sending = None
        self.give_back_permit()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.give_back_permit()
        super().connection_lost(exc)

    def give_back_permit(self) -> None:
        if self.permit is not None:
            self.permit.release()
            self.permit = None


class _GatedConnector(aiohttp.TCPConnector):
    """aiohttp's connector with at most ``connecting`` connections opened and not answered yet.

    A connection counts until the backend's first bytes on it, not until its connect returns:
    the server's kernel completes a handshake before the server accepts the connection, so a
    connect that returned proves nothing about the room left in its listen backlog (on
    loopback, 64 connects one at a time still overflowed a backlog of 5). An answer does. But
    no longer than ``unanswered_s``: requests a backend holds (a hung model) would otherwise
    keep the pool from opening connections for the ones it answers.

    It overrides the connector's protocol factory and the one method that opens a connection
    (proxied or direct), aiohttp internals: the backlog test
    (tests/providers/test_http_client.py) fails if a release changes them."""

    def __init__(self, connecting: int, unanswered_s: float, **options: Any) -> None:
        super().__init__(**options)
        self._connecting = asyncio.Semaphore(connecting)
        self._unanswered_s = unanswered_s
        self._factory = functools.partial(  # type: ignore[assignment]
            _AnsweringHandler, loop=self._loop)

    async def _create_connection(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> ResponseHandler:
        await self._connecting.acquire()
        try:
            protocol = await super()._create_connection(req, traces, timeout)
        except BaseException:
            self._connecting.release()
            raise
        assert isinstance(protocol, _AnsweringHandler)
        if protocol.is_connected():  # else connection_lost came first: nothing to wait for
            protocol.permit = self._connecting
            self._loop.call_later(self._unanswered_s, protocol.give_back_permit)
        else:
            self._connecting.release()
        return protocol


def _lost_unanswered(error: aiohttp.ClientError) -> bool:
    """Whether the request's connection was lost before its answer (the backend closed or reset
    it), as opposed to a connect that failed (``ClientConnectorError``, an OS error too)."""
    lost = (aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionResetError,
            aiohttp.ClientOSError)
    return isinstance(error, lost) and not isinstance(error, aiohttp.ClientConnectorError)


class ScorerClient:
    """``POST url`` through one pooled aiohttp session, opened at the first request (it belongs
    to the event loop that runs it). Cookies the backend sets are sent back with every later
    request: a provider's load balancer pins a client to a node this way (session affinity).
    No timeout of its own: the scorer's deadline bounds each call. With ``queue_signal``, each
    answer says how long the backend took from the request being written, and how many of the
    client's requests were at the backend then (:class:`Answer`)."""

    def __init__(self, url: str, limits: PoolLimits,
                 max_answer_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.url = URL(url)
        self.limits = limits
        self.max_answer_bytes = max_answer_bytes
        self._session: aiohttp.ClientSession | None = None
        self.at_backend = 0  # requests written, no answer begun and not failed

    async def post(self, body: bytes, headers: Mapping[str, str]) -> Answer:
        """The backend's answer to ``body``; :class:`ConnectionFailed` without one."""
        session = self._session or self._open()
        try:
            try:
                return await self._exchange(session, body, headers)
            except aiohttp.ClientError as error:
                if not _lost_unanswered(error):
                    raise
                # Most often a kept-alive connection the backend closed as the request went out
                # (its FIN not read yet): sent once more, on a new connection, as aiohttp does
                # for idempotent methods only. A score has no side effect to repeat.
                return await self._exchange(session, body, headers)
        except aiohttp.ClientConnectorError as error:  # refused, unreachable, name, TLS
            raise CannotConnect(f"{type(error).__name__}: {error}") from None
        except aiohttp.ClientError as error:  # reset, closed early, not HTTP
            raise ConnectionFailed(f"{type(error).__name__}: {error}") from None

    async def _exchange(self, session: aiohttp.ClientSession, body: bytes,
                        headers: Mapping[str, str]) -> Answer:
        # Timed only for the queue signal, the one reader of an answer's timing.
        sending = _Sending(self) if self.limits.queue_signal else None
        token = _SENDING.set(sending)
        try:
            async with session.post(self.url, data=body, headers=headers) as response:
                content = await self._read(response)
        finally:
            _SENDING.reset(token)
            if sending is not None:
                sending.ended()
        if sending is None or sending.sent_at is None or sending.answered_at is None:
            return Answer(response.status, response.headers, content)
        return Answer(response.status, response.headers, content,
                      sending.answered_at - sending.sent_at, sending.at_backend)

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        """The body up to the cap; past it the connection is closed."""
        cap = self.max_answer_bytes
        length = response.content_length
        if length is not None:
            if length > cap:
                response.close()
                raise AnswerTooLarge(cap)
            return await response.read()
        pieces: list[bytes] = []
        size = 0
        while piece := await response.content.readany():
            size += len(piece)
            if size > cap:
                response.close()
                raise AnswerTooLarge(cap)
            pieces.append(piece)
        return b"".join(pieces)

    def _open(self) -> aiohttp.ClientSession:
        tls = httpx.create_ssl_context() if self.url.scheme == "https" else None
        try:
            proxy, proxy_auth = get_env_proxy_for_url(self.url)
        except LookupError:  # none named, or NO_PROXY covers the backend
            proxy, proxy_auth = None, None
        self._session = aiohttp.ClientSession(
            connector=_GatedConnector(
                self.limits.connecting, self.limits.unanswered_s,
                limit=self.limits.connections, limit_per_host=0,
                keepalive_timeout=self.limits.keepalive_s, ssl=tls if tls is not None else True,
            ),
            proxy=proxy, proxy_auth=proxy_auth,
            # Backends are often reached by IP address, whose cookies aiohttp drops by default.
            cookie_jar=aiohttp.CookieJar(unsafe=True),
            # No compression asked for, and none undone: the bytes the cap counts are all the
            # body takes (a compressed answer within the cap could inflate past it).
            skip_auto_headers=("Accept-Encoding",),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(),
        )
        return self._session

    async def aclose(self) -> None:
        """Close the pool's connections (the client is not used afterwards)."""
        if self._session is not None:
            await self._session.close()
