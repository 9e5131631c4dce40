"""What a full garbage collection costs a serving process (docs/performance.md, Tuning notes): the
objects an ``earm serve`` process holds once its app has started, and the time of one full
collection over them, before and after ``service.http.server.freeze_start_up_objects`` (which
``earm serve`` calls before it serves). CPython stops the event loop for a full collection,
so every request in flight waits that long.

    python docs/perf/gc_pause.py

Starts the app's lifespan against a temporary embedded Postgres, with the local embedder and
scorer, as ``earm serve`` would with default settings.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import tempfile
import time
from pathlib import Path

from service.http.app import create_app
from service.http.server import freeze_start_up_objects
from service.settings import Settings

COLLECTIONS = 5


def full_collection_ms() -> float:
    """The median time of a few full collections, in ms."""
    times = []
    for _ in range(COLLECTIONS):
        started = time.perf_counter()
        gc.collect()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def main(data_dir: Path) -> None:
    app = create_app(Settings(data_dir=data_dir, _env_file=None))
    async with app.router.lifespan_context(app):
        tracked = len(gc.get_objects())
        before = full_collection_ms()
        freeze_start_up_objects()
        after = full_collection_ms()
        print(f"after start-up: {tracked:,} tracked objects; a full collection "
              f"{before:.1f} ms; after freeze_start_up_objects ({gc.get_freeze_count():,} "
              f"frozen): {after:.1f} ms")
        gc.unfreeze()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="earm-gc-") as tmp:
        asyncio.run(main(Path(tmp)))
