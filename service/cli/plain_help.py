"""Help of the ``earm`` command as plain text.

Descriptions are often docstrings, written in reStructuredText for the API docs; a terminal
would show its markup as is. The help writes ``literals`` and :role:`targets` between single
backquotes instead, as the hand-written help texts do, and **strong** text as plain words.
"""

from __future__ import annotations

import argparse
import re

# A role's target may be wrapped over lines; ``~`` asks for its last dotted part only.
_ROLE = re.compile(r":[a-z]+:`(~?)([^`]+)`")
_LITERAL = re.compile(r"``([^`]+?)``")
_STRONG = re.compile(r"\*\*([^*\n]+?)\*\*")


def _role_text(match: re.Match[str]) -> str:
    shortened, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if shortened else target}`"


def plain_text(text: str) -> str:
    """``text`` without its reStructuredText inline markup."""
    text = _ROLE.sub(_role_text, text)
    text = _LITERAL.sub(r"`\1`", text)
    return _STRONG.sub(r"\1", text)


class PlainHelpParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose ``--help`` is plain text. The parsers of its sub-commands
    are of this class too: argparse makes them of their parent's class."""

    def format_help(self) -> str:
        return plain_text(super().format_help())
