"""Running one of the db package's SQL statements on the session's psycopg connection, in the
session's transaction (the style ``service.db`` states): a statement and its rows, with nothing
between them and psycopg. A path that issues several statements pipelines them on
:func:`~service.db.engine.driver_connection` itself instead, through :func:`pipeline`.

:func:`pipeline` is written by hand because it works around psycopg: its async pipeline
flushes its output once per command it sends and then waits for results, whether or not the
flush sent everything. What is still unsent when the socket's send buffer is full stays
unsent, and the server waits for the rest of the statement while psycopg waits for its
results: both for ever, with the transaction's locks held. A pipeline whose messages fit in the
buffer leaves in one flush; a larger one (a retrieve that recorded hundreds of scored
candidates) goes one statement per round trip, which flushes every byte before it waits."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import numpy as np
import psycopg
from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.codecs import Float8Rows
from service.db.engine import driver_connection

#: Named ``%(name)s`` parameters of a statement.
Parameters = Mapping[str, Any]

#: What a message's framing and a value's encoding may add to the bytes counted below.
_OVERHEAD_BYTES = 64


def pipeline(
    conn: psycopg.AsyncConnection[Any], statements: Sequence[tuple[str, Parameters]]
) -> AbstractAsyncContextManager[Any]:
    """``conn.pipeline()`` when ``statements`` fit in half the connection's send buffer (the
    other half is slack for the protocol's framing), else no pipeline: the caller executes the
    same statements either way, in one round trip or one per statement (module docstring)."""
    size = sum(len(sql) + message_bytes(parameters) for sql, parameters in statements)
    if size <= send_buffer_bytes(conn) // 2:
        return conn.pipeline()
    return contextlib.nullcontext()


def send_buffer_bytes(conn: psycopg.AsyncConnection[Any]) -> int:
    """The kernel's send buffer of the connection's socket, as it is now (TCP grows it)."""
    with socket.socket(fileno=conn.pgconn.socket) as sock:
        try:
            return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
        finally:
            sock.detach()  # the socket is psycopg's: never closed here


def message_bytes(value: Any) -> int:
    """An upper estimate of what ``value`` adds to a statement's message, as earm's parameters
    are sent: text, bytes, binary float arrays, array literals and lists of strings."""
    if isinstance(value, str):
        return 4 * len(value) + _OVERHEAD_BYTES  # UTF-8: at most 4 bytes a character
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value) + _OVERHEAD_BYTES
    if isinstance(value, Float8Rows):
        return len(value.data) + _OVERHEAD_BYTES
    if isinstance(value, np.ndarray):
        return 4 * value.nbytes + _OVERHEAD_BYTES
    if isinstance(value, Mapping):
        return sum(message_bytes(v) for v in value.values()) + _OVERHEAD_BYTES
    if isinstance(value, list | tuple):
        return sum(message_bytes(v) for v in value) + _OVERHEAD_BYTES
    return _OVERHEAD_BYTES


async def execute(
    session: AsyncSession, statement: str, parameters: Parameters | None = None
) -> int:
    """Run a statement; how many rows it touched (an INSERT's, UPDATE's or DELETE's)."""
    conn = await driver_connection(session)
    cursor = await conn.execute(statement, parameters)
    return cursor.rowcount


async def fetch_all(
    session: AsyncSession, statement: str, parameters: Parameters | None = None
) -> list[tuple[Any, ...]]:
    conn = await driver_connection(session)
    cursor = await conn.execute(statement, parameters)
    return await cursor.fetchall()


async def fetch_one(
    session: AsyncSession, statement: str, parameters: Parameters | None = None
) -> tuple[Any, ...] | None:
    """The statement's first row; None without rows."""
    conn = await driver_connection(session)
    cursor = await conn.execute(statement, parameters)
    row: tuple[Any, ...] | None = await cursor.fetchone()
    return row


async def fetch_value(
    session: AsyncSession, statement: str, parameters: Parameters | None = None
) -> Any:
    """The first column of the statement's first row; None without rows."""
    row = await fetch_one(session, statement, parameters)
    return None if row is None else row[0]


async def fetch_records(
    session: AsyncSession, statement: str, parameters: Parameters | None = None
) -> list[dict[str, Any]]:
    """The statement's rows by column name: for a read of many columns, where positions would
    be easy to get wrong."""
    conn = await driver_connection(session)
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(statement, parameters)
        return await cursor.fetchall()


async def fetch_record(
    session: AsyncSession, statement: str, parameters: Parameters | None = None
) -> dict[str, Any] | None:
    """:func:`fetch_records`'s first row; None without rows."""
    conn = await driver_connection(session)
    async with conn.cursor(row_factory=dict_row) as cursor:
        await cursor.execute(statement, parameters)
        return await cursor.fetchone()
