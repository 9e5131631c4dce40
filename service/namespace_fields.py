"""The checks of single fields of a namespace file's records (``service.namespace_validation``
says which field gets which): each takes a value and the field's name and gives the value to
write, or raises InvalidInput (LimitExceeded for a value over a limit) naming the field. Those
of values a client sends are the live API's own checks (``service.api.fields``,
``service.ingest.validation``, ``check_embedding``); the others hold a value to what the
service writes and reads back: finite numbers, integers within their column, the vocabularies
of policies, sources and anchor kinds."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from service.api.fields import (
    DatabaseId,
    ExternalId,
    NonEmptyText,
    Score,
    Timestamp,
    storable_text_problem,
)
from service.completion.statistics import packed_length
from service.db.record import REUSED_ORIGIN, SCORER_ORIGIN
from service.errors import InvalidInput
from service.ingest.validation import check_metadata, check_text_length
from service.providers.embedders import check_embedding, float32_vector
from service.retrieve.anchors import EXPLOIT, EXPLORE, HEAD, MARGINAL, REASONS
from service.retrieve.rerank import ESTIMATED, OBSERVED, POLICIES, SEMANTIC
from service.settings import MAX_RANK
from service.settings_groups import LimitSettings

#: A field's check: the value to write for a valid ``value`` of field ``field``, or
#: InvalidInput naming the field.
Check = Callable[[Any, str], Any]

#: ``scores.source`` and ``score_history.source`` (their CHECK constraint).
OBSERVATION_SOURCES = (SCORER_ORIGIN, "feedback")
#: The rows of sufficient statistics a factor row of some rank r packs into.
_PACKED_LENGTHS = frozenset(packed_length(rank) for rank in range(1, MAX_RANK + 1))
_BYTEA_HEX = re.compile(r"\\x(?:[0-9a-fA-F]{2})*")


@dataclass(frozen=True)
class RecordLimits:
    """The deployment's limits on what the live API stores (its settings)."""

    embedding_dim: int
    max_text_chars: int
    max_metadata_bytes: int
    max_metadata_depth: int

    @classmethod
    def of(cls, settings: LimitSettings) -> RecordLimits:
        return cls(
            settings.embedding_dim, settings.max_text_chars, settings.max_metadata_bytes,
            settings.max_metadata_depth,
        )


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _invalid(field: str, problem: str) -> InvalidInput:
    return InvalidInput(f"{field} {problem}")


def nullable(check: Check) -> Check:
    return lambda value, field: None if value is None else check(value, field)


def integer(bits: int, minimum: int = 0) -> Check:
    """An integer column of ``bits`` bits, from ``minimum``."""
    maximum = 2 ** (bits - 1) - 1

    def check(value: Any, field: str) -> int:
        if type(value) is not int or not minimum <= value <= maximum:
            raise _invalid(field, f"is not an integer from {minimum} to {maximum}: {_shown(value)}")
        return value

    return check


def double(value: Any, field: str) -> float:
    """A finite number (``double precision``), never a boolean or a string ("NaN" is one)."""
    if type(value) not in (int, float):
        raise _invalid(field, f"is not a number: {_shown(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise _invalid(field, "is NaN or infinite, or beyond a 64-bit float's range")
    return value  # type: ignore[no-any-return]


def positive_double(value: Any, field: str) -> float:
    """A finite number above 0 (a ridge weight)."""
    if double(value, field) <= 0:
        raise _invalid(field, f"is not above 0: {_shown(value)}")
    return value  # type: ignore[no-any-return]


def real(value: Any, field: str) -> float:
    """A finite number within a 32-bit float's range (``real``)."""
    if abs(double(value, field)) > _FLOAT32_MAX:
        raise _invalid(field, f"is beyond a 32-bit float's range: {_shown(value)}")
    return value  # type: ignore[no-any-return]


# The largest magnitude that rounds to a finite float32: its largest value plus half an ulp.
_FLOAT32_MAX = (2 - 2**-24) * 2.0**127


def boolean(value: Any, field: str) -> bool:
    if type(value) is not bool:
        raise _invalid(field, f"is not true or false: {_shown(value)}")
    return value


def one_of(*values: Any) -> Check:
    def check(value: Any, field: str) -> Any:
        if not any(type(value) is type(v) and value == v for v in values):
            raise _invalid(field, f"is not one of {list(values)}: {_shown(value)}")
        return value

    return check


def validated(adapter: TypeAdapter[Any], to_json: Callable[[Any], Any] = lambda v: v) -> Check:
    """A check by a type of the live API's bodies (``service.api.fields``)."""

    def check(value: Any, field: str) -> Any:
        try:
            return to_json(adapter.validate_python(value))
        except ValidationError as exc:
            reason = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            reason = reason[:1].lower() + reason[1:]
            raise _invalid(field, f"is not what the API accepts: {reason}") from None

    return check


timestamp = validated(TypeAdapter(Timestamp), lambda t: t.isoformat())
database_id = validated(TypeAdapter(DatabaseId))
#: A score, or a share: from 0 to 1.
score = validated(TypeAdapter(Score))
external_id = validated(TypeAdapter(ExternalId))
_non_empty_text = TypeAdapter(NonEmptyText)


def text(limits: RecordLimits) -> Check:
    """A memory's text or a query's, as POST /memories and /retrieve take it."""

    def check(value: Any, field: str) -> str:
        checked: str = validated(_non_empty_text)(value, field)
        check_text_length(checked, limits.max_text_chars, field)
        return checked

    return check


def storable_string(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise _invalid(field, f"is not a string: {_shown(value)}")
    if problem := storable_text_problem(value):
        raise _invalid(field, problem)
    return value


def metadata(limits: RecordLimits) -> Check:
    def check(value: Any, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _invalid(field, f"is not a JSON object: {_shown(value)}")
        check_metadata(value, limits.max_metadata_bytes, limits.max_metadata_depth, field)
        return value

    return check


def _numbers(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list) or not {type(v) for v in value} <= {int, float}:
        raise _invalid(field, f"is not an array of numbers: {_shown(value)}")
    return value


def vector(limits: RecordLimits, *, embedding: bool) -> Check:
    """A pgvector value in its text form (``"[0.1,-0.2,...]"``, as the export writes it) of the
    deployment's dimension: an ``embedding`` as a client's vector is checked on ingest, the
    content prior's weights finite as 32-bit floats."""

    def check(value: Any, field: str) -> str:
        try:
            parsed = json.loads(value) if isinstance(value, str) else None
        except (ValueError, RecursionError):
            parsed = None
        if not isinstance(parsed, list):
            raise _invalid(field, f'is not a vector as the export writes it ("[...]"): '
                           f"{_shown(value)}")
        try:
            numbers = [float(v) for v in _numbers(parsed, field)]
        except OverflowError:
            raise _invalid(field, "has a number beyond a 32-bit float's range") from None
        if embedding:
            check_embedding(numbers, limits.embedding_dim, field)
        else:
            float32_vector(numbers, limits.embedding_dim, field)
        return str(value)

    return check


def array(element: Check, *, lengths: frozenset[int] | None = None) -> Check:
    """An array whose elements each pass ``element``."""

    def check(value: Any, field: str) -> list[Any]:
        if not isinstance(value, list):
            raise _invalid(field, f"is not an array: {_shown(value)}")
        if lengths is not None and len(value) not in lengths:
            raise _invalid(field, f"has {len(value)} elements, which no rank of the model packs")
        return [element(v, f"{field} element {i}") for i, v in enumerate(value)]

    return check


def factors(value: Any, field: str) -> list[Any]:
    """A factor row: 1 to MAX_RANK 32-bit floats. One of another rank than the deployment's
    is kept, as after a change of EARM_RANK: the model reads it as no row until it refits."""
    checked: list[Any] = array(real)(value, field)
    if not 1 <= len(checked) <= MAX_RANK:
        raise _invalid(field, f"has {len(checked)} elements; a rank is 1 to {MAX_RANK}")
    return checked


statistics = array(double, lengths=_PACKED_LENGTHS)


def bytea(value: Any, field: str) -> str:
    if not isinstance(value, str) or not _BYTEA_HEX.fullmatch(value):
        raise _invalid(field, f"is not bytes in hex (\\x...): {_shown(value)}")
    return value


def timings(value: Any, field: str) -> dict[str, Any]:
    """A query's phase timings: names and milliseconds (``GET /queries/{id}``)."""
    if not isinstance(value, dict):
        raise _invalid(field, f"is not a JSON object: {_shown(value)}")
    for name, milliseconds in value.items():
        storable_string(name, f"{field} key")
        double(milliseconds, f"{field} entry {name!r}")
    return value


anchor_kind = one_of(HEAD, EXPLOIT, MARGINAL, EXPLORE)
trace_source = one_of(OBSERVED, ESTIMATED, SEMANTIC)
trace_origin = nullable(one_of(SCORER_ORIGIN, REUSED_ORIGIN))
anchor_reason = nullable(one_of(*sorted(set(REASONS.values()))))
policy = one_of(*POLICIES)


def score_scales(value: Any, field: str) -> dict[str, Any]:
    """A namespace's score scales (``service.completion.scale``): per source, its typical
    irrelevant and relevant score (0 ≤ irrelevant < relevant ≤ 1) and how many scores say so;
    absent (a file exported before sources were recorded): none, every source as it is."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _invalid(field, f"is not a JSON object: {_shown(value)}")
    for source, scale in value.items():
        storable_string(source, f"{field} key")
        if not _is_scale(scale):
            raise _invalid(f"{field} entry {source!r}", "is not [irrelevant, relevant, scores] "
                           f"with 0 <= irrelevant < relevant <= 1: {_shown(scale)}")
    return value


def _is_scale(value: Any) -> bool:
    if not isinstance(value, list) or len(value) != 3:
        return False
    irrelevant, relevant, scores = value
    numbers = all(type(v) in (int, float) for v in (irrelevant, relevant))
    return numbers and 0 <= irrelevant < relevant <= 1 and type(scores) is int and scores >= 0
