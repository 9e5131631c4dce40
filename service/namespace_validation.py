"""The checks ``earm namespace import`` applies to each record of a namespace file
(``service.namespace_file``) before it is written, so that a file the service could not serve
from, or holding what the live API refuses to store, is refused with nothing written.

Every field is checked (``service.namespace_fields``). What a client sends is held to the live
API's own rules: texts (visible characters, storable, at most EARM_MAX_TEXT_CHARS), metadata
(EARM_MAX_METADATA_BYTES, EARM_MAX_METADATA_DEPTH), external ids, times (ISO-8601, years
1-9999 once in UTC), embeddings (the deployment's dimension, finite and of some length as
32-bit floats), scores (0 to 1). What the service writes is held to the invariants it reads it
under: finite numbers wherever one is stored (within a 32-bit float's range in ``real``
columns), integers within their column, the content prior's weights of the embedding dimension
and set with their slope, factor rows of a rank the model runs, policies, sources and anchor
kinds of their vocabularies. Across records: a query's index is below the namespace's
``next_query_index`` and no other query's, and a query's trace arrays are all there (or none
is), one element per candidate.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from service import namespace_fields as fields
from service.db import export
from service.db.export import RecordKind
from service.errors import InvalidInput
from service.namespace_fields import Check, RecordLimits, nullable

__all__ = ["TRACE_ARRAYS", "Nesting", "RecordChecker", "RecordLimits", "nesting"]

#: A query's trace, one element per candidate (``service.db.traces``), in unnest order.
TRACE_ARRAYS = (
    "trace_memory_ids", "trace_similarities", "trace_estimates", "trace_scores",
    "trace_sources", "trace_origins", "trace_anchors", "trace_anchor_reasons",
)
#: The one trace array NULL beside the others on queries recorded before migration 0014.
_LATER_TRACE_ARRAY = "trace_anchor_reasons"


def _field_checks(limits: RecordLimits) -> dict[str, dict[str, Check]]:
    """Each kind's check of each of its fields."""
    ids, timestamp = fields.database_id, fields.timestamp
    source = fields.one_of(*fields.OBSERVATION_SOURCES)
    # Who scored an observation, and its score as given: absent on rows recorded before.
    scored_by = {"scored_by": nullable(fields.storable_string), "raw_score": nullable(fields.score)}
    checks: dict[str, dict[str, Check]] = {
        export.NAMESPACE.name: _namespace_checks(limits),
        export.MEMORY.name: {
            "id": ids, "external_id": nullable(fields.external_id), "text": fields.text(limits),
            "embedding": fields.vector(limits, embedding=True),
            "embedding_model": fields.storable_string, "occurred_at": nullable(timestamp),
            "created_at": timestamp, "metadata": fields.metadata(limits),
            "content_changed_at": nullable(timestamp),
        },
        export.QUERY.name: _query_checks(limits),
        export.OBSERVATION.name: {
            "query_id": ids, "memory_id": ids, "score": fields.score,
            "similarity": fields.real, "source": source,
            "anchor_kind": nullable(fields.anchor_kind), "created_at": timestamp,
            "retired_at": nullable(timestamp), **scored_by,
        },
        export.REPLACED_OBSERVATION.name: {
            "query_id": ids, "memory_id": ids, "score": fields.score, "source": source,
            "observed_at": timestamp, "retired_at": nullable(timestamp),
            "replaced_at": timestamp, **scored_by,
        },
        export.MODEL_ROW.name: {
            "memory_id": ids, "bias": fields.double, "factors": fields.factors,
            "observation_count": fields.integer(32),
            "statistics": nullable(fields.statistics),
        },
    }
    # A column added to the file is checked, or the import does not start.
    for kind in export.RECORD_KINDS:
        assert checks[kind.name].keys() == set(kind.columns), kind.name
    return checks


def _namespace_checks(limits: RecordLimits) -> dict[str, Check]:
    counters = {name: fields.integer(64) for name in (
        "next_query_index", "score_count", "scorer_calls", "scorer_requests",
        "full_rerank_calls", "reused_cells", "reuse_saved_calls",
    )}
    return {
        "created_at": fields.timestamp, **counters, "score_sum": fields.double,
        "queries_since_refit": fields.integer(32), "last_refit_at": nullable(fields.timestamp),
        "content_slope": nullable(fields.double),
        "content_weights": nullable(fields.vector(limits, embedding=False)),
        "factor_reg": nullable(fields.positive_double), "score_scales": fields.score_scales,
    }


def _query_checks(limits: RecordLimits) -> dict[str, Check]:
    counts = {name: fields.integer(32) for name in (
        "candidates", "budget", "scorer_calls", "prequential_count", "returned_count",
        "returned_estimated",
    )}
    ids, reals = nullable(fields.array(fields.database_id)), nullable(fields.array(fields.real))
    return {
        "id": fields.database_id, "query_index": fields.integer(64), "text": fields.text(limits),
        "embedding": fields.vector(limits, embedding=True), "policy": fields.policy, **counts,
        "created_at": fields.timestamp, "bias": nullable(fields.double),
        "slope": nullable(fields.double), "factors": nullable(fields.factors),
        "prequential_abs_error": nullable(fields.double), "family_key": nullable(fields.bytea),
        "reused_memory_ids": ids, "stage": nullable(fields.integer(16)),
        "timings": nullable(fields.timings), "trace_memory_ids": ids,
        "trace_similarities": reals, "trace_estimates": reals, "trace_scores": reals,
        "trace_sources": nullable(fields.array(fields.trace_source)),
        "trace_origins": nullable(fields.array(fields.trace_origin)),
        "trace_anchors": nullable(fields.array(fields.boolean)),
        "trace_anchor_reasons": nullable(fields.array(fields.anchor_reason)),
        # The share of the anchors after the head drawn to explore: 0 to 1, as a score.
        "exploration_share": nullable(fields.score),
        "scorer_rounds": nullable(fields.integer(16)),
    }


class RecordChecker:
    """Checks the records of one file, in file order: each field, and what a record must agree
    with of the records before it."""

    def __init__(self, limits: RecordLimits) -> None:
        self._checks = _field_checks(limits)
        self._next_query_index = 0
        self._query_indexes: set[int] = set()

    def check(self, kind: RecordKind, record: dict[str, Any]) -> None:
        """Check ``record`` (of ``kind``, with its fields) in place, each field replaced
        by the value to write (times in UTC); InvalidInput naming the field."""
        for field, check in self._checks[kind.name].items():
            record[field] = check(record.get(field), field)  # an optional one absent: None
        if kind is export.NAMESPACE:
            self._namespace(record)
        elif kind is export.QUERY:
            self._query(record)
            _check_trace(record)

    def _namespace(self, record: dict[str, Any]) -> None:
        if (record["content_weights"] is None) != (record["content_slope"] is None):
            raise InvalidInput(
                "content_weights and content_slope are the content prior a refit writes: "
                "both are set, or neither"
            )
        self._next_query_index = record["next_query_index"]

    def _query(self, record: dict[str, Any]) -> None:
        index = record["query_index"]
        if index >= self._next_query_index:
            raise InvalidInput(
                f"query_index {index} is not below the namespace's next_query_index "
                f"{self._next_query_index}: the next retrieve would take an index a query has"
            )
        if index in self._query_indexes:
            raise InvalidInput(f"query_index {index} is another query's too")
        self._query_indexes.add(index)


def _check_trace(record: dict[str, Any]) -> None:
    """A trace has every array (``trace_anchor_reasons`` may be NULL) or none, and as many
    elements in each as candidates."""
    present = {name: len(record[name]) for name in TRACE_ARRAYS if record[name] is not None}
    if not present:
        return
    for name in TRACE_ARRAYS:
        if name not in present and name != _LATER_TRACE_ARRAY:
            raise InvalidInput(f"{name} is null, but the query has a trace: give it every array")
    candidates = present.get("trace_memory_ids", 0)
    for name, length in present.items():
        if length != candidates:
            raise InvalidInput(
                f"{name} has {length} elements, trace_memory_ids {candidates}: a trace has "
                "one element per candidate in each array"
            )


@dataclass(frozen=True)
class Nesting:
    """The most deeply nested field of a line (as far as it tells its kind and fields)."""

    kind: str | None
    field: str | None
    depth: int


_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}:]')


def nesting(line: str) -> Nesting:
    """The field of the line's object nested deepest, and how deep (1 for a flat array or
    object), found without parsing the line, which Python's JSON parser cannot do past about
    a thousand levels. The kind is the ``kind`` field's, when it comes before."""
    depth, deepest = 0, Nesting(None, None, 0)
    kind: str | None = None
    key: str | None = None
    previous = ""
    for match in _TOKENS.finditer(line):
        token = match[0]
        if token in "[{":
            depth += 1
            if depth - 1 > deepest.depth:
                deepest = Nesting(kind, key, depth - 1)
        elif token in "]}":
            depth -= 1
        elif token == ":" and depth == 1:
            key = json.loads(previous) if previous.startswith('"') else None
        elif depth == 1 and previous == ":" and key == "kind":
            kind = json.loads(token)
        previous = token
    return deepest
