"""The ``earm`` command: serve, migrate, keys, mcp, bench."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from service.settings import Settings


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from service.observability import configure_logging, logging_config, multiprocess_directory

    # JSON lines on stderr (before the app's imports log anything); our one line per request
    # replaces uvicorn's access log.
    configure_logging(settings.log_level)
    from service.api.app import create_app

    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    # The app sees the real bind address: without API keys it refuses a non-loopback one.
    settings = settings.model_copy(update={"host": host, "port": port})
    options = {
        "host": host,
        "port": port,
        "log_level": settings.log_level.lower(),
        "log_config": logging_config(settings.log_level),
        "access_log": False,
    }
    if args.workers > 1:
        if not settings.database_url:
            print("earm serve --workers needs EARM_DATABASE_URL (an external Postgres)", file=sys.stderr)
            return 2
        # Each worker builds its app from the environment: hand the bind address on, and
        # share one metrics directory so /metrics adds up every worker.
        os.environ.update({"EARM_HOST": host, "EARM_PORT": str(port)})
        with multiprocess_directory():
            uvicorn.run("service.api.app:create_app", factory=True, workers=args.workers, **options)
        return 0
    uvicorn.run(create_app(settings), **options)
    return 0


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    from service.db import migrate
    from service.db.database import EmbeddedPostgres

    embedded = None
    url = settings.database_url
    if not url:
        embedded = EmbeddedPostgres(settings.data_dir)
        url = embedded.start()
    try:
        migrate.upgrade_to_head(url, settings.embedding_dim)
    finally:
        if embedded is not None:
            embedded.stop()
    print(f"schema at {migrate.head_revision()}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="earm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the HTTP service")
    serve.add_argument("--host", default=None, help="bind address (default EARM_HOST, 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default EARM_PORT, 8000)")
    serve.add_argument(
        "--workers", type=int, default=1, help="worker processes (> 1 needs EARM_DATABASE_URL)"
    )
    serve.set_defaults(func=_serve)

    migrate = commands.add_parser(
        "migrate", help="bring the database schema to the current version (Alembic upgrade head)"
    )
    migrate.set_defaults(func=_migrate)

    from service.auth import add_keys_parser

    add_keys_parser(commands)
    from service.integrations import add_mcp_parser

    add_mcp_parser(commands)

    bench = commands.add_parser("bench", help="benchmarks")
    bench_commands = bench.add_subparsers(dest="bench", required=True)
    _add_benchmarks(bench_commands)
    return parser


def _add_benchmarks(bench_commands: argparse._SubParsersAction) -> None:
    # Imported here, not at module level: `earm serve` should not load benchmark code.
    from bench.load_mix import add_load_mix_parser
    from bench.run_locomo import add_locomo_parser

    add_locomo_parser(bench_commands)
    add_load_mix_parser(bench_commands)
    from bench.hnsw import add_hnsw_parser
    from bench.load import add_load_parser

    add_load_parser(bench_commands)
    add_hnsw_parser(bench_commands)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings()
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr)
    if args.command == "bench":
        return int(args.func(args) or 0)
    return int(args.func(args, settings) or 0)


if __name__ == "__main__":
    sys.exit(main())
