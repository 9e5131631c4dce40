"""The report of ``earm bench load-mix``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from service.bench.load_mix.config import LoadMixConfig
from service.bench.load_mix.ledger import OperationStats


@dataclass
class LoadMixReport:
    config: LoadMixConfig
    duration_s: float
    operations: dict[str, OperationStats]
    audits: dict[str, bool]
    problems: list[str]

    @property
    def errors(self) -> int:
        return sum(sum(s.errors.values()) for s in self.operations.values())

    @property
    def ok(self) -> bool:
        return self.errors == 0 and all(self.audits.values())

    def to_dict(self) -> dict[str, Any]:
        total = sum(s.ok for s in self.operations.values())
        return {
            "config": {k: v for k, v in asdict(self.config).items() if k != "api_key"},
            "duration_s": round(self.duration_s, 2),
            "requests_ok": total,
            "throughput_rps": round(total / self.duration_s, 1) if self.duration_s else None,
            "errors": self.errors,
            "operations": {name: s.summary() for name, s in self.operations.items()},
            "audits": self.audits,
            "problems": self.problems[:50],
            "ok": self.ok,
        }
