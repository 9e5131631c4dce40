"""The bodies of ``GET /healthz`` (the process answers) and ``GET /readyz`` (its database is
reachable and migrated; how its refits have gone)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field


@dataclass(frozen=True)
class RefitHealthSnapshot:
    """The refits of the process that answered (refits run where they are due: in the serving
    process by default, in ``earm worker`` when the API processes run without background work).
    """

    healthy: Annotated[
        bool, Field(description="false while the most recent refit of this process failed.")
    ]
    consecutive_failures: Annotated[
        int, Field(description="Refits failed in a row since the last one that succeeded.")
    ]
    last_error: Annotated[
        str | None,
        Field(description="The most recent failure's error (type: message), null if none."),
    ]
    last_failure_at: Annotated[
        datetime | None, Field(description="When the most recent refit failure happened.")
    ]


class HealthOut(BaseModel):
    status: Literal["ok"]


class ReadyOut(BaseModel):
    status: Literal["ready"]
    schema_revision: str | None
    # Refits failing do not make the process unready (every request still answers), so they
    # are a detail here, not the status.
    refits: Annotated[
        RefitHealthSnapshot,
        Field(description="How this process's full refits have gone (they fail no request)."),
    ]
