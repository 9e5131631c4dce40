"""Sub-commands that other distributions add to ``earm``.

A distribution declares an entry point in the group ``earm.commands``, named after the command
it adds, pointing at a function that takes ``earm``'s sub-command parsers and adds its command
(the benchmarks: ``bench = "earm_bench.cli:add_bench_parser"`` in bench/pyproject.toml). Its
``func(args)`` returns the exit status and reads its own settings. The product never imports
such a distribution by name: what is installed is what ``earm`` offers.

A command of a distribution that ships in earm's repository but is not installed still
answers, with how to install it, so ``earm --help`` and ``earm bench`` point the way.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import sys
from collections.abc import Collection

ENTRY_POINT_GROUP = "earm.commands"

#: The commands of the distributions next to the product in its repository: what each is, and
#: how to install it.
SEPARATE_COMMANDS = {"bench": ("benchmarks", "from a checkout of earm: pip install -e ./bench")}


def add_installed_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Add the command of every installed ``earm.commands`` entry point (this loads its code),
    and a pointer to the installation of each separate command that is missing."""
    installed = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    for entry_point in installed:
        entry_point.load()(commands)
    add_missing_commands(commands, installed.names)


def add_missing_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], installed: Collection[str]
) -> None:
    """For each separate command not in ``installed``: a command that says how to get it, and
    fails, whatever its arguments."""
    for name, (summary, install) in SEPARATE_COMMANDS.items():
        if name in installed:
            continue
        message = f"earm {name} is not installed; {install}"
        # No options (a prefix nobody types): whatever follows the command, --help included, is
        # its arguments, so every use of it says how to install it instead of a usage error.
        parser = commands.add_parser(
            name, help=f"{summary}, not installed ({install})", add_help=False, prefix_chars="\0"
        )
        parser.add_argument("arguments", nargs=argparse.REMAINDER)
        parser.set_defaults(func=functools.partial(_not_installed, message))


def _not_installed(message: str, args: argparse.Namespace) -> int:
    print(f"earm: {message}", file=sys.stderr)
    return 2
