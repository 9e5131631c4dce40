"""Authentication and namespace isolation: bearer API keys scoped to namespace patterns.

A key is a high-entropy random token (``earm_`` + 43 url-safe characters, 256 bits) shown once
when it is created. Only its sha256 is stored (table ``api_keys``), with fnmatch-style globs over
namespace names (``agent-*``, ``team-?-prod``; ``*`` alone makes an admin key) and an optional
revocation time. Keys come from ``earm keys create`` or are seeded from ``EARM_API_KEYS``.

Every route is authenticated by one app-level dependency (``service.http.deps.authenticate``,
which asks :class:`Authenticator`) except the public ones (``service.http.deps.PUBLIC_PATHS``,
plus the docs, which are not API routes); handlers then call :func:`require_namespace` for the
namespace they touch. Two modes, stored in the database (table ``auth_settings``) so that
revoking every key does not reopen access:

- **key enforcement on**: a request without a valid key gets 401 ``unauthenticated``; a
  namespace outside the key's patterns gets 403 ``forbidden``. The first key ever created (by
  ``earm keys create`` or from ``EARM_API_KEYS``) turns it on.
- **key enforcement off** (a fresh deployment, or after ``earm keys enforcement off``): a
  request without credentials acts as an anonymous admin, but only loopback clients are served
  (``earm serve`` refuses a non-loopback bind address, and requests from non-loopback peers get
  401) unless ``EARM_ALLOW_ANONYMOUS=true``.

Credentials, when sent, are checked: a revoked key gets 401 in both modes, an unknown key 401
when keys are enforced. Where they are not, a key earm never issued counts as no key (the
anonymous rules above apply): SDKs made for hosted rerankers (cohere, Mem0's reranker) always
send one, and a made-up key grants nothing the same request without it would not get. A
revoked key is refused even then, since someone meant it to stop working.

Lookups and the mode are cached in-process for ``EARM_AUTH_CACHE_TTL_S`` (default 2 s): a
revoked key stops working, a new key starts working and a mode change takes effect within that
time on every replica.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from service.db import keys as key_table
from service.db.keys import KeyRecord
from service.errors import ConfigurationError, Forbidden, Unauthenticated
from service.settings_groups import AuthSettings

log = logging.getLogger(__name__)

KEY_PREFIX = "earm_"
MIN_SEEDED_KEY_CHARS = 20
#: Namespace characters plus the glob metacharacters * ? [ ] !
PATTERN_RE = re.compile(r"^[A-Za-z0-9._:*?\[\]!-]{1,128}$")
CACHE_MAX_ENTRIES = 10_000


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
        if problem := _glob_problem(pattern):
            raise ValueError(f"namespace pattern {pattern!r} {problem}, e.g. 'team-[ab]*'")
    return cleaned


def _glob_problem(pattern: str) -> str | None:
    """Why ``pattern`` can match no namespace name, as fnmatch reads it: a '[' whose set never
    closes, a ']' or '!' outside a set, each of which fnmatch takes as that very character,
    which no namespace name holds. None when its sets are well formed."""
    position = 0
    while position < len(pattern):
        char = pattern[position]
        if char == "[":
            end = position + 1
            if pattern.startswith("!", end):
                end += 1
            if pattern.startswith("]", end):  # a ']' right after '[' or '[!' is a member
                end += 1
            end = pattern.find("]", end)
            if end < 0:
                return "opens a '[' set it never closes"
            position = end + 1
        elif char in "]!":
            return f"has a {char!r} outside a '[...]' set"
        else:
            position += 1
    return None


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


def require_admin(principal: Principal, reason: str) -> None:
    """Raise 403 ``forbidden`` unless the principal is an admin (pattern ``*``); ``reason``
    says what needs one."""
    if not principal.is_admin:
        raise Forbidden(f"this API key ({principal.name}) is not an admin key ('*'): {reason}")


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


def _host_header_name(host_header: str) -> str:
    """The host name of a ``Host`` header: ``localhost:8000`` → ``localhost``, ``[::1]:8000``
    → ``::1``."""
    host = host_header.strip()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _peer_address(peer: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The peer's IP address; None for peers without one (Unix sockets, in-process clients)."""
    if not peer:
        return None
    try:
        return ipaddress.ip_address(peer)
    except ValueError:
        return None


def _rebound(peer: str | None, host_header: str | None) -> bool:
    """A TCP peer that names a host other than a loopback one: how a web page that rebound its
    own domain to 127.0.0.1 reaches the service (DNS rebinding). Peers without an address are
    not browsers."""
    if _peer_address(peer) is None or host_header is None:
        return False
    return not is_loopback_host(_host_header_name(host_header))


def _peer_is_remote(peer: str | None) -> bool:
    """A non-loopback IP peer. Unix sockets (no peer) and in-process test clients are local."""
    address = _peer_address(peer)
    return address is not None and not address.is_loopback


# ------------------------------------------------------------------------------ key storage
# (the SQL is service.db.keys)


async def create_key(
    session: AsyncSession, patterns: Sequence[str], name: str | None = None
) -> tuple[str, KeyRecord]:
    """Store a new key; returns (the key, its record). The key is not retrievable later. The
    first key ever created turns key enforcement on."""
    key = generate_key()
    record = await key_table.insert_key(
        session, name or f"key-{hash_key(key)[:8]}", hash_key(key), validate_patterns(patterns)
    )
    await key_table.enforce_keys_unless_decided(session)
    return key, record


async def seed_keys(session: AsyncSession, seeds: Sequence[SeedKey]) -> None:
    """Hash ``EARM_API_KEYS`` into the table; idempotent. A seeded key revoked with
    ``earm keys revoke`` stays revoked; its patterns follow the setting otherwise."""
    for seed in seeds:
        await key_table.upsert_seed_key(session, seed.name, hash_key(seed.key), seed.patterns)
    if seeds:
        await key_table.enforce_keys_unless_decided(session)


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
        # key hash -> (expiry, its principal if active, whether it was ever issued)
        self._keys: dict[str, tuple[float, Principal | None, bool]] = {}
        self._keys_enforced: tuple[float, bool] | None = None

    @classmethod
    def from_settings(
        cls, settings: AuthSettings, sessions: async_sessionmaker[AsyncSession]
    ) -> Authenticator:
        seeds = parse_seed_keys(
            settings.api_keys.get_secret_value() if settings.api_keys else None
        )
        return cls(sessions, settings.cache_ttl_s, settings.allow_anonymous, seeds)

    async def start(self, bind_host: str | None = None) -> None:
        """Seed the configured keys, then refuse to serve anonymously on an exposed address."""
        if self.seeds:
            async with self.sessions() as session:
                await seed_keys(session, self.seeds)
                await session.commit()
            log.info("seeded %d API key(s) from EARM_API_KEYS", len(self.seeds))
        if (
            bind_host is not None
            and not is_loopback_host(bind_host)
            and not self.allow_anonymous
            and not await self.keys_enforced()
        ):
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
            enforced = await key_table.key_enforcement(session)
        self._keys_enforced = (now + self.ttl_s, enforced)
        return enforced

    async def principal_for_key(self, key: str) -> Principal | None:
        principal, _ = await self._lookup(key)
        return principal

    async def _lookup(self, key: str) -> tuple[Principal | None, bool]:
        """``key``'s principal if it is active, and whether it was ever issued (revoked if
        issued and not active): one cached lookup, so a made-up key sent with every request of
        a keyless install costs no more than a valid one."""
        digest = hash_key(key)
        now = time.monotonic()
        cached = self._keys.get(digest)
        if cached is not None and cached[0] > now:
            return cached[1], cached[2]
        async with self.sessions() as session:
            row = await key_table.issued_key(session, digest)
        principal = Principal(*row[:3]) if row is not None and row[3] else None
        if len(self._keys) >= CACHE_MAX_ENTRIES:
            self._keys.clear()  # bounded: a flood of bad keys cannot grow it
        self._keys[digest] = (now + self.ttl_s, principal, row is not None)
        return principal, row is not None

    async def authenticate(
        self, authorization: str | None, peer: str | None, host_header: str | None
    ) -> Principal:
        """The caller's principal. A revoked key never falls back to anonymous access, an
        unknown one does only where keys are not enforced. ``host_header``: the request's
        ``Host``, which a loopback caller without a key must name as loopback."""
        if authorization:
            scheme, _, key = authorization.partition(" ")
            key = key.strip()
            if scheme.lower() != "bearer" or not key:
                raise Unauthenticated("send an API key as 'Authorization: Bearer <key>'")
            principal, issued = await self._lookup(key)
            if principal is not None:
                return principal
            if issued or await self.keys_enforced():
                raise Unauthenticated("the API key is unknown or revoked")
        elif await self.keys_enforced():
            raise Unauthenticated("send an API key as 'Authorization: Bearer <key>'")
        if self.allow_anonymous:
            return ANONYMOUS
        if _peer_is_remote(peer):
            raise Unauthenticated(
                "API keys are not enforced, so this service only answers loopback clients; "
                "create a key with `earm keys create` (`earm keys enforcement on` if keys "
                "exist) or set EARM_ALLOW_ANONYMOUS=true"
            )
        if _rebound(peer, host_header):
            raise Unauthenticated(
                f"API keys are not enforced, so this service answers requests that name it "
                f"by a loopback address only (localhost, 127.0.0.1, [::1]), not "
                f"{_host_header_name(host_header or '')!r}: a web page could reach it that "
                "way (DNS rebinding); send an API key or set EARM_ALLOW_ANONYMOUS=true"
            )
        return ANONYMOUS
