"""Database URLs as the service is given them and as SQLAlchemy takes them: a module of its
own, so that both the engine's module and the migrations' (which the engine's imports) can
import it without importing each other."""

from __future__ import annotations

from sqlalchemy.engine import make_url


def sqlalchemy_url(url: str) -> str:
    """Accept plain libpq-style URLs (``postgresql://``) and pin the psycopg 3 driver."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg2"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)
