"""The markdown report of ``earm bench load``, a section per phase."""

from __future__ import annotations

from typing import Any

from earm_bench.common.markdown import table
from earm_bench.common.stats import PERCENTILES
from earm_bench.load.session import PHASES

Report = dict[str, Any]


def _p(stats: dict[str, Any]) -> str:
    values = [stats.get(f"p{p}") for p in PERCENTILES]
    return " / ".join("-" if v is None else f"{v:.1f}" for v in values)


def _header(report: Report) -> list[str]:
    config, env = report["config"], report["environment"]
    return [
        f"# earm bench load — {config['memories']:,} memories, "
        f"observations {', '.join(f'{o:,}' for o in config['observations'])}",
        "",
        f"`{config['command']}`" if config.get("command") else "",
        "",
        f"Machine: {env.get('cpus')} CPUs ({env.get('cpu', '?')}), load average at start "
        f"{env.get('load_average_at_start')}, at end {env.get('load_average_at_end')}; "
        f"PostgreSQL {env['postgres']}, pgvector {env['pgvector']}, "
        f"shared_buffers {env['shared_buffers']}. Index: `{env['hnsw_index']}`. "
        f"Run took {report['duration_s']:.0f} s.",
        *(["", f"On Citus ({env['citus'].split(' on ')[0]}): the service talks to the "
               f"coordinator, which routes each statement to {env['citus_workers']} workers; "
               "every node is a server of this machine, sharing its CPUs."]
          if env.get("citus") else []),
    ]


def _ingest(report: Report) -> list[str]:
    rows = [
        (row["path"], f"{row['memories']:,}", row["batch"], row["clients"],
         f"{row['seconds']:.2f}", f"{row['memories_per_s']:,.0f}")
        for row in report["ingest"]
    ]
    head = ("path", "memories", "batch", "clients", "seconds", "memories/s")
    return ["", "## Ingest", "", *table(head, rows, "lrrrrr")]


def _retrieve_row(cell: dict[str, Any], floor: float | None) -> tuple[object, ...]:
    ratio = cell["overhead_ms"]["p50"] / floor if floor else None
    return (cell["policy"], cell["concurrency"], cell["requests"], cell["scorer_calls_mean"],
            _p(cell["total_ms"]), _p(cell["overhead_ms"]), _p(cell["client_ms"]),
            f"{floor:.2f}", "-" if ratio is None else f"{ratio:.2f}",
            f"{cell['throughput_rps']:.1f}")


def _retrieve(report: Report) -> list[str]:
    config = report["config"]
    floors = {f["concurrency"]: f["latency_ms"]["p50"] for f in report["floor"]}
    head = ("policy", "conc.", "req", "scorer calls", "total", "overhead (total − score)",
            "client", "floor p50", "overhead p50 / floor p50", "req/s")
    phases = [
        (cell["policy"], cell["concurrency"],
         *("-" if cell["phases_p50_ms"][n] is None else f"{cell['phases_p50_ms'][n]:.2f}"
           for n in PHASES))
        for cell in report["retrieve"]
    ]
    return [
        "",
        f"## Retrieve (judge {config['latency_ms']:g} ms per call, candidates "
        f"{config['candidates']}, k {config['k']}, {report['observations'][0]['observations']:,} "
        "observations)",
        "",
        "Server-side times are the response's `timings`; overhead = `total_ms − score_ms`; "
        "client = end to end over HTTP. p50 / p95 / p99 in ms.",
        "",
        *table(head, (_retrieve_row(c, floors.get(c["concurrency"])) for c in report["retrieve"]),
               "lrrrlllrrr"),
        "",
        "Phase p50 (ms): embed / search / score / complete / record",
        "",
        *table(("policy", "conc.", "embed", "search", "score", "complete", "record"), phases,
               "lrrrrrr"),
    ]


def _floor(report: Report) -> list[str]:
    head = ("query vectors", "concurrency", "queries", "ef_search", "rows (min)",
            "p50 / p95 / p99 ms", "queries/s")
    series = (("fresh", report["floor"]),
              ("the cells' own, replayed after them", report.get("floor_replayed", [])))
    rows = [
        (vectors, f["concurrency"], f["queries"], f["ef_search"], f["rows_min"],
         _p(f["latency_ms"]), f"{f['throughput_qps']:.1f}")
        for vectors, floors in series
        for f in floors
    ]
    return ["", "## Floor: raw pgvector top-N query (psycopg, binary, one round trip)", "",
            "Ratios use the floor on fresh query vectors, as every retrieve cell's are; the "
            "replayed floor reads pages the cells have just read.", "",
            *table(head, rows, "lrrrrlr")]


def _slow_judge(report: Report) -> list[str]:
    if not report["slow_judge"]:  # --slow-requests 0
        return []
    config = report["config"]
    head = ("policy", "scorer", "budget", "conc.", "req", "scorer calls", "scorer requests",
            "total", "score", "overhead", "client")
    rows = [
        (c["policy"], c.get("scorer", "openai"), c["budget"], c["concurrency"], c["requests"],
         c["scorer_calls_mean"], c.get("scorer_requests_mean", "-"), _p(c["total_ms"]),
         _p(c["score_ms"]), _p(c["overhead_ms"]), _p(c["client_ms"]))
        for c in report["slow_judge"]
    ]
    return [
        "",
        f"## Slow judge ({config['slow_latency_ms']:g} ms per call, scorer concurrency "
        f"{config['scorer_concurrency']})",
        "",
        *table(head, rows, "llrrrrrllll"),
    ]


def _tier_row(tier: dict[str, Any]) -> tuple[object, ...]:
    refit = tier["service_refit"]
    record = tier.get("record_ms", {}).get("p50")  # reports from before it was timed lack it
    return (f"{tier['observations']:,}", f"{tier['queries']:,}",
            f"{tier['memories_with_history']:,}", f"{tier['insert']['seconds']:.1f}",
            "-" if record is None else f"{record:.2f}",
            f"{tier['refit_s']:.2f}", _p(tier["complete_ms"]),
            f"{tier['earm']['overhead_ms']['p50']:.2f}", f"{tier['earm']['total_ms']['p50']:.2f}",
            refit["total_ms"] if refit["total_ms"] is not None else "-",
            refit["rss_mb"], refit["peak_rss_mb"])


def _completion(report: Report) -> list[str]:
    config = report["config"]
    head = ("observations", "queries", "memories with history", "insert s", "record p50 ms",
            "refit s", "complete p50 / p95 / p99 ms", "overhead p50 ms", "total p50 ms",
            "in-service refit ms", "RSS MB", "peak RSS MB")
    return [
        "",
        "## Completion, refit and memory as observations grow",
        "",
        f"Sequential `earm` retrieves ({config['completion_requests']} per tier, judge "
        f"{config['latency_ms']:g} ms). Refit = the pipeline's full refit, timed in the bench "
        "process; in-service refit = the retrieve that triggered a full refit inside the "
        "service (its total_ms). RSS = the service process after that; peak RSS = its peak "
        "during that retrieve (Linux: the peak is reset before it; elsewhere, since the start).",
        "",
        *table(head, (_tier_row(t) for t in report["observations"]), "rrrrrrlrrrrr"),
        "",
        f"Service RSS: {report['rss_start']['rss_mb']} MB at start, "
        f"{report['rss_after_ingest']['rss_mb']} MB after ingest (peak "
        f"{report['rss_after_ingest']['peak_rss_mb']} MB until then), "
        f"{report['rss_end']['rss_mb']} MB at the end.",
    ]


def _size_row(tier: dict[str, Any]) -> tuple[object, ...]:
    database = tier["database"]

    def size(name: str) -> str:
        part = database[name]
        per_row = f"{part['bytes'] / part['rows']:,.0f}" if part["rows"] else "-"
        return f"{part['bytes'] / 2**20:,.1f} ({per_row})"

    return (f"{tier['observations']:,}", f"{database['memories']['rows']:,}", size("memories"),
            size("hnsw_index"), size("queries"), size("scores"), size("memory_factors"))


def _sizes(report: Report) -> list[str]:
    tiers = [tier for tier in report["observations"] if "database" in tier]
    if not tiers:
        return []
    head = ("observations", "memory rows", "memories", "HNSW index", "queries", "scores",
            "memory_factors")
    return [
        "",
        "## Database size",
        "",
        "MB on disk, each table with its indexes (and TOAST), and bytes per row in brackets (the "
        "HNSW index: per indexed memory), after each tier; every namespace of the database "
        "counts (the run's are nearly all of it).",
        "",
        *table(head, (_size_row(t) for t in tiers), "rrrrrrr"),
    ]


def _processes(row: dict[str, Any], role: str) -> str:
    """``role``'s processes of a scale-out row: peak RSS, refits and index batches each."""
    return "; ".join(
        (f"{p['retrieves']} retrieves, " if "retrieves" in p else "")
        + f"{p['peak_rss_mb']} MB, {p['refits']} refits, {p['index_batches']} index batches"
        for p in row[role]
    ) or "-"


def _scale_out(report: Report) -> list[str]:
    rows = report.get("scale_out")
    if not rows:
        return []
    head = ("topology", "conc.", "req", "errors", "req/s", "total p50 / p95 / p99 ms",
            "client p50 / p95 / p99 ms", "refit done s after", "API processes: peak RSS, work",
            "workers: peak RSS, work")
    body = (
        (row["topology"], row["concurrency"], row["requests"], row["errors"],
         f"{row['throughput_rps']:.1f}", _p(row["total_ms"]), _p(row["client_ms"]),
         f"{row['refit_wait_after_retrieves_s']:.1f}", _processes(row, "api"),
         _processes(row, "worker"))
        for row in rows
    )
    return [
        "",
        f"## Scale-out ({report['observations'][-1]['observations']:,} observations)",
        "",
        "`earm` retrieves (judge "
        f"{report['config']['latency_ms']:g} ms) spread round robin over the API processes, "
        "all on the one database, started afresh for each row, after the namespace was made "
        "due for a full refit; then the wait until that refit was written (after the last "
        "response). Peak RSS of each process over the row (requests and refit); refits and "
        "index batches as each process logged them.",
        "",
        *table(head, body, "lrrrrllrll"),
    ]


def _dashboard(report: Report) -> list[str]:
    config = report["config"]
    rows = [
        (f"{tier['observations']:,}", f"{tier['queries']:,}", row["page"],
         f"{row['bytes']:,}", _p(row["client_ms"]))
        for tier in report["observations"]
        for row in tier.get("dashboard", [])
    ]
    return [
        "",
        "## Dashboard pages",
        "",
        f"Each page of the namespace ({config['memories']:,} memories) fetched "
        f"{config['dashboard_requests']} times in a row after the tier's retrieves, end to end "
        "over HTTP (client ms, p50 / p95 / p99); the trace is of the tier's latest query. The "
        "bulk-inserted queries carry no trace arrays (like queries recorded before migration "
        "0011), the retrieves of the run do.",
        "",
        *table(("observations", "queries", "page", "bytes", "p50 / p95 / p99 ms"), rows,
               "rrlrl"),
    ]


def _targets(report: Report) -> list[str]:
    rows = [
        (t["target"], t["measured"], "yes" if t["met"] else "NO", t["margin"])
        for t in report["targets"]
    ]
    return ["", "## Targets", "", *table(("target", "measured", "met", "margin"), rows)]


def render_markdown(report: Report) -> str:
    sections = (_header, _ingest, _retrieve, _floor, _slow_judge, _completion, _sizes,
                _scale_out, _dashboard, _targets)
    return "\n".join(line for section in sections for line in section(report)) + "\n"
