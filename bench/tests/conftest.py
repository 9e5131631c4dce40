"""Benchmark tests run CLIs in-process, and a CLI quiets loggers (``earm.access``, httpx) for
its own output: restore every logger's level afterwards, so a test file that shares the worker
still sees the service's log lines."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def restore_logger_levels() -> Iterator[None]:
    levels = {
        name: logger.level
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    yield
    for name, logger in logging.root.manager.loggerDict.items():
        if isinstance(logger, logging.Logger):
            logger.setLevel(levels.get(name, logging.NOTSET))
