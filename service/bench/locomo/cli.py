"""``earm bench locomo``'s flags and command, and ``python -m service.bench.locomo``."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from service.bench.locomo.config import POLICIES, LocomoConfig
from service.bench.locomo.report import format_markdown
from service.bench.locomo.run import run_locomo

logger = logging.getLogger(__name__)


def _csv(kind: type) -> Any:
    def parse(value: str) -> tuple[Any, ...]:
        items = [v.strip() for v in value.split(",") if v.strip()]
        try:
            return tuple(kind(v) for v in items)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return parse


def _probability(value: str) -> float:
    p = float(value)
    if not 0.0 <= p <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not a probability in [0, 1]")
    return p


def add_locomo_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``locomo`` sub-command (``earm bench locomo …``)."""
    from service.bench import locomo  # its docstring describes the replay

    parser = subparsers.add_parser(
        "locomo",
        help="LoCoMo replay: recall@K and scorer calls of semantic/observed/earm/full",
        description=locomo.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data", required=True, type=Path,
                        help="directory of LoCoMo conversation files (<sample_id>.json)")
    parser.add_argument("--out", type=Path, default=None, help="write RESULTS.json here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")
    parser.add_argument("--policies", type=_csv(str), default=POLICIES,
                        help="comma-separated subset of semantic,observed,earm,full (default all)")
    parser.add_argument("--k", dest="ks", type=_csv(int), default=(10, 20),
                        help="cut-offs K, comma-separated (default 10,20)")
    parser.add_argument("--candidates", type=int, default=200,
                        help="semantic candidates N per query (default 200)")
    parser.add_argument("--schedule", default=None,
                        help="budget schedule 't:ratio,…' (default: the service's, "
                             "0:1.0,5:0.5,15:0.3,30:0.175)")
    parser.add_argument("--judge", choices=("oracle", "local"), default="oracle",
                        help="oracle: labels + noise over loopback chat-completions; "
                             "local: the service's offline scorer")
    parser.add_argument("--judge-miss", type=_probability, default=0.2,
                        help="oracle: probability an evidence turn is missed (default 0.2)")
    parser.add_argument("--judge-false", type=_probability, default=0.05,
                        help="oracle: probability of a false positive (default 0.05)")
    parser.add_argument("--judge-noise", type=float, default=0.1,
                        help="oracle: std of the Gaussian score noise (default 0.1)")
    parser.add_argument("--judge-port", type=int, default=0,
                        help="oracle: fixed loopback port (for --url setups; default: any free)")
    parser.add_argument("--seed", type=int, default=0, help="judge noise and anchor sampling seed")
    parser.add_argument("--url", default=None,
                        help="use a running service instead of starting one; point its scorer "
                             "at the judge (EARM_SCORER=openai "
                             "EARM_SCORER_BASE_URL=http://127.0.0.1:<--judge-port>/v1)")
    parser.add_argument("--include-adversarial", action="store_true",
                        help="add category 5 to the query stream (reported separately)")
    parser.add_argument("--conversations", type=_csv(str), default=None,
                        help="only these sample ids, e.g. conv-26,conv-30 (default: all files)")
    parser.add_argument("--max-questions", type=int, default=None,
                        help="replay at most this many questions per conversation")
    parser.add_argument("--max-sessions", type=int, default=None,
                        help="ingest only the first sessions (keeps questions whose evidence "
                             "lies inside them)")
    parser.add_argument("--scorer-concurrency", type=int, default=32,
                        help="the in-process service's scorer concurrency (default 32)")
    parser.add_argument("--database-url", default=None,
                        help="Postgres for the in-process service (default: embedded, temporary)")
    parser.add_argument("--window", dest="rolling_window", type=int, default=25,
                        help="rolling-mean window of the plot (default 25)")
    parser.add_argument("--per-query", action="store_true",
                        help="also store per-query rows (ids and numbers only) in RESULTS.json")
    parser.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                        default=None, help="hide the progress bar")
    parser.set_defaults(func=run_locomo_command)
    return parser


def config_from_args(args: argparse.Namespace) -> LocomoConfig:
    """A :class:`LocomoConfig` from parsed CLI arguments."""
    return LocomoConfig(
        data_dir=args.data,
        out=args.out,
        plot=args.plot,
        policies=tuple(args.policies),
        ks=tuple(args.ks),
        candidates=args.candidates,
        schedule=args.schedule,
        judge=args.judge,
        judge_miss=args.judge_miss,
        judge_false=args.judge_false,
        judge_noise=args.judge_noise,
        judge_port=args.judge_port,
        seed=args.seed,
        url=args.url,
        include_adversarial=args.include_adversarial,
        conversations=tuple(args.conversations) if args.conversations else None,
        max_questions=args.max_questions,
        max_sessions=args.max_sessions,
        scorer_concurrency=args.scorer_concurrency,
        database_url=args.database_url,
        rolling_window=args.rolling_window,
        per_query=args.per_query,
        progress=args.progress,
    )


def run_locomo_command(args: argparse.Namespace) -> int:
    """Entry point of ``earm bench locomo``: run, write outputs, print the markdown table."""
    try:
        config = config_from_args(args)
    except ValueError as exc:
        logger.error("%s", exc)
        return 2
    if config.plot is not None and importlib.util.find_spec("matplotlib") is None:
        # Say so before a run of many minutes, not after it.
        logger.error("--plot needs matplotlib: pip install -e '.[bench]'")
        return 2
    # One INFO line per HTTP request (hundreds of thousands of scorer calls) drowns the run.
    for noisy in ("httpx", "httpcore", "earm.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger(noisy).level))
    results = run_locomo(config)
    sys.stdout.write(format_markdown(results))
    sys.stdout.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m service.bench.locomo --data DIR …``."""
    parser = argparse.ArgumentParser(prog="python -m service.bench.locomo")
    sub = parser.add_subparsers(dest="bench", required=True)
    add_locomo_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "locomo":
        argv = ["locomo", *argv]
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
