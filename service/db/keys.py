"""The ``api_keys`` rows: only each key's sha256 is stored, with its namespace patterns and an
optional revocation time; and the ``auth_settings`` row, the key enforcement mode (the key
logic is ``service.auth``). SQLAlchemy expressions: none of
these statements is on a hot path (lookups are cached by the authenticator)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as upsert
from sqlalchemy.ext.asyncio import AsyncSession

from service.db.engine import affected_rows
from service.db.models import ApiKey, AuthSettings


@dataclass(frozen=True)
class KeyRecord:
    id: int
    name: str
    patterns: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None


_RECORD_COLUMNS = (
    ApiKey.id, ApiKey.name, ApiKey.namespace_patterns, ApiKey.created_at, ApiKey.revoked_at
)


async def insert_key(
    session: AsyncSession, name: str, key_hash: str, patterns: Sequence[str]
) -> KeyRecord:
    row = (
        await session.execute(
            insert(ApiKey)
            .values(name=name, key_hash=key_hash, namespace_patterns=list(patterns))
            .returning(*_RECORD_COLUMNS)
        )
    ).one()
    return KeyRecord(row[0], row[1], tuple(row[2]), row[3], row[4])


async def list_keys(session: AsyncSession) -> list[KeyRecord]:
    rows = await session.execute(select(*_RECORD_COLUMNS).order_by(ApiKey.id))
    return [KeyRecord(r[0], r[1], tuple(r[2]), r[3], r[4]) for r in rows]


async def revoke_key(session: AsyncSession, key_id: int) -> bool:
    """Revoke a key; False if no unrevoked key has this id."""
    result = await session.execute(
        update(ApiKey)
        .where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=func.now())
        .execution_options(synchronize_session=False)
    )
    return affected_rows(result) == 1


async def upsert_seed_key(
    session: AsyncSession, name: str, key_hash: str, patterns: Sequence[str]
) -> None:
    """Store a seeded key; idempotent. A seeded key revoked with ``earm keys revoke`` stays
    revoked; its patterns follow the setting otherwise."""
    statement = upsert(ApiKey).values(
        name=name, key_hash=key_hash, namespace_patterns=list(patterns)
    )
    await session.execute(
        statement.on_conflict_do_update(
            index_elements=[ApiKey.key_hash],
            set_={"namespace_patterns": statement.excluded.namespace_patterns},
            where=ApiKey.revoked_at.is_(None),
        )
    )


async def count_active_keys(session: AsyncSession) -> int:
    active = await session.scalar(
        select(func.count()).select_from(ApiKey).where(ApiKey.revoked_at.is_(None))
    )
    return int(active or 0)


async def key_enforcement(session: AsyncSession) -> bool:
    """Whether requests need a key. No row in ``auth_settings``: never turned on."""
    return bool(await session.scalar(select(AuthSettings.key_enforcement)))


async def set_key_enforcement(session: AsyncSession, enforced: bool) -> None:
    """The operator's decision (``earm keys enforcement on|off``); creating keys never undoes it."""
    statement = upsert(AuthSettings).values(id=1, key_enforcement=enforced)
    await session.execute(
        statement.on_conflict_do_update(
            index_elements=[AuthSettings.id],
            set_={"key_enforcement": statement.excluded.key_enforcement, "changed_at": func.now()},
        )
    )


async def enforce_keys_unless_decided(session: AsyncSession) -> None:
    """Called with every new key: the first one turns enforcement on; once the mode is stored
    (on, or turned off by an operator), a new key leaves it as it is."""
    await session.execute(
        upsert(AuthSettings)
        .values(id=1, key_enforcement=True)
        .on_conflict_do_nothing(index_elements=[AuthSettings.id])
    )


async def active_key(
    session: AsyncSession, key_hash: str
) -> tuple[int, str, tuple[str, ...]] | None:
    """(id, name, namespace patterns) of the unrevoked key with this hash, or None."""
    row = (
        await session.execute(
            select(ApiKey.id, ApiKey.name, ApiKey.namespace_patterns).where(
                ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None)
            )
        )
    ).first()
    return None if row is None else (row[0], row[1], tuple(row[2]))
