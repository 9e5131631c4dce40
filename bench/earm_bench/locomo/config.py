"""The configuration of ``earm bench locomo``: the CLI flags, as a dataclass."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from earm_bench.common.http import POLICIES
from earm_bench.locomo.data import DEFAULT_CATEGORIES

ADVERSARIAL = 5


@dataclass
class LocomoConfig:
    """Everything a replay run depends on (the CLI flags, as a dataclass)."""

    data_dir: Path
    out: Path | None = None
    plot: Path | None = None
    policies: tuple[str, ...] = POLICIES
    ks: tuple[int, ...] = (10, 20)
    candidates: int = 200
    schedule: str | None = None  # None: the service's default schedule
    judge: str = "oracle"
    judge_protocol: str = "chat"
    judge_miss: float = 0.2
    judge_false: float = 0.05
    judge_noise: float = 0.1
    judge_port: int = 0
    seed: int = 0
    url: str | None = None
    include_adversarial: bool = False
    conversations: tuple[str, ...] | None = None
    max_questions: int | None = None  # per conversation, after the category filter
    max_sessions: int | None = None
    # After each conversation's stream, this many rounds re-ask its questions (shuffled; half
    # verbatim, half rephrased by a template).
    repeat: int = 0
    scorer_concurrency: int = 32
    database_url: str | None = None  # None: embedded Postgres in a temporary directory
    request_timeout_s: float = 600.0
    rolling_window: int = 25
    per_query: bool = False
    # --shift: all conversations in one namespace, one after another (earm_bench.locomo.shift)
    shift: bool = False
    shift_window: int = 20  # the first queries of each later segment, reported "after shift"
    progress: bool | None = None  # None: show the bar when stderr is a terminal

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown:
            raise ValueError(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
        if not self.policies:
            raise ValueError("at least one policy is required")
        if not self.ks or any(k < 1 for k in self.ks):
            raise ValueError("--k needs positive integers")
        self.ks = tuple(sorted(set(self.ks)))
        if self.candidates < max(self.ks):
            raise ValueError("--candidates must be at least max(--k)")
        if self.judge not in ("oracle", "local"):
            raise ValueError("--judge must be 'oracle' or 'local'")
        if self.repeat < 0:
            raise ValueError("--repeat must be 0 or more")
        if self.shift_window < 1:
            raise ValueError("--shift-window needs a positive integer")
        if self.shift and self.repeat:
            raise ValueError("--shift and --repeat are separate streams: choose one")
        if self.judge_protocol not in ("chat", "rerank"):
            raise ValueError("--judge-protocol must be 'chat' or 'rerank'")

    @property
    def categories(self) -> tuple[int, ...]:
        """Categories in the replayed stream."""
        return DEFAULT_CATEGORIES + ((ADVERSARIAL,) if self.include_adversarial else ())

    def as_json(self) -> dict[str, Any]:
        """The settings block of RESULTS.json."""
        out = asdict(self)
        for key in ("data_dir", "out", "plot"):
            out[key] = None if out[key] is None else str(out[key])
        out["database_url"] = "external" if self.database_url else None
        out["policies"] = list(self.policies)
        out["ks"] = list(self.ks)
        out["conversations"] = list(self.conversations) if self.conversations else None
        return out

