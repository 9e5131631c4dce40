"""The configuration of ``earm bench load-mix``."""

from __future__ import annotations

from dataclasses import dataclass, field

OPERATIONS = ("ingest", "retrieve", "feedback")


@dataclass(frozen=True)
class Faults:
    """Faults injected into the run (:mod:`earm_bench.load_mix.faults` has the schedule)."""

    #: The in-process service is scored by a loopback judge that, for a window in the middle
    #: of the run, answers after longer than the service's scorer timeout.
    stalling_scorer: bool = False
    #: Some clients delete a memory their retrieve just returned.
    deletes: bool = False
    #: The embedded Postgres is SIGKILLed (postmaster and backends) once mid-run.
    kill_postgres: bool = False
    #: The in-process service's EARM_SCORER_TIMEOUT_S under a stalling scorer (the service's
    #: default: under a heavy mix a shorter one degrades retrieves that merely queue for the
    #: scorer, and the stall would not stand out).
    scorer_timeout_s: float = 10.0
    #: After the load, how long the service's supervisor may take to restart a killed Postgres
    #: before the run fails (its default backoff gives up after about 31 s).
    recovery_grace_s: float = 60.0

    @property
    def any(self) -> bool:
        return self.stalling_scorer or self.deletes or self.kill_postgres

    @property
    def in_process_only(self) -> bool:
        """The bench must run the service (and, for a kill, its embedded Postgres) itself."""
        return self.stalling_scorer or self.kill_postgres


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
    faults: Faults = field(default_factory=Faults)
