"""``earm keys create|list|revoke|enforcement``: API keys from the command line
(docs/security.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

from service.errors import ConfigurationError
from service.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from service.db.keys import KeyRecord

# The database layer is imported by the commands that run, not here: the parser is built for
# every `earm` command line (`earm --help`, a settings error) and loading it took a second.


def add_keys_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``earm keys create|list|revoke|enforcement``."""
    keys = commands.add_parser("keys", help="manage API keys (docs/security.md)")
    actions = keys.add_subparsers(dest="keys_command", required=True)

    create = actions.add_parser("create", help="create a key; it is printed once, on stdout")
    create.add_argument(
        "--namespaces",
        required=True,
        action="append",
        help="comma-separated namespace globs, e.g. 'agent-*' ('*' = admin); repeatable",
    )
    create.add_argument("--name", default=None, help="a label shown by `earm keys list`")
    create.set_defaults(func=_cli_create)

    listing = actions.add_parser("list", help="list keys (never the keys themselves)")
    listing.set_defaults(func=_cli_list)

    revoke = actions.add_parser("revoke", help="revoke a key by id (effective within seconds)")
    revoke.add_argument("id", type=int)
    revoke.set_defaults(func=_cli_revoke)

    enforcement = actions.add_parser(
        "enforcement",
        help="whether requests need a key: on from the first key until turned off here",
    )
    enforcement.add_argument("state", choices=["status", "on", "off"])
    enforcement.set_defaults(func=_cli_enforcement)


def _run_with_session(settings: Settings, work: Any) -> Any:
    from service.db.engine import open_database

    async def run() -> Any:
        async with open_database(settings.database) as database, database.sessions() as session:
            result = await work(session)
            await session.commit()
            return result

    return asyncio.run(run())


def _cli_create(args: argparse.Namespace, settings: Settings) -> int:
    from service.auth import create_key, validate_patterns
    from service.db.keys import key_enforcement

    try:
        patterns = validate_patterns(p for group in args.namespaces for p in group.split(","))
    except ValueError as exc:
        raise ConfigurationError(f"--namespaces: {exc}") from None

    async def create(session: AsyncSession) -> tuple[str, KeyRecord, bool, bool]:
        enforced_before = await key_enforcement(session)
        key, record = await create_key(session, patterns, args.name)
        return key, record, enforced_before, await key_enforcement(session)

    key, record, enforced_before, enforced = _run_with_session(settings, create)
    if not enforced:
        print(
            "key enforcement is off: requests without a key are still served "
            "(`earm keys enforcement on` to require keys)",
            file=sys.stderr,
        )
    elif not enforced_before:
        # The first key turns enforcement on: a keyless tour or dashboard answers 401 from now.
        print(
            "key enforcement is now on: every request needs a key, the dashboard included "
            "(`earm keys enforcement off` serves requests without one again)",
            file=sys.stderr,
        )
    print(
        f"created key {record.id} ({record.name}) for namespaces {', '.join(record.patterns)}; "
        "store it now, it cannot be shown again:",
        file=sys.stderr,
    )
    print(key)
    return 0


def _cli_list(args: argparse.Namespace, settings: Settings) -> int:
    from service.db.keys import list_keys

    records = _run_with_session(settings, list_keys)
    print(f"{'id':>4}  {'name':<24} {'status':<8} {'created':<20} patterns")
    for r in records:
        status = "revoked" if r.revoked_at else "active"
        created = r.created_at.strftime("%Y-%m-%d %H:%M:%S")
        print(f"{r.id:>4}  {r.name:<24} {status:<8} {created:<20} {','.join(r.patterns)}")
    return 0


def _cli_revoke(args: argparse.Namespace, settings: Settings) -> int:
    from service.db.keys import revoke_key

    if _run_with_session(settings, lambda s: revoke_key(s, args.id)):
        print(f"revoked key {args.id}", file=sys.stderr)
        return 0
    print(f"no active key with id {args.id}", file=sys.stderr)
    return 1


def _cli_enforcement(args: argparse.Namespace, settings: Settings) -> int:
    from service.db.keys import count_active_keys, key_enforcement, set_key_enforcement

    async def apply(session: AsyncSession) -> tuple[bool, int]:
        if args.state != "status":
            await set_key_enforcement(session, args.state == "on")
        return await key_enforcement(session), await count_active_keys(session)

    enforced, active = _run_with_session(settings, apply)
    keys = f"{active} active key{'' if active == 1 else 's'}"
    if enforced:
        consequence = "requests need an API key" + (
            "" if active else "; with none active, only /healthz and /readyz answer"
        )
    else:
        consequence = "requests without a key are served as an anonymous admin, " + (
            "from any client (EARM_ALLOW_ANONYMOUS=true)"
            if settings.allow_anonymous
            else "from loopback clients only"
        )
    print(f"key enforcement: {'on' if enforced else 'off'} ({keys}): {consequence}")
    return 0
