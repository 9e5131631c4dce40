"""Commands of other distributions: `earm bench` comes from the installed earm-bench through its
`earm.commands` entry point, and without it `earm bench` says how to install it."""

from __future__ import annotations

import argparse

import pytest

from service.cli.main import main
from service.cli.plugins import add_missing_commands


def test_the_installed_bench_adds_its_benchmarks_to_earm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_status:
        main(["bench", "--help"])
    assert exit_status.value.code == 0
    usage = capsys.readouterr().out
    assert "{locomo,load,tenancy,deadline,capacity}" in usage


def test_a_missing_bench_says_how_to_install_it_whatever_its_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser(prog="earm")
    commands = parser.add_subparsers(dest="command", required=True)
    add_missing_commands(commands, installed=())
    assert "pip install -e ./bench" in " ".join(parser.format_help().split())  # unwrapped
    for arguments in ([], ["locomo", "--data", "d"], ["--help"]):
        args = parser.parse_args(["bench", *arguments])
        assert args.func(args) == 2
        assert "earm bench is not installed" in capsys.readouterr().err
        assert args.arguments == arguments


def test_an_installed_bench_is_not_shadowed_by_its_pointer() -> None:
    parser = argparse.ArgumentParser(prog="earm")
    commands = parser.add_subparsers(dest="command", required=True)
    add_missing_commands(commands, installed={"bench"})
    assert commands.choices == {}
