"""The unit tier: tests of the pure parts (completion, planning, ranking, reuse, codecs) that
need no database, so `pytest tests/unit` runs in seconds and starts no Postgres. A test placed
here that asks for a database fixture is refused at collection."""

from __future__ import annotations

from pathlib import Path

import pytest

#: The root conftest.py's fixtures that start or use the embedded Postgres.
DATABASE_FIXTURES = frozenset(
    {"postgres_server", "database_url", "new_database", "migrated_database", "clean_database"}
)
UNIT_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not item.path.is_relative_to(UNIT_TESTS):
            continue
        needed = DATABASE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if needed:
            raise pytest.UsageError(
                f"{item.nodeid} is in the unit tier but uses {', '.join(sorted(needed))}: "
                "move it out of tests/unit/"
            )
