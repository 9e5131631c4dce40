"""``earm bench locomo`` from start to end: judge, services, replay, RESULTS, outputs."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from datetime import UTC, datetime
from typing import Any, cast

from earm_bench.common.cli import progress, write_json
from earm_bench.locomo.answers import EndpointRefused, answer_accuracy
from earm_bench.locomo.config import LocomoConfig
from earm_bench.locomo.data import load_conversations
from earm_bench.locomo.judge import JudgeKind, JudgeProtocol, NoiseModel, start_judge
from earm_bench.locomo.metrics import QueryRecord
from earm_bench.locomo.plot import plot_results
from earm_bench.locomo.replay import askings, replay
from earm_bench.locomo.results import build_results, plain_stream
from earm_bench.locomo.services import service_for
from earm_bench.locomo.shift import replay_shift
from earm_bench.locomo.via_rerank import replay_via_rerank

logger = logging.getLogger(__name__)


def run_locomo(config: LocomoConfig) -> dict[str, Any]:
    """Run the benchmark; returns the RESULTS dict (also written/plotted if configured)."""
    started = time.perf_counter()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    conversations = load_conversations(
        config.data_dir, config.conversations, max_sessions=config.max_sessions
    )
    run_id = secrets.token_hex(3)
    noise = NoiseModel(
        miss=config.judge_miss, false=config.judge_false, noise=config.judge_noise,
        seed=config.seed, errors=config.judge_errors,
    )
    judge_kind = cast(JudgeKind, config.judge)  # LocomoConfig.__post_init__ checked it
    total = sum(len(askings(c, config)) for c in conversations) * len(config.policies)
    records: dict[str, list[QueryRecord]] = {}
    # One service per policy in-process (each on an empty database of its own, or all on
    # --database-url's in namespaces of their own), so policies never share experience and the
    # stateless ones run with no reuse; the running service at --url otherwise. Via rerank only
    # earm's policy calls the service (the others call the judge): one service for all.
    one_service = config.url or config.via == "rerank"
    policy_groups = [config.policies] if one_service else [(p,) for p in config.policies]
    protocol = cast(JudgeProtocol, config.judge_protocol)
    replay_stream = (
        replay_shift if config.shift else replay_via_rerank if config.via == "rerank" else replay
    )
    with start_judge(
        judge_kind, conversations, noise, port=config.judge_port, protocol=protocol,
        yours=config.your_scorer,
    ) as judge, progress(
        total, "locomo", config.progress, unit="q"
    ) as bar:
        for policies in policy_groups:
            with service_for(config, judge, policies) as (base_url, service_settings):
                records |= replay_stream(
                    config, base_url, conversations, judge, run_id, policies, bar
                )
        judge_block = judge.describe()
        if judge.oracle is not None:
            judge_block["stats"] = judge.oracle.stats()
    results = build_results(config, records, conversations)
    readers = config.readers(os.environ)
    if readers is not None:
        logger.info("answering with %s, grading with %s", readers.reader.model,
                    readers.grader.model)
        try:
            results["answers"] = asyncio.run(
                answer_accuracy(readers, plain_stream(records), conversations, config.ks))
        except EndpointRefused as refused:
            # the recall figures stand: they are written, with what stopped the answers
            logger.error("answer accuracy stopped: %s", refused)
            results["answers"] = {"error": str(refused)}
    results = {
        "settings": {
            **config.as_json(),
            "run_id": run_id,
            "started_at": started_at,
            "duration_s": round(time.perf_counter() - started, 1),
            "judge_model": judge_block,
            "service": service_settings,
        },
        **results,
    }
    if judge.oracle is not None and judge.oracle.unknown:
        logger.warning("the oracle judge could not identify %d prompts (answered 0)",
                       judge.oracle.unknown)
    if config.out is not None:
        write_json(config.out, results)
        logger.info("wrote %s", config.out)
    if config.plot is not None:
        plot_results(plain_stream(records), results, config.plot, config.ks, config.rolling_window)
        logger.info("wrote %s", config.plot)
    return results

