"""``earm bench locomo``'s flags and command, and ``python -m earm_bench.locomo``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from earm_bench.common.cli import add_command, config_from_args, csv, quiet
from earm_bench.locomo.config import LocomoConfig
from earm_bench.locomo.judge_errors import JUDGE_ERRORS
from earm_bench.locomo.report import format_markdown
from earm_bench.locomo.run import run_locomo

logger = logging.getLogger(__name__)


def _probability(value: str) -> float:
    p = float(value)
    if not 0.0 <= p <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is not a probability in [0, 1]")
    return p


def _add_replay_flags(parser: argparse.ArgumentParser) -> None:
    """What is replayed: the data, the policies, the cut-offs, the query stream and its rounds."""
    parser.add_argument("--data", required=True, type=Path,
                        help="directory of LoCoMo conversation files (<sample_id>.json)")
    parser.add_argument("--policies", type=csv(str), default=(),
                        help="comma-separated subset of semantic,observed,earm,top-b,full "
                             "(default all; with --profile paper semantic,observed,earm,full)")
    parser.add_argument("--profile", choices=("earm", "paper"), default="earm",
                        help="the service's learning preset (EARM_PROFILE): paper is the EARM "
                             "paper's anchors and plain model, and the report adds the paper's "
                             "table (default earm)")
    parser.add_argument("--k", dest="ks", type=csv(int), default=(10, 20),
                        help="cut-offs K, comma-separated (default 10,20)")
    parser.add_argument("--candidates", type=int, default=200,
                        help="semantic candidates N per query (default 200)")
    parser.add_argument("--schedule", default=None,
                        help="budget schedule 't:ratio,…' (default: the service's, "
                             "0:1.0,5:0.5,15:0.3,30:0.175)")
    parser.add_argument("--include-adversarial", action="store_true",
                        help="add category 5 to the query stream (reported separately)")
    parser.add_argument("--conversations", type=csv(str), default=None,
                        help="only these sample ids, e.g. conv-26,conv-30 (default: all files)")
    parser.add_argument("--max-questions", "--limit", type=int, default=None,
                        help="replay at most this many questions per conversation")
    parser.add_argument("--max-sessions", type=int, default=None,
                        help="ingest only the first sessions (keeps questions whose evidence "
                             "lies inside them)")
    parser.add_argument("--repeat", type=int, default=0,
                        help="after each conversation's stream, re-ask its questions this many "
                             "more rounds (shuffled; half verbatim, half rephrased by a "
                             "template); reported per round and kind (default 0)")
    parser.add_argument("--via", choices=("retrieve", "rerank"), default="retrieve",
                        help="retrieve: the service searches and ranks (POST /retrieve); "
                             "rerank: the client embeds and searches itself, earm reranks its "
                             "top --candidates (POST /v1/rerank) in front of the judge, against "
                             "the judge called directly on all of them (full) or the top B "
                             "(top-b); policies semantic,earm,top-b,full")
    parser.add_argument("--shift", action="store_true",
                        help="replay the conversations one after another into one namespace "
                             "and report recall and calls per segment")
    parser.add_argument("--shift-window", type=int, default=20,
                        help="--shift: the first queries of each later segment reported as "
                             "'after shift' (default 20)")


def _add_judge_flags(parser: argparse.ArgumentParser) -> None:
    """The relevance judge: the oracle's protocol and noise model, or the local scorer."""
    parser.add_argument("--judge", choices=("oracle", "local", "scorer"), default="oracle",
                        help="oracle: labels + noise over loopback chat-completions; "
                             "local: the service's offline scorer; scorer: your own "
                             "(--scorer, --scorer-url, --scorer-model)")
    parser.add_argument("--scorer", choices=("openai", "rerank", "tei"), default="openai",
                        help="--judge scorer: its protocol, as EARM_SCORER: an OpenAI-"
                             "compatible chat endpoint, a Cohere/Jina/vLLM /rerank, or TEI "
                             "(default openai)")
    parser.add_argument("--scorer-url", default=None,
                        help="--judge scorer: its base URL (as EARM_SCORER_BASE_URL); its key "
                             "and other settings from EARM_SCORER_API_KEY and the other "
                             "EARM_SCORER_* variables, as the service reads them")
    parser.add_argument("--scorer-model", default="gpt-4o-mini",
                        help="--judge scorer: its model (default gpt-4o-mini)")
    parser.add_argument("--judge-protocol", choices=("chat", "rerank"), default="chat",
                        help="oracle: served as chat completions (EARM_SCORER=openai) or as a "
                             "/rerank endpoint (EARM_SCORER=rerank); same scores either way")
    parser.add_argument("--judge-errors", choices=JUDGE_ERRORS, default="independent",
                        help="oracle: how its scores err. independent: each pair on its own "
                             "(miss, false positive, noise); correlated: graded scores, "
                             "partial scores next to evidence turns, false positives growing "
                             "with word overlap, a per-turn bias, per-question miscalibration; "
                             "crossencoder: correlated on a cross-encoder's scale (relevant "
                             "around 0.1-0.3) (default independent)")
    parser.add_argument("--judge-miss", type=_probability, default=0.2,
                        help="oracle: probability an evidence turn is missed (default 0.2)")
    parser.add_argument("--judge-false", type=_probability, default=0.05,
                        help="oracle: probability of a false positive (default 0.05); "
                             "correlated/crossencoder: the mean rate, times "
                             "1 + 12 x (content-word Jaccard overlap - 0.05), at most 0.5")
    parser.add_argument("--judge-noise", type=float, default=0.1,
                        help="oracle: std of the Gaussian score noise (default 0.1; "
                             "correlated/crossencoder: added before the question's "
                             "miscalibration)")
    parser.add_argument("--judge-port", type=int, default=0,
                        help="oracle: fixed loopback port (for --url setups; default: any free)")
    parser.add_argument("--seed", type=int, default=0, help="judge noise and anchor sampling seed")


def _add_service_flags(parser: argparse.ArgumentParser) -> None:
    """The service replayed through: in this process (its scorer and database) or at ``--url``."""
    parser.add_argument("--url", default=None,
                        help="use a running service instead of starting one; point its scorer "
                             "at the judge (EARM_SCORER=openai "
                             "EARM_SCORER_BASE_URL=http://127.0.0.1:<--judge-port>/v1)")
    parser.add_argument("--scorer-concurrency", type=int, default=32,
                        help="the in-process service's scorer concurrency (default 32)")
    parser.add_argument("--database-url", default=None,
                        help="one Postgres database for every policy's in-process service "
                             "(default: an embedded, temporary Postgres per policy)")
    parser.add_argument("--database-server", default=None,
                        help="a running Postgres (the URL of a database on it, with the right "
                             "to create databases): a fresh database there per policy, dropped "
                             "afterwards, instead of an embedded Postgres per policy")


def _add_reader_flags(parser: argparse.ArgumentParser) -> None:
    """Answer accuracy: a reader and a grader LLM (earm_bench.locomo.answers)."""
    parser.add_argument("--reader-url", default=None,
                        help="also measure answer accuracy: an OpenAI-compatible endpoint "
                             "(base URL ending in /v1) that answers each question from a "
                             "policy's top k memories; its key from EARM_BENCH_READER_API_KEY")
    parser.add_argument("--reader-model", default=None, help="the reader's model")
    parser.add_argument("--grader-url", default=None,
                        help="the endpoint grading the answers CORRECT/WRONG against the gold "
                             "ones (default the reader's); its key from "
                             "EARM_BENCH_GRADER_API_KEY")
    parser.add_argument("--grader-model", default=None,
                        help="the grader's model (default the reader's)")
    parser.add_argument("--reader-concurrency", type=int, default=8,
                        help="requests open at once to each of reader and grader (default 8)")


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    """What the run writes besides the markdown table: RESULTS.json, the plot, progress."""
    parser.add_argument("--out", type=Path, default=None, help="write RESULTS.json here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")
    parser.add_argument("--window", dest="rolling_window", type=int, default=25,
                        help="rolling-mean window of the plot (default 25)")
    parser.add_argument("--per-query", action="store_true",
                        help="also store per-query rows (ids and numbers only) in RESULTS.json")
    parser.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                        default=None, help="hide the progress bar")


def add_locomo_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register the ``locomo`` sub-command (``earm bench locomo …``)."""
    from earm_bench import locomo  # its docstring describes the replay

    parser = add_command(
        subparsers, "locomo",
        "LoCoMo replay: recall@K and scorer calls of semantic/observed/earm/top-b/full",
        locomo.__doc__,
    )
    _add_replay_flags(parser)
    _add_judge_flags(parser)
    _add_service_flags(parser)
    _add_reader_flags(parser)
    _add_output_flags(parser)
    parser.set_defaults(func=run_locomo_command)
    return parser


def run_locomo_command(args: argparse.Namespace) -> int:
    """Entry point of ``earm bench locomo``: run, write outputs, print the markdown table."""
    try:
        config = config_from_args(LocomoConfig, args, data_dir=args.data,
                                  conversations=args.conversations or None)
    except ValueError as exc:
        logger.error("%s", exc)
        return 2
    # One INFO line per HTTP request (hundreds of thousands of scorer calls) drowns the run.
    quiet("httpx", "httpcore", "earm.access")
    results = run_locomo(config)
    sys.stdout.write(format_markdown(results))
    sys.stdout.flush()
    return 1 if "error" in results.get("answers", {}) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m earm_bench.locomo --data DIR …``."""
    parser = argparse.ArgumentParser(prog="python -m earm_bench.locomo")
    sub = parser.add_subparsers(dest="bench", required=True)
    add_locomo_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "locomo":
        argv = ["locomo", *argv]
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)
