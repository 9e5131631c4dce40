"""The connection pool: a connection that died while it sat idle in the pool is replaced before
a request gets it (pinged once idle for PING_AFTER_IDLE_S; the hot path skips the ping)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import make_url

from service.db.engine import PING_AFTER_IDLE_S, create_engine


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def test_a_pooled_connection_that_died_while_idle_is_replaced_before_use(
    new_database: Callable[[str], str],
) -> None:
    url = new_database("earm_pool_ping")

    async def scenario() -> tuple[int, int, int]:
        engine = create_engine(url, pool_size=1)
        try:
            async with engine.connect() as conn:
                first_pid = int(await conn.scalar(text("SELECT pg_backend_pid()")))
            # The server ends the pooled connection's backend, as a restart would.
            with psycopg.connect(_libpq(url), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (first_pid,))
            await asyncio.sleep(PING_AFTER_IDLE_S + 0.2)
            async with engine.connect() as conn:
                answer = int(await conn.scalar(text("SELECT 41 + 1")))
                second_pid = int(await conn.scalar(text("SELECT pg_backend_pid()")))
        finally:
            await engine.dispose()
        return first_pid, answer, second_pid

    first_pid, answer, second_pid = asyncio.run(scenario())
    assert answer == 42
    assert second_pid != first_pid
