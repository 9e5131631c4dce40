"""What two deployments' answers to the same retrieve share, for tests that compare them."""

from __future__ import annotations

from typing import Any


def comparable(answer: dict[str, Any]) -> dict[str, Any]:
    """A retrieve's answer without what differs between deployments: ids and timings."""
    memories = [{k: v for k, v in m.items() if k != "id"} for m in answer["memories"]]
    return {k: v for k, v in answer.items() if k not in ("query_id", "timings")} | {
        "memories": memories
    }
