"""A lean chat-completions judge for benchmarks: asyncio and httptools' parser instead of uvicorn
and FastAPI.

A benchmark's judge stands in for a provider on another machine, yet here it shares the service's
two cores. Through uvicorn and FastAPI each call costs the judge about a millisecond of CPU, so
an "instant" judge at a few hundred calls a second took a third of the machine from the service
it was measuring. This server answers the same requests with the same bodies
(:func:`service.testing.chat_answer`) for a tenth of that. It speaks HTTP/1.1 with keep-alive and
``Content-Length`` bodies, which is what the scorer sends; only ``POST /v1/chat/completions``
is served (anything else is a 404, a body that is not JSON a 400).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, cast

import httptools

from service.testing import ReplyFn, chat_answer

__all__ = ["ChatServer"]

PATH = b"/v1/chat/completions"


class ChatServer:
    """``POST /v1/chat/completions`` on 127.0.0.1 answered by ``reply`` (as
    :func:`service.testing.chat_completions_app` does), served by an event loop (uvloop) in a
    daemon thread; a context manager. ``url`` once started. ``backlog``: its listen backlog
    (asyncio's default; 5 is Python's http.server's, beyond which the kernel drops connects)."""

    def __init__(self, reply: ReplyFn, model: str = "loopback-judge", backlog: int = 100) -> None:
        self.reply = reply
        self.model = model
        self.backlog = backlog
        self.url = ""
        self._numbers = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chat-server", daemon=True)

    def __enter__(self) -> ChatServer:
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError("the chat server did not start")
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self) -> None:
        import uvloop

        loop = self._loop = uvloop.new_event_loop()
        listening = socket.create_server(("127.0.0.1", 0), backlog=self.backlog)
        server = loop.run_until_complete(loop.create_server(
            lambda: _Connection(self._answer), sock=listening, backlog=self.backlog))
        self.url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        self._started.set()
        loop.run_forever()
        server.close()
        loop.close()

    async def _answer(self, path: bytes, body: bytes) -> tuple[int, dict[str, Any]]:
        if path != PATH:
            return 404, {"error": {"message": "not found"}}
        try:
            request = json.loads(body)
            return 200, await chat_answer(request, self.reply, next(self._numbers), self.model)
        except ValueError as error:  # not JSON, or service.testing's BadRequest
            return 400, {"error": {"message": str(error), "type": "invalid_request_error"}}


#: (path, body) -> the status and JSON body to answer with.
Answerer = Callable[[bytes, bytes], Awaitable[tuple[int, dict[str, Any]]]]


class _Connection(asyncio.Protocol):
    """One client connection: requests parsed as they arrive, answered in order."""

    def __init__(self, answer: Answerer) -> None:
        self.answer = answer
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.previous: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports implement asyncio.Transport's
        # interface without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        path, body = self.url.split(b"?")[0], b"".join(self.body)
        self.url, self.body = b"", []
        keep_alive = self.parser.should_keep_alive()
        self.previous = asyncio.ensure_future(self._respond(path, body, keep_alive, self.previous))

    async def _respond(self, path: bytes, body: bytes, keep_alive: bool,
                       previous: asyncio.Task[None] | None) -> None:
        status, payload = await self.answer(path, body)
        if previous is not None:  # a pipelined client gets its answers in order
            await previous
        content = json.dumps(payload).encode()
        closing = "" if keep_alive else "connection: close\r\n"
        head = (f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}\r\n"
                f"content-type: application/json\r\ncontent-length: {len(content)}\r\n"
                f"{closing}\r\n")
        assert self.transport is not None
        if self.transport.is_closing():
            return
        self.transport.write(head.encode() + content)
        if not keep_alive:
            self.transport.close()
