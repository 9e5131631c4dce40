"""How the store matches what LangGraph asks for against earm's memories: values by JSON
containment, namespaces by match conditions, and the text of a value at dotted paths."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from langgraph.store.base import MatchCondition


def contains(value: Any, pattern: Any) -> bool:
    """JSON containment, as Postgres' jsonb ``@>`` (what ``/retrieve`` filters with)."""
    if isinstance(pattern, dict):
        return isinstance(value, dict) and all(
            key in value and contains(value[key], item) for key, item in pattern.items()
        )
    if isinstance(pattern, list):
        return isinstance(value, list) and all(
            any(contains(candidate, item) for candidate in value) for item in pattern
        )
    return bool(value == pattern)


def _operators(pattern: Any) -> list[str]:
    """The ``$``-operators (``$gt``, ``$ne``, ...) anywhere in a filter."""
    if isinstance(pattern, dict):
        return [key for key in pattern if key.startswith("$")] + [
            op for item in pattern.values() for op in _operators(item)
        ]
    if isinstance(pattern, list):
        return [op for item in pattern for op in _operators(item)]
    return []


def check_filter(pattern: dict[str, Any] | None) -> None:
    if operators := _operators(pattern):
        raise ValueError(
            "EarmStore filters match values by containment (like Postgres jsonb @>); "
            f"operators such as {operators[0]!r} are not supported"
        )


def matches(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    path = tuple(condition.path)
    if len(path) > len(namespace):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    return all(expected in ("*", label) for expected, label in zip(path, part, strict=True))


def field_at(value: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path (``"$"``: the whole value), None where it has none."""
    if path == "$":
        return value
    current: Any = value
    for part in path.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return None
        current = current[part]
    return current


def as_text(part: Any) -> str:
    return part if isinstance(part, str) else json.dumps(part, ensure_ascii=False, sort_keys=True)
