"""The ``earm`` command (``earm = "service.cli:main"`` in pyproject.toml): ``main`` parses the
command line; each subcommand family has its module (``keys``, ``mcp``)."""

from service.cli.main import main

__all__ = ["main"]
