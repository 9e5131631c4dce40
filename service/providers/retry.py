"""The retry policy both providers (embedder, scorer) follow: what is worth retrying, how long
the server asks to wait, and jittered exponential backoff otherwise."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping


def retryable_status(status: int) -> bool:
    """Rate limiting and server-side trouble are worth retrying; other 4xx never succeed."""
    return status == 429 or status >= 500


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """Server-requested wait: OpenAI's ``retry-after-ms``, or ``Retry-After`` (seconds or date).
    ``headers``: names in lower case, or case-insensitive (``httpx.Headers``)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff_delay(attempt: int, base_s: float, cap_s: float = 8.0) -> float:
    """Exponential backoff with full jitter (attempt 0 -> up to base_s); spreads retry storms."""
    return random.uniform(0.5, 1.0) * min(cap_s, base_s * (2.0**attempt))
