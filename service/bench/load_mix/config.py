"""The configuration of ``earm bench load-mix``."""

from __future__ import annotations

from dataclasses import dataclass

OPERATIONS = ("ingest", "retrieve", "feedback")


@dataclass(frozen=True)
class LoadMixConfig:
    clients: int = 50
    seconds: float = 30.0
    namespaces: int = 5
    #: Relative weights of ingest, retrieve, feedback.
    mix: tuple[float, float, float] = (0.2, 0.6, 0.2)
    batch: int = 5
    seed_memories: int = 30
    candidates: int = 50
    k: int = 10
    dim: int = 384
    seed: int = 0
    api_key: str | None = None
    timeout_s: float = 60.0
