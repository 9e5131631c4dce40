"""The body of ``DELETE /namespaces/{namespace}``: what erasing a namespace deleted."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ErasedNamespace:
    """What erasing a namespace deleted, by table (``DELETE /namespaces/{namespace}``)."""

    namespace: str
    memories: int
    queries: int
    observations: int  # scores rows, retired ones included
    score_history: int
    model_rows: int  # memory_factors rows
