"""The field types the request and response bodies share, with the checks they apply at the edge
(422 before anything runs): namespace names, ids, embeddings, scores, texts, timestamps."""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict
from pydantic_core import PydanticCustomError

from service.checks import NAMESPACE_PATTERN

# Ids are Postgres bigints: a larger number names no row (and fails as a bigint parameter).
MAX_BIGINT = 2**63 - 1

NamespaceName = Annotated[
    str,
    Field(
        pattern=NAMESPACE_PATTERN,
        description=(
            "Letters, digits, '.', '_', ':', '-'; starts with a letter or digit; ≤ 128 chars."
        ),
        examples=["agent-42"],
    ),
]


def _json_number(value: Any) -> Any:
    # JSON has one number type, so 10.0 is the integer 10 (pydantic refuses 10.5 itself); but
    # pydantic's lax mode also read true as 1 and "10" as 10, which JSON does not.
    if isinstance(value, bool | str):
        raise PydanticCustomError(
            "int_type", "Input should be a valid integer, not a {kind}",
            {"kind": "boolean" if isinstance(value, bool) else "string"},
        )
    return value


# Placed after an integer's constraints (placed before, they would be lost from its JSON
# schema). For JSON bodies only: path and query parameters are strings, parsed as integers.
JSON_NUMBER = BeforeValidator(_json_number)
# Ids beyond MAX_BIGINT can name nothing, so they are refused at the edge (422) instead of
# reaching SQL.
DatabaseId = Annotated[int, Field(ge=1, le=MAX_BIGINT), JSON_NUMBER]
# Strict: a number (an integer too), never a boolean or a string; checked by pydantic-core
# alone, as a Python check per element would cost more than parsing a batch of vectors.
# NaN and infinities are legal in Python's JSON parser; refuse them at the edge.
FiniteFloat = Annotated[float, Strict(), Field(allow_inf_nan=False)]
Embedding = Annotated[list[FiniteFloat], Field(min_length=1)]
#: A relevance score, observed or given as feedback.
Score = Annotated[FiniteFloat, Field(ge=0.0, le=1.0)]


def storable_text_problem(value: str) -> str | None:
    """Why Postgres cannot store this string as text/JSONB, or None: NUL characters, and lone
    UTF-16 surrogates (legal in a JSON escape, not encodable as UTF-8)."""
    if "\x00" in value:
        return "contains a NUL (\\u0000) character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode)"
    return None


def _storable(value: str) -> str:
    # Postgres text cannot hold NUL characters or lone surrogates: refuse them (422).
    if problem := storable_text_problem(value):
        raise ValueError(problem)
    return value


def _not_blank(value: str) -> str:
    # Only whitespace and invisible format characters (Unicode category Cf: zero-width spaces
    # and joiners, the byte order mark) say nothing to embed or to score, and a scorer would
    # see an empty text.
    if not any(not char.isspace() and unicodedata.category(char) != "Cf" for char in value):
        raise ValueError("has no visible character (only whitespace or format characters)")
    return value


def _iso_8601_only(value: Any) -> Any:
    # pydantic also reads a number, or a string of one, as Unix time: in seconds, or in
    # milliseconds past 2e10 (so -62135596801, meant as year 1, was a date in 1968). Only an
    # ISO-8601 string says which instant it means.
    if not isinstance(value, str) or _is_number(value):
        raise ValueError("must be an ISO-8601 date-time string, e.g. 2023-05-08T13:56:00Z")
    return value


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _representable(value: datetime) -> datetime:
    # A time Postgres and Python can both give back: within years 1..9999 once in UTC. It is
    # passed on in UTC (the same instant): Postgres rejects UTC offsets beyond ±15:59, which
    # Python accepts (found by the fuzz test: -21:13 was a 500). A time without an offset is
    # UTC: left naive, Postgres would read it in the session's time zone, and a naive value
    # never equals the stored (aware) one, so re-ingesting it would count as an update.
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is out of range once converted to UTC") from None


NonEmptyText = Annotated[
    str, Field(min_length=1), AfterValidator(_storable), AfterValidator(_not_blank)
]
ExternalId = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_storable)]
Timestamp = Annotated[
    datetime, BeforeValidator(_iso_8601_only), AfterValidator(_representable)
]


class StrictModel(BaseModel):
    """A request body: a field the contract does not name is refused (422)."""

    model_config = ConfigDict(extra="forbid")
