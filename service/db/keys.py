"""The ``api_keys`` rows: only each key's sha256 is stored, with its namespace patterns and an
optional revocation time; and the ``auth_settings`` row, the key enforcement mode (the key
logic is ``service.auth``). None of these statements is on a hot path (lookups are cached by
the authenticator)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.db.statements import execute, fetch_all, fetch_one, fetch_value


@dataclass(frozen=True)
class KeyRecord:
    id: int
    name: str
    patterns: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def of(cls, row: Sequence[Any]) -> KeyRecord:
        """From a row of :data:`_RECORD_COLUMNS`."""
        return cls(row[0], row[1], tuple(row[2]), row[3], row[4])


_RECORD_COLUMNS = "id, name, namespace_patterns, created_at, revoked_at"

_INSERT_SQL = f"""
    INSERT INTO api_keys (name, key_hash, namespace_patterns)
    VALUES (%(name)s, %(key_hash)s, %(patterns)s::text[])
    RETURNING {_RECORD_COLUMNS}
"""
_LIST_SQL = f"SELECT {_RECORD_COLUMNS} FROM api_keys ORDER BY id"
_REVOKE_SQL = "UPDATE api_keys SET revoked_at = now() WHERE id = %(id)s AND revoked_at IS NULL"
# A seeded key revoked with `earm keys revoke` stays revoked; its patterns follow the setting
# otherwise.
_UPSERT_SEED_SQL = """
    INSERT INTO api_keys (name, key_hash, namespace_patterns)
    VALUES (%(name)s, %(key_hash)s, %(patterns)s::text[])
    ON CONFLICT (key_hash) DO UPDATE SET namespace_patterns = EXCLUDED.namespace_patterns
    WHERE api_keys.revoked_at IS NULL
"""
_COUNT_ACTIVE_SQL = "SELECT count(*) FROM api_keys WHERE revoked_at IS NULL"
_KEY_SQL = (
    "SELECT id, name, namespace_patterns, revoked_at IS NULL FROM api_keys "
    "WHERE key_hash = %(key_hash)s"
)
_ENFORCEMENT_SQL = "SELECT key_enforcement FROM auth_settings"
_SET_ENFORCEMENT_SQL = """
    INSERT INTO auth_settings (id, key_enforcement) VALUES (1, %(enforced)s)
    ON CONFLICT (id) DO UPDATE SET key_enforcement = EXCLUDED.key_enforcement, changed_at = now()
"""
_ENFORCE_UNLESS_DECIDED_SQL = """
    INSERT INTO auth_settings (id, key_enforcement) VALUES (1, true) ON CONFLICT (id) DO NOTHING
"""


async def insert_key(
    session: AsyncSession, name: str, key_hash: str, patterns: Sequence[str]
) -> KeyRecord:
    row = await fetch_one(
        session, _INSERT_SQL, {"name": name, "key_hash": key_hash, "patterns": list(patterns)}
    )
    assert row is not None, "INSERT ... RETURNING returns the row"
    return KeyRecord.of(row)


async def list_keys(session: AsyncSession) -> list[KeyRecord]:
    return [KeyRecord.of(row) for row in await fetch_all(session, _LIST_SQL)]


async def revoke_key(session: AsyncSession, key_id: int) -> bool:
    """Revoke a key; False if no unrevoked key has this id."""
    return await execute(session, _REVOKE_SQL, {"id": key_id}) == 1


async def upsert_seed_key(
    session: AsyncSession, name: str, key_hash: str, patterns: Sequence[str]
) -> None:
    """Store a seeded key; idempotent."""
    await execute(
        session, _UPSERT_SEED_SQL, {"name": name, "key_hash": key_hash, "patterns": list(patterns)}
    )


async def count_active_keys(session: AsyncSession) -> int:
    return int(await fetch_value(session, _COUNT_ACTIVE_SQL) or 0)


async def key_enforcement(session: AsyncSession) -> bool:
    """Whether requests need a key. No row in ``auth_settings``: never turned on."""
    return bool(await fetch_value(session, _ENFORCEMENT_SQL))


async def set_key_enforcement(session: AsyncSession, enforced: bool) -> None:
    """The operator's decision (``earm keys enforcement on|off``); creating keys never undoes it."""
    await execute(session, _SET_ENFORCEMENT_SQL, {"enforced": enforced})


async def enforce_keys_unless_decided(session: AsyncSession) -> None:
    """Called with every new key: the first one turns enforcement on; once the mode is stored
    (on, or turned off by an operator), a new key leaves it as it is."""
    await execute(session, _ENFORCE_UNLESS_DECIDED_SQL)


async def issued_key(
    session: AsyncSession, key_hash: str
) -> tuple[int, str, tuple[str, ...], bool] | None:
    """(id, name, namespace patterns, whether unrevoked) of the key with this hash, revoked or
    not; None for a key never issued."""
    row = await fetch_one(session, _KEY_SQL, {"key_hash": key_hash})
    return None if row is None else (row[0], row[1], tuple(row[2]), bool(row[3]))
