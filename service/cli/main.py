"""The ``earm`` command: serve, worker, migrate, keys, namespace, mcp, demo, and the commands of
installed distributions (``bench``: service/cli/plugins.py)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeGuard

from pydantic import ValidationError

from service.cli.plain_help import PlainHelpParser
from service.errors import ConfigurationError, SchemaOutOfDate
from service.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.exc import OperationalError

# What a command needs (the database layer, the app) it imports when it runs: the parser is
# built for every command line, and `earm --help` or a settings error must answer at once.

#: Commands whose output is their result: what they log while starting (Alembic, the embedded
#: Postgres) is shown only with EARM_LOG_LEVEL=DEBUG (warnings and errors always).
RESULT_COMMANDS = frozenset({"keys", "migrate", "namespace"})
#: The product's own commands, which take the settings. Any other comes from an installed
#: distribution and is loaded only for a command line that names none of these, so that
#: `earm serve` loads no benchmark code.
BUILTIN_COMMANDS = frozenset(
    {"serve", "worker", "migrate", "keys", "namespace", "mcp", "demo"}
)


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from service.logs import configure_logging
    from service.metrics import multiprocess_directory

    # JSON lines on stderr (before the app's imports log anything); our one line per request
    # replaces uvicorn's access log.
    configure_logging(settings.log_level, settings.access_log)
    from service.http import server
    from service.http.app import create_app

    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    background_work = settings.background_work and not args.no_background_work
    if not background_work and not settings.database_url:
        # An embedded Postgres belongs to this process: no worker could do the work.
        raise ConfigurationError(
            "earm serve without background work needs EARM_DATABASE_URL (a Postgres that "
            "`earm worker` processes reach too)"
        )
    # The app sees the real bind address: without key enforcement it refuses a non-loopback one.
    settings = settings.model_copy(
        update={"host": host, "port": port, "background_work": background_work}
    )
    if args.workers > 1:
        if not settings.database_url:
            raise ConfigurationError(
                "earm serve --workers needs EARM_DATABASE_URL (an external Postgres)"
            )
        server.check_address_free(host, port)
        server.check_start_up(create_app(settings))
        # Each worker builds its app from the environment: hand the bind address on, and
        # share one metrics directory so /metrics adds up every worker.
        os.environ.update({
            "EARM_HOST": host, "EARM_PORT": str(port),
            "EARM_BACKGROUND_WORK": str(background_work).lower(),
        })
        with multiprocess_directory():
            uvicorn.run(
                server.SERVED_APP_FACTORY,
                factory=True,
                workers=args.workers,
                **server.uvicorn_options(settings.serving, settings.observability),
            )
        return 0
    server.run(create_app(settings), settings.serving, settings.observability)
    return 0


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from service.logs import configure_logging
    from service.worker import run_worker

    configure_logging(settings.log_level)
    asyncio.run(run_worker(settings))
    return 0


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    from service.db import migrate
    from service.db.engine import EmbeddedPostgres

    embedded = None
    url = settings.database_url
    if not url:
        embedded = EmbeddedPostgres(settings.data_dir)
        url = embedded.start()
    try:
        distributed = migrate.upgrade_to_head(url, settings.embedding_dim)
    finally:
        if embedded is not None:
            embedded.stop()
    print(f"schema at {migrate.head_revision()}")
    if distributed:
        print(f"distributed on Citus: {', '.join(distributed)}")
    return 0


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser of the command line ``argv``: the product's commands, and those of installed
    distributions unless ``argv`` names one of the product's."""
    # Typed as its base class: the sub-command modules add parsers to any ArgumentParser's.
    parser: argparse.ArgumentParser = PlainHelpParser(prog="earm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the HTTP service")
    serve.add_argument("--host", default=None, help="bind address (default EARM_HOST, 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default EARM_PORT, 8000)")
    serve.add_argument(
        "--workers", type=int, default=1, help="worker processes (> 1 needs EARM_DATABASE_URL)"
    )
    serve.add_argument(
        "--no-background-work", action="store_true",
        help="leave refits and indexing to `earm worker` (sets EARM_BACKGROUND_WORK=false)",
    )
    serve.set_defaults(func=_serve)

    worker = commands.add_parser(
        "worker", help="run refits and the HNSW indexer for the API processes of a database"
    )
    worker.set_defaults(func=_worker)

    migrate = commands.add_parser(
        "migrate",
        help="bring the database schema to the current version (Alembic upgrade head); on a "
        "Citus database, distribute it across the workers (docs/sharding.md)",
    )
    migrate.set_defaults(func=_migrate)

    from service.cli.keys import add_keys_parser

    add_keys_parser(commands)
    from service.cli.namespace import add_namespace_parser

    add_namespace_parser(commands)
    from service.cli.mcp import add_mcp_parser

    add_mcp_parser(commands)
    from service.cli.demo import add_demo_parser

    add_demo_parser(commands)

    if not argv or argv[0] not in BUILTIN_COMMANDS:
        from service.cli.plugins import add_installed_commands

        add_installed_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # platformdirs warns on stderr when XDG_RUNTIME_DIR is unset (containers, CI, cron), as the
    # embedded Postgres asks it where to keep its lock file; /tmp/runtime-<uid> serves as well.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
    try:
        settings = Settings()
    except ValidationError as error:
        return _configuration_error(_describe_invalid_settings(error))
    from service.logs import STARTUP_DETAIL_LOGGERS, startup_detail_level

    detail_level = startup_detail_level(settings.log_level)
    level = detail_level if args.command in RESULT_COMMANDS else settings.log_level
    logging.basicConfig(level=level, stream=sys.stderr)
    # Start-up detail (Alembic's plugins, the embedded Postgres's output) at DEBUG only, for
    # every command: the commands import Alembic after this, and it logs as it loads.
    for name in STARTUP_DETAIL_LOGGERS:
        logging.getLogger(name).setLevel(detail_level)
    try:
        if args.command in BUILTIN_COMMANDS:
            return int(args.func(args, settings) or 0)
        return int(args.func(args) or 0)
    except (ConfigurationError, SchemaOutOfDate) as error:
        return _configuration_error(str(error))
    except Exception as error:
        if not _is_connection_failure(error):
            raise
        return _configuration_error(_describe_unreachable_database(settings, error))


def _is_connection_failure(error: Exception) -> TypeGuard[OperationalError]:
    """Whether ``error`` is psycopg's for a server it could not connect to (refused, unknown
    host, bad password, timeout); an error on an open connection is a failure to report in
    full."""
    if "sqlalchemy" not in sys.modules:  # no command that never loaded it failed in it
        return False
    from sqlalchemy.exc import OperationalError

    return isinstance(error, OperationalError) and str(error.orig).startswith("connection")


def _describe_unreachable_database(settings: Settings, error: OperationalError) -> str:
    from sqlalchemy.engine import make_url

    where = (
        make_url(settings.database_url).render_as_string(hide_password=True)
        if settings.database_url
        else "the embedded Postgres"
    )
    reason = str(error.orig).splitlines()[0]
    return (
        f"cannot connect to the database at {where}: {reason}; start it, or point "
        "EARM_DATABASE_URL at a running Postgres"
    )


def _configuration_error(message: str) -> int:
    """What is wrong and how to fix it, as one line: no traceback to read through."""
    print(f"earm: {message}", file=sys.stderr)
    return 2


def _describe_invalid_settings(error: ValidationError) -> str:
    # Names the variable, never echoes its value (it may be a key). A check across settings
    # has no location: its message names the settings (with values that are no secrets).
    first = error.errors()[0]
    subject = "settings"
    if first["loc"]:
        subject = "setting EARM_" + "_".join(str(part) for part in first["loc"]).upper()
    message = first["msg"].removeprefix("Value error, ")
    more = (
        f" (and {error.error_count() - 1} more invalid settings)" if error.error_count() > 1 else ""
    )
    return f"invalid {subject}: {message}{more}; see docs/operations.md, Settings"


if __name__ == "__main__":
    sys.exit(main())
