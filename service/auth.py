"""Authentication and namespace isolation: bearer API keys scoped to namespace patterns.

A key is a high-entropy random token (``earm_`` + 43 url-safe characters, 256 bits) shown once
when it is created. Only its sha256 is stored (table ``api_keys``), with fnmatch-style globs over
namespace names (``agent-*``, ``team-?-prod``; ``*`` alone makes an admin key) and an optional
revocation time. Keys come from ``earm keys create`` or are seeded from ``EARM_API_KEYS``.

Every route is authenticated by one app-level dependency (:func:`authenticate`) except the
public ones (:data:`PUBLIC_PATHS`, plus the docs, which are not API routes); handlers then call
:func:`require_namespace` for the namespace they touch. Two modes, stored in the database
(table ``auth_settings``) so that revoking every key does not reopen access:

- **key enforcement on**: a request without a valid key gets 401 ``unauthenticated``; a
  namespace outside the key's patterns gets 403 ``forbidden``. The first key ever created (by
  ``earm keys create`` or from ``EARM_API_KEYS``) turns it on.
- **key enforcement off** (a fresh deployment, or after ``earm keys enforcement off``): a
  request without credentials acts as an anonymous admin, but only loopback clients are served
  (``earm serve`` refuses a non-loopback bind address, and requests from non-loopback peers get
  401) unless ``EARM_ALLOW_ANONYMOUS=true``.

Credentials, when sent, are always checked: an unknown or revoked key gets 401 in both modes.

Lookups and the mode are cached in-process for ``EARM_AUTH_CACHE_TTL_S`` (default 2 s): a
revoked key stops working, a new key starts working and a mode change takes effect within that
time on every replica.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import ipaddress
import logging
import re
import secrets
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPBearer
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.api.schemas import ErrorResponse
from service.errors import ConfigurationError, Forbidden, Unauthenticated
from service.settings import Settings

log = logging.getLogger(__name__)

KEY_PREFIX = "earm_"
MIN_SEEDED_KEY_CHARS = 20
#: Routes that answer without a key: probes and metrics (the docs are not API routes).
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
#: Namespace characters plus the glob metacharacters * ? [ ] !
PATTERN_RE = re.compile(r"^[A-Za-z0-9._:*?\[\]!-]{1,128}$")
CACHE_MAX_ENTRIES = 10_000

#: Declares the bearer scheme in the OpenAPI document (and the docs' "Authorize" button) for
#: the routers that use it; the checking itself is :func:`authenticate`.
bearer_scheme = HTTPBearer(
    auto_error=False,
    description="An API key from `earm keys create` (required once key enforcement is on).",
)


def generate_key() -> str:
    """A new random key (256 bits of entropy)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """What is stored instead of the key. A plain sha256 suffices for high-entropy keys."""
    return hashlib.sha256(key.encode()).hexdigest()


def validate_patterns(patterns: Iterable[str]) -> tuple[str, ...]:
    cleaned = tuple(p.strip() for p in patterns if p.strip())
    if not cleaned:
        raise ValueError("a key needs at least one namespace pattern, e.g. 'agent-*' or '*'")
    for pattern in cleaned:
        if not PATTERN_RE.match(pattern):
            raise ValueError(
                f"namespace pattern {pattern!r} may only hold namespace characters "
                "(letters, digits, '.', '_', ':', '-') and the globs * ? [ ] !"
            )
    return cleaned


@dataclass(frozen=True)
class Principal:
    """Who is calling: a key (``key_id``) or the anonymous admin of a key-less deployment."""

    key_id: int | None
    name: str
    patterns: tuple[str, ...]

    @property
    def is_admin(self) -> bool:
        return "*" in self.patterns

    def allows(self, namespace: str) -> bool:
        return any(fnmatchcase(namespace, pattern) for pattern in self.patterns)

    def visible(self, namespaces: Iterable[str]) -> list[str]:
        """The namespaces this principal may see (e.g. for an unscoped /stats)."""
        return [n for n in namespaces if self.allows(n)]


ANONYMOUS = Principal(key_id=None, name="anonymous", patterns=("*",))


def require_namespace(principal: Principal, namespace: str) -> None:
    """Raise 403 ``forbidden`` unless the principal's patterns cover ``namespace``."""
    if not principal.allows(namespace):
        raise Forbidden(
            f"this API key ({principal.name}) is not allowed to use namespace {namespace!r}"
        )


@dataclass(frozen=True)
class SeedKey:
    key: str
    patterns: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"env-{hash_key(self.key)[:8]}"


def parse_seed_keys(raw: str | None) -> list[SeedKey]:
    """``EARM_API_KEYS``: ``KEY=PATTERN[,PATTERN...]`` entries separated by ``;``, e.g.
    ``k1...=agent-*,team-*;k2...=*``. Keys must be at least 20 characters without ``=``/``;``."""
    seeds: list[SeedKey] = []
    for number, entry in enumerate((e.strip() for e in (raw or "").split(";")), start=1):
        if not entry:
            continue
        key, separator, patterns = entry.partition("=")
        key = key.strip()
        if not separator:
            raise ConfigurationError(f"EARM_API_KEYS entry {number} is not KEY=PATTERNS")
        if len(key) < MIN_SEEDED_KEY_CHARS:
            # Never echo the key itself, not even in an error.
            raise ConfigurationError(
                f"EARM_API_KEYS entry {number}: the key is shorter than {MIN_SEEDED_KEY_CHARS} "
                "characters; generate one with `python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'`"
            )
        try:
            seeds.append(SeedKey(key, validate_patterns(patterns.split(","))))
        except ValueError as exc:
            raise ConfigurationError(f"EARM_API_KEYS entry {number}: {exc}") from None
    return seeds


def is_loopback_host(host: str) -> bool:
    """True for addresses only this machine can reach (``localhost``, 127.0.0.0/8, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything, assume exposed


def _peer_is_remote(host: str | None) -> bool:
    """A non-loopback IP peer. Unix sockets (no peer) and in-process test clients are local."""
    if not host:
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ------------------------------------------------------------------------------ key storage


@dataclass(frozen=True)
class KeyRecord:
    id: int
    name: str
    patterns: tuple[str, ...]
    created_at: Any
    revoked_at: Any


async def create_key(
    session: AsyncSession, patterns: Sequence[str], name: str | None = None
) -> tuple[str, KeyRecord]:
    """Store a new key; returns (the key, its record). The key is not retrievable later. The
    first key ever created turns key enforcement on."""
    key = generate_key()
    row = (
        await session.execute(
            text(
                "INSERT INTO api_keys (name, key_hash, namespace_patterns) "
                "VALUES (:name, :hash, :patterns) "
                "RETURNING id, name, namespace_patterns, created_at, revoked_at"
            ),
            {
                "name": name or f"key-{hash_key(key)[:8]}",
                "hash": hash_key(key),
                "patterns": list(validate_patterns(patterns)),
            },
        )
    ).one()
    await _enforce_keys_unless_decided(session)
    return key, KeyRecord(row[0], row[1], tuple(row[2]), row[3], row[4])


async def list_keys(session: AsyncSession) -> list[KeyRecord]:
    rows = await session.execute(
        text(
            "SELECT id, name, namespace_patterns, created_at, revoked_at FROM api_keys ORDER BY id"
        )
    )
    return [KeyRecord(r[0], r[1], tuple(r[2]), r[3], r[4]) for r in rows]


async def revoke_key(session: AsyncSession, key_id: int) -> bool:
    """Revoke a key; False if no unrevoked key has this id."""
    result = await session.execute(
        text("UPDATE api_keys SET revoked_at = now() WHERE id = :id AND revoked_at IS NULL"),
        {"id": key_id},
    )
    return result.rowcount == 1


async def seed_keys(session: AsyncSession, seeds: Sequence[SeedKey]) -> None:
    """Hash ``EARM_API_KEYS`` into the table; idempotent. A seeded key revoked with
    ``earm keys revoke`` stays revoked; its patterns follow the setting otherwise."""
    for seed in seeds:
        await session.execute(
            text(
                "INSERT INTO api_keys (name, key_hash, namespace_patterns) "
                "VALUES (:name, :hash, :patterns) "
                "ON CONFLICT (key_hash) DO UPDATE SET namespace_patterns = EXCLUDED.namespace_patterns "
                "WHERE api_keys.revoked_at IS NULL"
            ),
            {"name": seed.name, "hash": hash_key(seed.key), "patterns": list(seed.patterns)},
        )
    if seeds:
        await _enforce_keys_unless_decided(session)


async def key_enforcement(session: AsyncSession) -> bool:
    """Whether requests need a key. No row in ``auth_settings``: never turned on."""
    return bool(await session.scalar(text("SELECT key_enforcement FROM auth_settings")))


async def set_key_enforcement(session: AsyncSession, enforced: bool) -> None:
    """The operator's decision (``earm keys enforcement on|off``); creating keys never undoes it."""
    await session.execute(
        text(
            "INSERT INTO auth_settings (id, key_enforcement) VALUES (1, :enforced) "
            "ON CONFLICT (id) DO UPDATE "
            "SET key_enforcement = EXCLUDED.key_enforcement, changed_at = now()"
        ),
        {"enforced": enforced},
    )


async def _enforce_keys_unless_decided(session: AsyncSession) -> None:
    """Called with every new key: the first one turns enforcement on; once the mode is stored
    (on, or turned off by an operator), a new key leaves it as it is."""
    await session.execute(
        text(
            "INSERT INTO auth_settings (id, key_enforcement) VALUES (1, true) "
            "ON CONFLICT (id) DO NOTHING"
        )
    )


# ---------------------------------------------------------------------------- authenticator


class Authenticator:
    """Resolves bearer keys to principals, with a short in-process cache (``ttl_s``)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        ttl_s: float = 2.0,
        allow_anonymous: bool = False,
        seeds: Sequence[SeedKey] = (),
    ) -> None:
        self.sessions = sessions
        self.ttl_s = ttl_s
        self.allow_anonymous = allow_anonymous
        self.seeds = list(seeds)
        self._principals: dict[str, tuple[float, Principal | None]] = {}
        self._keys_enforced: tuple[float, bool] | None = None

    @classmethod
    def from_settings(
        cls, settings: Settings, sessions: async_sessionmaker[AsyncSession]
    ) -> Authenticator:
        seeds = parse_seed_keys(
            settings.api_keys.get_secret_value() if settings.api_keys else None
        )
        return cls(sessions, settings.auth_cache_ttl_s, settings.allow_anonymous, seeds)

    async def start(self, bind_host: str | None = None) -> None:
        """Seed the configured keys, then refuse to serve anonymously on an exposed address."""
        if self.seeds:
            async with self.sessions() as session:
                await seed_keys(session, self.seeds)
                await session.commit()
            log.info("seeded %d API key(s) from EARM_API_KEYS", len(self.seeds))
        if bind_host is not None and not is_loopback_host(bind_host):
            if not self.allow_anonymous and not await self.keys_enforced():
                raise ConfigurationError(
                    f"refusing to serve on {bind_host}, a non-loopback address, without API "
                    "keys: create one with `earm keys create --namespaces '*'` (or set "
                    "EARM_API_KEYS; `earm keys enforcement on` if keys exist), or set "
                    "EARM_ALLOW_ANONYMOUS=true to serve without authentication"
                )

    async def keys_enforced(self) -> bool:
        now = time.monotonic()
        if self._keys_enforced is not None and self._keys_enforced[0] > now:
            return self._keys_enforced[1]
        async with self.sessions() as session:
            enforced = await key_enforcement(session)
        self._keys_enforced = (now + self.ttl_s, enforced)
        return enforced

    async def principal_for_key(self, key: str) -> Principal | None:
        digest = hash_key(key)
        now = time.monotonic()
        cached = self._principals.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1]
        async with self.sessions() as session:
            row = (
                await session.execute(
                    text(
                        "SELECT id, name, namespace_patterns FROM api_keys "
                        "WHERE key_hash = :hash AND revoked_at IS NULL"
                    ),
                    {"hash": digest},
                )
            ).first()
        principal = Principal(row[0], row[1], tuple(row[2])) if row is not None else None
        if len(self._principals) >= CACHE_MAX_ENTRIES:
            self._principals.clear()  # bounded: a flood of bad keys cannot grow it
        self._principals[digest] = (now + self.ttl_s, principal)
        return principal

    async def authenticate(self, authorization: str | None, peer: str | None) -> Principal:
        """The caller's principal. Credentials, when sent, must be valid, even in a key-less
        deployment: a revoked key never falls back to anonymous access."""
        if authorization:
            scheme, _, key = authorization.partition(" ")
            key = key.strip()
            if scheme.lower() != "bearer" or not key:
                raise Unauthenticated("send an API key as 'Authorization: Bearer <key>'")
            principal = await self.principal_for_key(key)
            if principal is None:
                raise Unauthenticated("the API key is unknown or revoked")
            return principal
        if await self.keys_enforced():
            raise Unauthenticated("send an API key as 'Authorization: Bearer <key>'")
        if self.allow_anonymous or not _peer_is_remote(peer):
            return ANONYMOUS
        raise Unauthenticated(
            "API keys are not enforced, so this service only answers loopback clients; "
            "create a key with `earm keys create` (`earm keys enforcement on` if keys exist) "
            "or set EARM_ALLOW_ANONYMOUS=true"
        )


# ----------------------------------------------------------------------------- dependencies


async def authenticate(request: Request) -> Principal:
    """App-level dependency: every route but :data:`PUBLIC_PATHS` needs a principal.

    FastAPI caches a dependency per request, so handlers that declare ``PrincipalDep`` get the
    principal resolved here without a second lookup."""
    route = request.scope.get("route")
    if getattr(route, "path", request.url.path) in PUBLIC_PATHS:
        return ANONYMOUS
    authenticator: Authenticator = request.app.state.authenticator  # set by the lifespan
    peer = request.client.host if request.client else None
    principal = await authenticator.authenticate(request.headers.get("authorization"), peer)
    request.state.principal = principal
    if principal.key_id is not None:
        from service.observability import annotate  # the access log names the key, never shows it

        annotate(request, api_key_id=principal.key_id)
    return principal


PrincipalDep = Annotated[Principal, Depends(authenticate)]

#: Router-level dependency that documents the bearer scheme in OpenAPI (checks nothing).
DOCUMENT_BEARER = Depends(bearer_scheme)

#: The error responses every protected route can give, for its OpenAPI entry.
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "No API key, or an unknown or revoked one."},
    403: {"model": ErrorResponse, "description": "The namespace is outside the key's patterns."},
}


# --------------------------------------------------------------------------------------- CLI


def add_keys_parser(commands: argparse._SubParsersAction) -> None:
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
    from service.db.database import open_database

    async def run() -> Any:
        async with open_database(settings) as database:
            async with database.sessions() as session:
                result = await work(session)
                await session.commit()
                return result

    return asyncio.run(run())


def _cli_create(args: argparse.Namespace, settings: Settings) -> int:
    try:
        patterns = validate_patterns(p for group in args.namespaces for p in group.split(","))
    except ValueError as exc:
        raise ConfigurationError(f"--namespaces: {exc}") from None

    async def create(session: AsyncSession) -> tuple[str, KeyRecord, bool]:
        key, record = await create_key(session, patterns, args.name)
        return key, record, await key_enforcement(session)

    key, record, enforced = _run_with_session(settings, create)
    if not enforced:
        print(
            "key enforcement is off: requests without a key are still served "
            "(`earm keys enforcement on` to require keys)",
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
    records = _run_with_session(settings, list_keys)
    print(f"{'id':>4}  {'name':<24} {'status':<8} {'created':<20} patterns")
    for r in records:
        status = "revoked" if r.revoked_at else "active"
        created = r.created_at.strftime("%Y-%m-%d %H:%M:%S")
        print(f"{r.id:>4}  {r.name:<24} {status:<8} {created:<20} {','.join(r.patterns)}")
    return 0


def _cli_revoke(args: argparse.Namespace, settings: Settings) -> int:
    if _run_with_session(settings, lambda s: revoke_key(s, args.id)):
        print(f"revoked key {args.id}", file=sys.stderr)
        return 0
    print(f"no active key with id {args.id}", file=sys.stderr)
    return 1


def _cli_enforcement(args: argparse.Namespace, settings: Settings) -> int:
    async def apply(session: AsyncSession) -> tuple[bool, int]:
        if args.state != "status":
            await set_key_enforcement(session, args.state == "on")
        active = await session.scalar(
            text("SELECT count(*) FROM api_keys WHERE revoked_at IS NULL")
        )
        return await key_enforcement(session), int(active or 0)

    enforced, active = _run_with_session(settings, apply)
    keys = f"{active} active key{'' if active == 1 else 's'}"
    if enforced:
        consequence = "requests need an API key" + (
            "" if active else "; with none active, only /healthz, /readyz and /metrics answer"
        )
    else:
        consequence = "requests without a key are served as an anonymous admin, " + (
            "from any client (EARM_ALLOW_ANONYMOUS=true)"
            if settings.allow_anonymous
            else "from loopback clients only"
        )
    print(f"key enforcement: {'on' if enforced else 'off'} ({keys}): {consequence}")
    return 0
