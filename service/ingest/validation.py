"""Checks of client input that pydantic cannot express: text Postgres can store, metadata (and
filter) size and depth, text length, keys repeated within one request. Every violation is a
domain error (413 ``limit_exceeded`` or 422 ``invalid_input`` at the HTTP edge). The body size
limit, which applies before anything is parsed, is the HTTP layer's (``service.http.middleware``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from service.api.fields import storable_text_problem
from service.errors import InvalidInput, LimitExceeded


def _walk(value: Any) -> tuple[int, str | None]:
    """(nesting depth, first problem) of a JSON value, iteratively, so a hostile document
    cannot exhaust the stack. Depth: 0 for a scalar, 1 for a flat object or array."""
    deepest = 0
    problem: str | None = None
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            deepest = max(deepest, depth + 1)
            for key, child in node.items():
                if problem is None and (found := storable_text_problem(str(key))):
                    problem = f"a key {found}"
                stack.append((child, depth + 1))
        elif isinstance(node, list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in node)
        else:
            deepest = max(deepest, depth)
            if problem is None:
                if isinstance(node, str):
                    if found := storable_text_problem(node):
                        problem = f"a string {found}"
                elif isinstance(node, float) and not math.isfinite(node):
                    problem = "a number is NaN or infinite, which JSON cannot hold"
    return deepest, problem


def json_depth(value: Any) -> int:
    """Nesting depth of a JSON value: 0 for a scalar, 1 for a flat object or array."""
    return _walk(value)[0]


def check_metadata(value: dict[str, Any] | None, max_bytes: int, max_depth: int, what: str) -> None:
    """413 ``limit_exceeded`` when a metadata object (or a filter) is too large or too deep;
    422 ``invalid_input`` when Postgres could not store it as JSONB."""
    if value is None:
        return
    depth, problem = _walk(value)
    if depth > max_depth:
        raise LimitExceeded(f"{what} is nested {depth} levels deep; the limit is {max_depth}")
    if problem is not None:
        raise InvalidInput(f"{what}: {problem}")
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    if size > max_bytes:
        raise LimitExceeded(f"{what} takes {size} bytes as JSON; the limit is {max_bytes}")


def check_text_length(text: str, max_chars: int, what: str) -> None:
    if len(text) > max_chars:
        raise LimitExceeded(f"{what} has {len(text)} characters; the limit is {max_chars}")


def repeats(keys: Iterable[Hashable | None]) -> Iterator[tuple[int, int]]:
    """(first position, position) of each key that occurred before; None keys are skipped."""
    first_positions: dict[Hashable, int] = {}
    for position, key in enumerate(keys):
        if key is not None:
            first = first_positions.setdefault(key, position)
            if first != position:
                yield first, position
