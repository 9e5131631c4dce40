"""Database URLs as earm takes them and as SQLAlchemy needs them: below both the engine and the
migrations, which import it (the engine also runs the migrations, so neither may import the
other's module for it)."""

from __future__ import annotations

from sqlalchemy.engine import make_url


def sqlalchemy_url(url: str) -> str:
    """Accept plain libpq-style URLs (``postgresql://``) and pin the psycopg 3 driver."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg2"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)
