"""The report of ``earm bench load-mix``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from earm_bench.load_mix.config import LoadMixConfig
from earm_bench.load_mix.ledger import OperationStats


@dataclass
class LoadMixReport:
    config: LoadMixConfig
    duration_s: float
    operations: dict[str, OperationStats]
    audits: dict[str, bool]
    problems: list[str]
    #: Per injected fault, its figures (:mod:`earm_bench.load_mix.fault_report`).
    faults: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> int:
        """Failed requests no injected fault explains."""
        return sum(sum(s.errors.values()) for s in self.operations.values())

    @property
    def expected_errors(self) -> int:
        return sum(sum(s.expected.values()) for s in self.operations.values())

    @property
    def ok(self) -> bool:
        return self.errors == 0 and all(self.audits.values())

    def _config(self) -> dict[str, Any]:
        config = {k: v for k, v in asdict(self.config).items() if k != "api_key"}
        if not self.config.faults.any:
            del config["faults"]
        return config

    def to_dict(self) -> dict[str, Any]:
        total = sum(s.ok for s in self.operations.values())
        faulty = self.config.faults.any
        out = {
            "config": self._config(),
            "duration_s": round(self.duration_s, 2),
            "requests_ok": total,
            "throughput_rps": round(total / self.duration_s, 1) if self.duration_s else None,
            "errors": self.errors,
            **({"expected_errors": self.expected_errors} if faulty else {}),
            "operations": {name: s.summary(faulty) for name, s in self.operations.items()},
            "audits": self.audits,
            "problems": self.problems[:50],
            "ok": self.ok,
        }
        return out | ({"faults": self.faults} if faulty else {})
