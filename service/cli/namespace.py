"""``earm namespace export NS > file`` and ``earm namespace import [--as NAME] < file``: move a
namespace between deployments, back it up, or hand it to its owner (the file:
``service.namespace_file``; docs/operations.md, "Moving a namespace")."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from service.errors import NotFound
from service.settings import Settings

if TYPE_CHECKING:
    from service.namespace_file import Deployment

# The database layer and the file format are imported by the commands that run, not here: the
# parser is built for every `earm` command line.


def add_namespace_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``earm namespace export|import``."""
    namespace = commands.add_parser(
        "namespace", help="export a namespace to a file, or import one (docs/operations.md)"
    )
    actions = namespace.add_subparsers(dest="namespace_command", required=True)

    export = actions.add_parser(
        "export", help="write a namespace (memories, queries, observations, model) to stdout"
    )
    export.add_argument("namespace")
    export.set_defaults(func=_cli_export)

    imported = actions.add_parser(
        "import", help="create a namespace from a file on stdin, in one transaction"
    )
    imported.add_argument(
        "--as", dest="as_name", default=None, metavar="NEWNAME",
        help="the name to import under (default: the exported namespace's)",
    )
    imported.set_defaults(func=_cli_import)


def _deployment(settings: Settings) -> Deployment:
    from service.db import migrate
    from service.namespace_file import Deployment
    from service.namespace_validation import RecordLimits
    from service.providers.factory import embedding_model_id

    return Deployment(
        embedding_model_id(settings.embedding),
        settings.embedding_dim,
        RecordLimits.of(settings.limits),
        migrate.head_revision(),
    )


def _cli_export(args: argparse.Namespace, settings: Settings) -> int:
    from service.db.engine import open_database
    from service.namespace_file import export_namespace

    async def run() -> str:
        async with open_database(settings.database) as database, database.sessions() as session:
            counts = await export_namespace(
                session, args.namespace, _deployment(settings), sys.stdout
            )
            return counts.describe()

    try:
        described = asyncio.run(run())
    except NotFound as exc:
        print(f"earm: {exc}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    print(f"exported namespace {args.namespace!r}: {described}", file=sys.stderr)
    return 0


def _cli_import(args: argparse.Namespace, settings: Settings) -> int:
    from service.db.engine import open_database
    from service.namespace_file import import_namespace

    async def run() -> str:
        async with open_database(settings.database) as database, database.sessions() as session:
            imported = await import_namespace(
                session, sys.stdin, _deployment(settings), args.as_name
            )
            await session.commit()
            return f"imported namespace {imported.namespace!r}: {imported.counts.describe()}"

    print(asyncio.run(run()), file=sys.stderr)
    return 0
