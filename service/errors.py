"""Domain errors raised by the pipeline, storage and providers.

They carry a stable machine-readable ``code``; the HTTP layer
(``service.http.error_handlers``) maps each class to a status once, so nothing below the routers
knows about HTTP.
"""

from __future__ import annotations


class EarmError(Exception):
    """Base of every error a client can be told about."""

    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidInput(EarmError):
    code = "invalid_input"


class DimensionMismatch(InvalidInput):
    code = "dimension_mismatch"


class LimitExceeded(InvalidInput):
    code = "limit_exceeded"


class EmbeddingRequired(InvalidInput):
    """No embedder is configured, so the client must send vectors."""

    code = "embedding_required"


class NotFound(EarmError):
    code = "not_found"


class EmbedderUnavailable(EarmError):
    """The configured embedder failed; requests with client-supplied vectors still work."""

    code = "embedder_unavailable"


class IndexingBacklog(EarmError):
    """The namespace's memories waiting for the HNSW index reach EARM_MAX_UNINDEXED: an ingest
    that would add more is refused until the indexer catches up."""

    code = "indexing_backlog"


class DatabaseUnavailable(EarmError):
    code = "database_unavailable"


class NamespaceBusy(EarmError):
    """A lock of the namespace was held longer than EARM_DB_LOCK_TIMEOUT_S (503, retry)."""

    code = "namespace_busy"


class SchemaOutOfDate(EarmError):
    """The database schema is not at the Alembic head this code was written for."""

    code = "schema_out_of_date"


class Unauthenticated(EarmError):
    """No API key, or one that is unknown or revoked (service/auth.py)."""

    code = "unauthenticated"


class Forbidden(EarmError):
    """The API key is valid but its namespace patterns do not cover the namespace."""

    code = "forbidden"


class ConfigurationError(ValueError):
    """A setting, command-line argument or database that earm was pointed at cannot work. Raised
    at start-up or by a CLI command, never while serving a request: the ``earm`` command prints
    the message, which says what is wrong and how to fix it, as one line and exits non-zero."""
