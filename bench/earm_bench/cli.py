"""``earm bench``: the benchmarks as a sub-command of the product's ``earm`` command.

The product's command line finds :func:`add_bench_parser` through this distribution's
``earm.commands`` entry point (bench/pyproject.toml) and calls it only for a command line that
is not one of its own, so ``earm serve`` never loads benchmark code.
"""

from __future__ import annotations

import argparse

from earm_bench.capacity import add_capacity_parser
from earm_bench.deadline import add_deadline_parser
from earm_bench.load import add_load_parser
from earm_bench.locomo import add_locomo_parser
from earm_bench.tenancy import add_tenancy_parser


def add_bench_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bench`` and its benchmarks to ``earm``'s sub-commands; each benchmark's ``func``
    takes the parsed flags and returns the exit status."""
    bench = commands.add_parser("bench", help="benchmarks (the earm-bench distribution)")
    benchmarks = bench.add_subparsers(dest="bench", required=True)
    add_locomo_parser(benchmarks)
    add_load_parser(benchmarks)
    add_tenancy_parser(benchmarks)
    add_deadline_parser(benchmarks)
    add_capacity_parser(benchmarks)
