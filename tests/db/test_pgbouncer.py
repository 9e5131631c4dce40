"""earm behind a real PgBouncer in transaction pooling mode: no session state may outlive a
transaction (a setting, a prepared statement, a session-level lock), since the next transaction
of the same client connection may run on another server connection, and the same server
connection serves other clients in between.

One PgBouncer (Debian's package, ``/usr/sbin/pgbouncer``) runs for the module in front of the
session's embedded Postgres, with two server connections for five times as many client
connections, and one earm serves through it (schema migrated through it too). The tests then
drive the core flows (ingest, retrieve with a loopback judge, feedback, the by-id routes) and
refits concurrently across namespaces, so that every client connection's transactions land on
both server connections.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from service.client import AsyncEarmClient, EarmClient
from service.db import migrate
from service.db.engine import open_database
from service.db.namespaces import try_lock_namespace_refit
from service.http.app import create_app
from service.retrieve.refit import refit_namespace
from service.settings import Settings
from service.testing import LoopbackServer, chat_completions_app, free_port, text_vector

PGBOUNCER = Path("/usr/sbin/pgbouncer")
pytestmark = [
    pytest.mark.pooler,
    pytest.mark.skipif(
        not PGBOUNCER.exists(),
        reason="needs PgBouncer: apt-get install -y pgbouncer (.ci/run installs it)",
    ),
]

#: Server connections PgBouncer may open to the database: fewer than the service's client
#: connections (its pool plus overflow), so they are shared.
SERVER_CONNECTIONS = 2
DIM = 384
NAMESPACES = [f"pooled-{i}" for i in range(4)]
MEMORIES = 12


@dataclass(frozen=True)
class Bouncer:
    url: str  # the test database, through PgBouncer
    admin_url: str  # PgBouncer's console (SHOW ...)
    direct_url: str  # the test database, straight to Postgres


def _config(postgres_url: str, database: str, port: int) -> str:
    """A transaction-pooling PgBouncer on 127.0.0.1:``port`` in front of the embedded server
    (its Unix socket), trusting its superuser (the embedded server trusts it too)."""
    server = make_url(postgres_url)
    socket_dir = server.query["host"]
    return f"""[databases]
{database} = host={socket_dir} port={server.port or 5432} dbname={database}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = userlist.txt
admin_users = {server.username}
pool_mode = transaction
default_pool_size = {SERVER_CONNECTIONS}
max_db_connections = {SERVER_CONNECTIONS}
max_client_conn = 100
"""


def _start(directory: Path, postgres_url: str) -> subprocess.Popen[bytes]:
    """PgBouncer as the user the embedded server runs as when we are root (it refuses root;
    that user can reach the server's socket), itself otherwise."""
    socket_owner = os.stat(make_url(postgres_url).query["host"]).st_uid
    as_user = ["-u", pwd.getpwuid(socket_owner).pw_name] if os.geteuid() == 0 else []
    with (directory / "pgbouncer.log").open("wb") as log:
        return subprocess.Popen(
            [str(PGBOUNCER), *as_user, "pgbouncer.ini"], cwd=directory, stdout=log, stderr=log
        )


def _wait_accepting(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not start: {log.read_text()}") from None
            time.sleep(0.05)


@pytest.fixture(scope="module")
def bouncer(
    postgres_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Bouncer]:
    database = "earm_pgbouncer"
    engine = create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{database}"'))
    engine.dispose()
    directory = tmp_path_factory.mktemp("pgbouncer")
    port = free_port()
    user = make_url(postgres_server).username
    (directory / "pgbouncer.ini").write_text(_config(postgres_server, database, port))
    (directory / "userlist.txt").write_text(f'"{user}" ""\n')
    process = _start(directory, postgres_server)
    try:
        url = f"postgresql://{user}@127.0.0.1:{port}/{database}"
        _wait_accepting(url, process, directory / "pgbouncer.log")
        migrate.upgrade_to_head(url, DIM)  # `earm migrate` through the pooler
        yield Bouncer(
            url=url,
            admin_url=f"postgresql://{user}@127.0.0.1:{port}/pgbouncer",
            direct_url=postgres_server.replace("/postgres?", f"/{database}?"),
        )
    finally:
        process.terminate()
        process.wait(10)


@dataclass(frozen=True)
class Service:
    url: str
    settings: Settings


def judge(prompt: str) -> str:
    """A score that is a pure function of the prompt (the pair it asks about)."""
    return f"{(sum(prompt.encode()) % 97) / 96:.3f}"


@pytest.fixture(scope="module")
def service(bouncer: Bouncer) -> Iterator[Service]:
    """earm on loopback through the pooler, a refit due every three queries (run inside the
    request that makes it due, so it is through by the response), pool of 5 + 5 overflow."""
    with LoopbackServer(chat_completions_app(judge)) as judge_server:
        settings = Settings(
            database_url=bouncer.url,
            db_prepared_statements=False,
            db_pool_size=5,
            embedder="none",
            scorer="openai",
            scorer_base_url=f"{judge_server.url}/v1",
            scorer_timeout_s=20.0,  # a loaded CI machine, not a latency bound
            refit_every=3,
            _env_file=None,
        )
        with LoopbackServer(create_app(settings, refit_in_request=True)) as server:
            yield Service(server.url, settings)


def _memories(namespace: str) -> list[dict[str, Any]]:
    return [
        {
            "text": f"{namespace} memory {i}",
            "embedding": text_vector(f"{namespace} memory {i}", DIM),
            "external_id": f"m{i}",
        }
        for i in range(MEMORIES)
    ]


async def _core_flows(url: str, namespace: str) -> None:
    """One agent's session: ingest, retrieves (the third makes a refit due), feedback, and the
    by-id routes (a memory, a trace, an edit, a delete)."""
    async with AsyncEarmClient(url) as earm:
        ids = (await earm.add(namespace, _memories(namespace))).ids
        assert len(ids) == MEMORIES
        for i in range(4):
            query = f"{namespace} question {i}"
            result = await earm.retrieve(
                namespace, query, query_embedding=text_vector(query, DIM), k=4, candidates=10,
                budget=4,
            )
            assert len(result.memories) == 4
            feedback = await earm.feedback(namespace, result.query_id, {result.memories[0].id: 1.0})
            assert feedback.recorded == 1
            trace = await earm.trace(result.query_id)
            assert trace.namespace == namespace and trace.returned == 4
        assert (await earm.get(ids[0])).text == f"{namespace} memory 0"
        edited = await earm.patch_memory(ids[1], metadata={"edited": True})
        assert edited.memory.metadata == {"edited": True}
        await earm.delete(ids[2])
        page = await earm.list(namespace, limit=100)
        assert len(page.memories) == MEMORIES - 1


async def _all_agents(url: str) -> None:
    await asyncio.gather(*(_core_flows(url, namespace) for namespace in NAMESPACES))


def _console(admin_url: str, command: str) -> list[dict[str, Any]]:
    """Rows of a PgBouncer console command (it speaks the simple query protocol only)."""
    with psycopg.connect(admin_url, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        cursor = conn.execute(command)
        names = [column.name for column in cursor.description or []]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def test_core_flows_of_concurrent_agents_run_on_shared_server_connections(
    bouncer: Bouncer, service: Service
) -> None:
    """Four agents at once through two server connections: every request answers (the
    statements would fail on a server connection that lacks the prepared statement another
    one has), and the service's client connections outnumbered the server connections."""
    asyncio.run(_all_agents(service.url))

    clients = [row for row in _console(bouncer.admin_url, "SHOW CLIENTS")
               if row["database"] == "earm_pgbouncer"]
    servers = [row for row in _console(bouncer.admin_url, "SHOW SERVERS")
               if row["database"] == "earm_pgbouncer"]
    assert len(servers) <= SERVER_CONNECTIONS < len(clients)
    engine = create_engine(bouncer.direct_url)
    with engine.connect() as conn:
        refits = conn.execute(text(
            "SELECT count(*) FROM namespaces WHERE name LIKE 'pooled-%' "
            "AND last_refit_at IS NOT NULL AND content_slope IS NOT NULL"
        )).scalar_one()
        advisory = conn.execute(text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        )).scalar_one()
    engine.dispose()
    assert refits == len(NAMESPACES)  # every agent's third query refitted its namespace
    assert advisory == 0  # no refit left a lock behind on a server connection


async def _refits(settings: Settings, namespace: str, rounds: int) -> list[bool]:
    results: list[bool] = []
    async with open_database(settings.database) as database:
        for _ in range(rounds):
            results += await asyncio.gather(*(
                refit_namespace(database.sessions, settings.completion, name)
                for name in (namespace, "other")
            ))
    return results


def test_refits_through_the_pooler_keep_running(bouncer: Bouncer, service: Service) -> None:
    """A refit's lock must not stay behind on a server connection: later refits of the
    namespace, whichever server connection their transactions land on, still run."""
    with EarmClient(service.url) as earm:
        for namespace in ("refits", "other"):
            earm.add(namespace, _memories(namespace))
            earm.retrieve(namespace, "q", query_embedding=text_vector("q", DIM), budget=3)
    assert asyncio.run(_refits(service.settings, "refits", rounds=3)) == [True] * 6


async def _refit_while_held(
    settings: Settings, direct_url: str, namespace: str
) -> tuple[bool, bool]:
    # The holder stands for another process's refit, on a connection of its own: through the
    # pooler it would occupy one of its two server connections for the whole test, and the
    # refit under test would share the other with the service's background work (seen once
    # on a loaded machine: no server connection within PgBouncer's query_wait_timeout).
    direct = settings.model_copy(update={"database_url": direct_url})
    async with (
        open_database(settings.database) as database,
        open_database(direct.database) as other,
    ):
        async with other.sessions() as holder:
            assert await try_lock_namespace_refit(holder, namespace)
            while_held = await refit_namespace(database.sessions, settings.completion, namespace)
        after_release = await refit_namespace(database.sessions, settings.completion, namespace)
    return while_held, after_release


def test_a_refit_skips_a_namespace_another_refit_holds(
    bouncer: Bouncer, service: Service
) -> None:
    """One refit of a namespace at a time, also through the pooler: while another
    transaction holds the namespace's refit lock a refit through the pooler skips it, and once
    that transaction ends the next one runs."""
    with EarmClient(service.url) as earm:
        earm.add("held", _memories("held"))
        earm.retrieve("held", "q", query_embedding=text_vector("q", DIM), budget=3)
    assert asyncio.run(
        _refit_while_held(service.settings, bouncer.direct_url, "held")
    ) == (False, True)
