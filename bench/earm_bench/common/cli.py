"""Command-line plumbing shared by the ``earm bench`` sub-commands: list flags, configs from
parsed flags, quiet loggers, progress bars and the JSON output file."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")
Config = TypeVar("Config", bound="DataclassInstance")


def add_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    description: str | None,
) -> argparse.ArgumentParser:
    """An ``earm bench`` sub-command whose ``--help`` shows ``description`` (the benchmark's
    docstring) as it is written."""
    return subparsers.add_parser(name, help=help, description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)


def csv(kind: Callable[[str], T]) -> Callable[[str], tuple[T, ...]]:
    """An argparse ``type`` for comma-separated values, e.g. ``--k 10,20``."""

    def parse(value: str) -> tuple[T, ...]:
        items = [v.strip() for v in value.split(",") if v.strip()]
        try:
            return tuple(kind(v) for v in items)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return parse


def config_from_args(cls: type[Config], args: argparse.Namespace, **overrides: Any) -> Config:
    """A config dataclass from the parsed flags named like its fields, plus ``overrides``."""
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if hasattr(args, f.name)
    }
    return cls(**(values | overrides))


def command_line() -> str:
    """The command as typed (``earm bench …``), for the report."""
    return "earm " + shlex.join(sys.argv[1:])


def quiet(*names: str) -> None:
    """Keep the named loggers to warnings: one INFO line per HTTP request (or per migration
    step) would drown a run's output."""
    for name in names:
        logger = logging.getLogger(name)
        logger.setLevel(max(logging.WARNING, logger.level))


def progress(total: int, description: str, enabled: bool | None, unit: str = "req") -> Any:
    """A tqdm bar on stderr; ``enabled=None`` shows it only on a terminal."""
    from tqdm import tqdm

    disable = None if enabled is None else not enabled  # None: tqdm asks stderr.isatty()
    return tqdm(total=total, desc=description, unit=unit, file=sys.stderr, disable=disable,
                dynamic_ncols=True, leave=False)


def write_json(path: Path, report: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def print_report(
    report: dict[str, Any], out: Path | None, render: Callable[[dict[str, Any], str], str]
) -> int:
    """How a benchmark command ends: its JSON report written to ``out`` (if given), its
    Markdown (``render(report, command line)``) on stdout; the exit status 0."""
    if out is not None:
        write_json(out, report)
    print(render(report, command_line()))
    return 0
