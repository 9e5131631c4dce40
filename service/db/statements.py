"""Running one of the db package's SQL statements on the session's psycopg connection, in the
session's transaction (the style ``service.db`` states): a statement and its rows, with nothing
between them and psycopg. A path that issues several statements pipelines them on
:func:`~service.db.engine.driver_connection` itself instead."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import driver_connection

#: Named ``%(name)s`` parameters of a statement.
Parameters = Mapping[str, Any]


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
