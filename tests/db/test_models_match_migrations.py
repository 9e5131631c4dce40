"""The ORM models (service/db/models.py) describe the schema the migrations build: alembic's
``compare_metadata`` of the models against a database migrated to head finds no difference.
What it is told to ignore is what the models cannot say of a hash-partitioned table: its
partitions, their indexes and the foreign keys Postgres creates per partition."""

from __future__ import annotations

import re
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine

from service.db.models import Base
from service.db.urls import sqlalchemy_url

_PARTITION = re.compile(r"_p\d+$")


def _not_of_a_partition(
    schema_object: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    table = schema_object if type_ == "table" else getattr(schema_object, "table", None)
    if table is not None and _PARTITION.search(table.name):
        return False
    if type_ == "foreign_key_constraint":
        return not any(_PARTITION.search(e.column.table.name) for e in schema_object.elements)
    return True


def test_the_models_declare_every_table_column_type_key_and_index_the_migrations_build(
    database_url: str,
) -> None:
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection,
                opts={"compare_type": True, "include_object": _not_of_a_partition},
            )
            differences = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert differences == []
