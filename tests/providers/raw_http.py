"""Reading requests on a raw socket or stream, for the backends the provider tests stand up
by hand (a listen backlog, a framing or a TLS setup a web framework would not give them)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

#: Serves a function of each accepted connection on a loopback port, which it returns (the
#: ``tcp_server`` fixture of tests/providers/conftest.py).
ServeTCP = Callable[[Callable[[socket.socket], None]], int]


def _content_length(head: bytes) -> int:
    return next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                 if line.lower().startswith(b"content-length:")), 0)


def read_request(stream: socket.socket) -> bytes | None:
    """One request's head (its ``Content-Length`` body read and dropped), or None at the
    connection's end."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = stream.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = _content_length(head)
    while len(body) < length:
        chunk = stream.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head


async def read_request_async(reader: asyncio.StreamReader) -> bytes:
    """One request's head (its body read and dropped); IncompleteReadError at the end."""
    head = await reader.readuntil(b"\r\n\r\n")
    await reader.readexactly(_content_length(head))
    return head
