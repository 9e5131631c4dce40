"""Where a benchmark's CPU goes: the service process, the processes it started (the refit
child), Postgres (the postmaster and its backends) and everything else on the machine (the
bench's client, the judges, other work), as CPU seconds between two readings.

A ratio of two throughputs on a shared 2-core machine says that one policy costs more, not
where; these readings, divided by the requests of the cell, say where."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil


def _cpu_s(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.Error:  # ended meanwhile: its CPU is lost to the reading, say so by zero
        return 0.0
    return float(times.user + times.system)


def _tree(pid: int) -> tuple[float, float]:
    """CPU seconds of the process ``pid`` and of its descendants (those alive now)."""
    try:
        process = psutil.Process(pid)
        children = process.children(recursive=True)
    except psutil.Error:
        return 0.0, 0.0
    return _cpu_s(process), sum(_cpu_s(child) for child in children)


def postmaster_pid(data_dir: Path) -> int | None:
    """The postmaster of the embedded Postgres in ``data_dir`` (None: not running there)."""
    try:
        return int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class CpuReading:
    service: float
    service_children: float
    postgres: float | None  # None: the database is not one this bench started
    machine: float

    @classmethod
    def now(cls, service_pid: int, postmaster: int | None) -> CpuReading:
        service, children = _tree(service_pid)
        postgres = None if postmaster is None else sum(_tree(postmaster))
        times = psutil.cpu_times()
        return cls(service, children, postgres,
                   float(times.user + times.system + getattr(times, "nice", 0.0)))

    def per_request_ms(self, later: CpuReading, requests: int) -> dict[str, float | None]:
        """CPU milliseconds per request between this reading and ``later``, by where they went
        (``other``: the machine's CPU not in the service's tree or Postgres)."""
        def ms(seconds: float) -> float:
            return round(seconds * 1000 / max(1, requests), 2)

        service = later.service - self.service
        children = later.service_children - self.service_children
        postgres = (None if self.postgres is None or later.postgres is None
                    else later.postgres - self.postgres)
        machine = later.machine - self.machine
        return {"service": ms(service), "refit_child": ms(children),
                "postgres": None if postgres is None else ms(postgres),
                "other": ms(machine - service - children - (postgres or 0.0)),
                "machine": ms(machine)}
