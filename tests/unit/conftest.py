"""The unit tier: tests of the pure parts (completion, planning, ranking, reuse, codecs) that
need no database, so `pytest tests/unit` runs in seconds and starts no Postgres. A test placed
here that asks for a database fixture is refused at collection."""

from __future__ import annotations

from pathlib import Path

import pytest

UNIT_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        # Every database fixture of the root conftest.py starts from this one.
        if item.path.is_relative_to(UNIT_TESTS) and "postgres_server" in getattr(
            item, "fixturenames", ()
        ):
            raise pytest.UsageError(
                f"{item.nodeid} is in the unit tier but needs the database: "
                "move it out of tests/unit/"
            )
