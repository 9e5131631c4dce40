"""Metrics shared by the worker processes of ``earm serve --workers N``: prometheus-client's
per-process files in one PROMETHEUS_MULTIPROC_DIR, merged at scrape time."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

from prometheus_client import values
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector


def multiprocess_enabled() -> bool:
    """True when prometheus-client writes per-process files: PROMETHEUS_MULTIPROC_DIR was set
    before it was imported (it picks its value class at import time)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR")) and bool(
        getattr(values.ValueClass, "_multiprocess", False)
    )


def merged_families() -> list[Metric]:
    """Every worker's metric families, merged from their per-process files."""
    # prometheus_client's multiprocess module has no annotations (the rest is typed).
    collector = MultiProcessCollector(None)  # type: ignore[no-untyped-call]
    return list(collector.collect())  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def multiprocess_directory() -> Iterator[str]:
    """For ``earm serve --workers N``: the PROMETHEUS_MULTIPROC_DIR the workers will share.
    A given one is used as is (empty it before start); otherwise a fresh temporary directory is
    created and removed at exit. Workers are spawned after this, so they see the variable."""
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        os.makedirs(given, exist_ok=True)
        yield given
        return
    directory = tempfile.mkdtemp(prefix="earm-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
    try:
        yield directory
    finally:
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        shutil.rmtree(directory, ignore_errors=True)
