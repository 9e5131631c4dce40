"""`earm --help` and every sub-command's `--help` read as plain text: descriptions taken from
docstrings keep no reStructuredText markup."""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
from collections.abc import Iterator

import pytest

from service.cli.main import build_parser
from service.cli.plain_help import plain_text


def command_paths(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """The argv prefix of ``parser`` and of each of its sub-commands, depth first."""
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub_parser in action.choices.items():
                yield from command_paths(sub_parser, (*path, name))


COMMANDS = list(command_paths(build_parser()))


def help_text(path: tuple[str, ...]) -> str:
    """What `earm PATH... --help` prints (argparse prints it, then exits 0)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*path, "--help"])
    assert exited.value.code == 0
    return printed.getvalue()


def test_every_command_of_the_tree_is_checked() -> None:
    assert {("serve",), ("keys", "create"), ("mcp",), ("bench",)} <= set(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(("earm", *path)))
def test_help_shows_no_restructuredtext_markup(path: tuple[str, ...]) -> None:
    text = help_text(path)
    assert text.startswith("usage: earm")
    assert "``" not in text
    assert ":func:`" not in text and ":class:`" not in text and ":mod:`" not in text


def test_the_installed_command_prints_plain_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "service", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "The `earm` command" in done.stdout and "``" not in done.stdout


def test_plain_text_keeps_the_words_of_literals_roles_and_strong_text() -> None:
    marked = (
        "Run ``earm worker`` (:func:`service.worker.run_worker`, "
        ":func:`~service.http.app.create_app`) for **durable** work."
    )
    assert plain_text(marked) == (
        "Run `earm worker` (`service.worker.run_worker`, `create_app`) for durable work."
    )


def test_a_role_wrapped_over_two_lines_is_read_whole() -> None:
    assert plain_text("a server (:func:`service.testing.chat.\n  app`) that") == (
        "a server (`service.testing.chat.\n  app`) that"
    )
