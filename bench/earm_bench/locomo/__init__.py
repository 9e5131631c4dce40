"""``earm bench locomo``: replay LoCoMo through the real service and compare retrieval policies.

For each conversation file and each policy, in a fresh namespace (policies never share
experience), the runner ingests every dialogue turn as one memory and replays the
conversation's questions (categories 1–4, in file order; ``--include-adversarial`` adds
category 5, reported separately) through ``POST /retrieve`` with ``order="relevance"`` and
``k = max(--k)``. The service's relevance scorer is an oracle "LLM" on loopback that answers from
the evidence labels with a documented noise model (:mod:`earm_bench.locomo.judge`), or the
service's local offline scorer (``--judge local``).

The policies are the service's (semantic, observed, earm, full) and **top-b**, what a user
would run instead of earm: the service's ``full`` over the semantic top B alone, B the budget
the schedule (``--schedule`` or the default) gives that query index for its candidate count
(never below k), stateless like ``full`` (a service with no reuse of earlier askings' cells).
On the ``--repeat`` stream, **top-b+cache** is top-b behind an exact-match score cache of
(query text, memory) pairs, derived from top-b's run: a verbatim re-ask costs it nothing, a
rephrased one all of its B.

It reports evidence recall@K and hit@K per policy, overall and per category and budget stage,
scorer calls (absolute and relative to ``full``), the share of the top-K whose score was
estimated, and retrieve latency with and without scorer time; plus the derived rows of the
paper (observed − semantic: what direct scores add; earm − observed: what completion adds) and
earm − top-b (recall and calls against the comparator).

With ``--shift`` the conversations are replayed one after another into ONE namespace per
policy (each conversation's turns ingested when its questions start; turn ids prefixed with the
conversation), so experience learned on one conversation meets the next; recall and scorer
calls are also reported per conversation (segment) and for the first ``--shift-window`` queries
after each shift.

By default the service runs in-process on a loopback port, one per policy, each over an
embedded Postgres in a temporary directory (``--database-server`` creates a fresh database
per policy on a running Postgres instead). With ``--url`` an already running service is used
instead: the operator must then point that service's scorer at the judge, i.e. start the
benchmark with a fixed ``--judge-port P`` and the service with ``EARM_SCORER=openai
EARM_SCORER_BASE_URL=http://127.0.0.1:P/v1`` (the budget schedule is the service's own; top-b
follows ``--schedule`` or the default, asks for k up to ``--candidates``, so set
``EARM_MAX_K`` that high, and is stateless on re-asks only with
``EARM_REUSE_OBSERVATIONS=false``).
"""

# The package: data (LoCoMo files), judge (the oracle), metrics, config, services (what the
# replay runs through), replay and shift (the streams), results, run, report, plot and cli.
# The docstring above is `earm bench locomo --help`'s description.

from earm_bench.locomo.cli import add_locomo_parser, main
from earm_bench.locomo.config import LocomoConfig
from earm_bench.locomo.report import format_markdown
from earm_bench.locomo.run import run_locomo

__all__ = ["LocomoConfig", "add_locomo_parser", "format_markdown", "main", "run_locomo"]
